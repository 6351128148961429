"""`python main.py train ...`: the training recipes' command line (each recipe's module does the work)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.errors import GlanceError

DATA_HELP = "a `train corpus` folder, a text file or a folder of .py/.txt/.md files (default: the stdlib)"


def add_train_parser(sub) -> None:
    """The `train` command and its recipes, under the CLI's subcommands `sub`."""
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
    med.add_argument("--data", default=None, help=DATA_HELP)
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
    med.add_argument(
        "--from",
        dest="start_from",
        default=None,
        help="go on training this Medusa heads folder (its draft vocabulary too) instead of fresh heads",
    )
    med.add_argument("--out", required=True)
    eg = tsub.add_parser("eagle", help="train an EAGLE head for a frozen target")
    eg.add_argument("--target", required=True, help="target model folder or hub id")
    eg.add_argument("--data", default=None, help=DATA_HELP)
    eg.add_argument("--steps", type=int, default=500)
    eg.add_argument(
        "--draft-vocab",
        type=int,
        default=2048,
        help="candidates read from the most frequent training tokens only (0: the whole vocabulary)",
    )
    eg.add_argument(
        "--from",
        dest="start_from",
        default=None,
        help="go on training this EAGLE head folder (its draft vocabulary too) instead of fresh a head",
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
    e3.add_argument("--data", default=None, help=DATA_HELP)
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
    df = tsub.add_parser("dflash", help="train a DFlash block drafter (blocks at random anchors, position-weighted)")
    df.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    df.add_argument("--data", default=None, help=DATA_HELP)
    df.add_argument("--layers", type=int, default=2, help="draft layers (each shaped like one of the target's)")
    df.add_argument("--feature-layers", type=int, default=3, help="target layers whose outputs form the context")
    df.add_argument("--block-size", type=int, default=16, help="tokens per block, the pending one included")
    df.add_argument("--blocks", type=int, default=8, help="blocks anchored in each training window")
    df.add_argument("--draft-vocab", type=int, default=4096, help="read-out over the most frequent tokens (0: all)")
    df.add_argument("--from", dest="start_from", default=None, help="go on training this DFlash draft folder")
    df.add_argument("--steps", type=int, default=500)
    df.add_argument("--out", required=True)
    mt = tsub.add_parser("mtp", help="train a multi-token-prediction layer for a target that ships none")
    mt.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    mt.add_argument("--data", default=None, help=DATA_HELP)
    mt.add_argument("--draft-vocab", type=int, default=4096, help="read-out over the most frequent tokens (0: all)")
    mt.add_argument("--from", dest="start_from", default=None, help="go on training this MTP folder")
    mt.add_argument("--steps", type=int, default=500)
    mt.add_argument("--out", required=True)
    dr = tsub.add_parser("draft", help="distill a small vanilla draft from a frozen target (shares its tokenizer)")
    dr.add_argument("--target", required=True, help="target model folder, hub id or catalog name")
    dr.add_argument("--data", default=None, help=DATA_HELP)
    dr.add_argument(
        "--layers", type=int, default=4, help="decoder layers kept, copied from evenly spaced target layers"
    )
    dr.add_argument(
        "--from",
        dest="start_from",
        default=None,
        help="go on training this draft: stored layers (a `train draft` output; its draft vocabulary kept) or a model "
        "folder or hub id with the target's vocabulary",
    )
    dr.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="draft vocabulary for the draft's LM head: the most frequent training tokens (0: the whole vocabulary)",
    )
    dr.add_argument("--steps", type=int, default=500)
    dr.add_argument("--out", required=True)
    co = tsub.add_parser(
        "corpus", help="a drafter corpus for a chat target: its own answers to ShareGPT prompts, plus the conversations"
    )
    co.add_argument("--target", required=True, help="chat model folder, hub id or catalog name")
    co.add_argument("--source", default="sharegpt", choices=["sharegpt"], help="where the prompts come from")
    co.add_argument("--answers", type=int, default=4096, help="train prompts the target answers (self-distillation)")
    co.add_argument("--max-new-tokens", type=int, default=256, help="longest answer")
    co.add_argument("--rows", type=int, default=16, help="prompts answered at once (batched decoding)")
    co.add_argument(
        "--compile",
        action="store_true",
        help="answer with the compiled forward (pays only for long runs: each batch size the rows shrink to compiles)",
    )
    co.add_argument("--out", required=True, help="output folder (resumes when it holds a run)")
    cu = tsub.add_parser("curve", help="plot a head's training curve (curve.jsonl) as curve.png beside it")
    cu.add_argument("folder", help="the head folder training wrote to")
    cu.add_argument("--title", default=None)
    card = tsub.add_parser("card", help="measure a trained family and write its model card (README.md)")
    card.add_argument("--models", required=True, help="folder holding target/, draft/ and training.json")
    card.add_argument(
        "--only",
        default=None,
        help="re-measure only these comma-separated sections (vanilla, medusa, eagle, eagle3, dflash, mtp, lookahead) "
        "of an existing card",
    )


