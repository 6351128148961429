"""Glance entry point: `python main.py` opens the app; `python main.py <command>` runs the CLI."""

import os
import sys

# Quiet transformers' advisory warnings on a console the user reads; errors still surface.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run() -> int:
    if len(sys.argv) == 1:
        try:
            from app.main_window import launch  # the desktop playground, once it exists
        except ImportError:
            from engine.cli import build_parser

            build_parser().print_help()
            return 0
        return launch()
    from engine.cli import main

    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(run())
