"""Regenerate the benchmark results the README quotes, into docs/results/, with one command.

    python -m engine.bench.publish                    # every setting (over an hour on a 2-core CPU)
    python -m engine.bench.publish --only suite,sweep
    python -m engine.bench.publish --dry-run          # print the commands only

Each setting is one `python main.py bench` command; run it alone on a quiet machine, since a second process on the
same cores slows every forward and makes the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys

RESULTS = "docs/results"

# setting -> the bench arguments; each writes results.json, results.md and its charts into docs/results/<setting>
SETTINGS: dict[str, list[str]] = {
    "suite": ["bench"],
    "offsuite": ["bench", "--prompts", "resources/prompts/offsuite.jsonl", "--max-new-tokens", "128", "--repeats", "3"],
    "smollm2": [
        "bench",
        "--target",
        "SmolLM2-135M-Instruct",
        "--prompts",
        "resources/prompts/sharegpt.jsonl",
        "--max-new-tokens",
        "128",
        "--methods",
        "ar,vanilla,medusa,eagle,eagle3,lookahead",
    ],
    # the drafters of 2026 beside EAGLE-3 and transformers' own DFlash, on the same prompts
    "smollm2_blocks": [
        "bench",
        "--target",
        "SmolLM2-135M-Instruct",
        "--prompts",
        "resources/prompts/sharegpt.jsonl",
        "--max-new-tokens",
        "128",
        "--methods",
        "ar,eagle3,dflash,mtp,hf_dflash",
    ],
    "sweep": ["bench", "--batch-sizes", "1,2,4", "--max-new-tokens", "32", "--limit", "16", "--draft-budget", "auto"],
}


def command(setting: str) -> list[str]:
    """The CLI arguments (after `python main.py`) that regenerate one setting's results."""
    return [*SETTINGS[setting], "--out", f"{RESULTS}/{setting}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.publish", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SETTINGS]
    if unknown or not chosen:
        parser.error(f"--only takes {', '.join(SETTINGS)}; got {args.only!r}")
    from engine.cli import main as cli

    for setting in chosen:
        print("python main.py " + shlex.join(command(setting)), flush=True)
        if not args.dry_run and cli(command(setting)) != 0:
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