def cmd_train(args: argparse.Namespace) -> int:
    if args.what == "card":
        from engine.train.loop.card import write_card

        if not (Path(args.models) / "training.json").exists():
            raise GlanceError(f"{args.models} holds no training.json: run 'train demo' first")
        if args.only:
            from engine.train.loop.card import refresh_card

            sections = [x.strip() for x in args.only.split(",") if x.strip()]
            known = ("vanilla", "medusa", "eagle", "eagle3", "dflash", "mtp", "lookahead")
            bad = [x for x in sections if x not in known]
            if bad or not (Path(args.models) / "evaluation.json").exists():
                raise GlanceError(f"--only takes {', '.join(known)}, and needs a card measured before")
            print(refresh_card(Path(args.models), sections))
            return 0
        print(write_card(Path(args.models)))
        return 0
    if args.what == "curve":
        from engine.train.loop.curves import plot_curve

        print(plot_curve(Path(args.folder), args.title))
        return 0
    if args.what == "corpus":
        from engine.train.data.sharegpt_corpus import build_corpus

        if args.answers < 0 or args.max_new_tokens < 1 or args.rows < 1:
            raise GlanceError("--answers must be non-negative, --max-new-tokens and --rows positive")
        summary = build_corpus(
            args.target, Path(args.out), args.answers, args.max_new_tokens, rows=args.rows, compile=args.compile
        )
        print(json.dumps(summary, indent=2))
        return 0
    if args.what == "medusa":
        from engine.train.recipes.medusa import train_medusa

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
            start_from=args.start_from,
        )
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "eagle":
        from engine.train.recipes.eagle import train_eagle

        if args.steps < 1 or args.draft_vocab < 0:
            raise GlanceError("--steps must be positive, --draft-vocab non-negative")
        report = train_eagle(
            args.target,
            Path(args.out),
            args.steps,
            args.data,
            draft_vocab=args.draft_vocab,
            start_from=args.start_from,
        )
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "draft-vocab":
        from engine.train.loop.draft_vocab import write_draft_vocab

        print(json.dumps(write_draft_vocab(args.target, args.head, args.size, args.data, args.like), indent=2))
        return 0
    if args.what == "eagle3":
        from engine.train.recipes.eagle3 import train_eagle3

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
    if args.what == "dflash":
        from engine.heads.dflash import MAX_BLOCK
        from engine.train.recipes.dflash import train_dflash

        if min(args.steps, args.layers, args.feature_layers, args.blocks) < 1 or args.draft_vocab < 0:
            raise GlanceError("--steps, --layers, --feature-layers and --blocks must be positive, --draft-vocab not "
                              "negative")  # fmt: skip
        if not 2 <= args.block_size <= MAX_BLOCK:
            raise GlanceError(f"--block-size must be between 2 and {MAX_BLOCK} (got {args.block_size})")
        report = train_dflash(
            args.target, Path(args.out), args.steps, args.data, layers=args.layers,
            feature_layers=args.feature_layers, block_size=args.block_size, blocks=args.blocks,
            draft_vocab=args.draft_vocab, start_from=args.start_from,
        )  # fmt: skip
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "mtp":
        from engine.train.recipes.mtp import train_mtp

        if args.steps < 1 or args.draft_vocab < 0:
            raise GlanceError("--steps must be positive, --draft-vocab not negative")
        report = train_mtp(args.target, Path(args.out), args.steps, args.data, draft_vocab=args.draft_vocab,
                           start_from=args.start_from)  # fmt: skip
        print(json.dumps(report, indent=2))
        return 0
    if args.what == "draft":
        from engine.train.recipes.distill import train_draft

        if args.steps < 1 or args.layers < 1 or args.draft_vocab < 0:
            raise GlanceError("--steps and --layers must be positive, --draft-vocab non-negative")
        print(
            json.dumps(
                train_draft(
                    args.target,
                    Path(args.out),
                    args.layers,
                    args.steps,
                    args.data,
                    start_from=args.start_from,
                    draft_vocab=args.draft_vocab,
                ),
                indent=2,
            )
        )
        return 0
    from engine.train.recipes.demo import run_demo_recipe

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
