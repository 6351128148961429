"""Glance entry point: `python main.py` opens the app; `python main.py <command>` runs the CLI."""

import os
import sys

# Quiet transformers' advisory warnings on a console the user reads; errors still surface.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run() -> int:
    if len(sys.argv) == 1:
        try:
            import PySide6  # noqa: F401  (the app's one optional-looking dependency: say so if it is missing)
        except ImportError as exc:
            print(
                f"glance: error: the desktop app needs PySide6 ({exc}): run `pip install -e .`, "
                "or use the command line (`python main.py --help`)",
                file=sys.stderr,
            )
            return 2
        from app.startup import missing_system_libraries, show_starting

        missing = missing_system_libraries()
        if missing:  # Qt would abort with "could not load the Qt platform plugin xcb" and no hint
            print(missing, file=sys.stderr)
            return 2

        splash = show_starting()  # on screen in well under a second, while torch and transformers import
        from app.main_window import launch  # any other import error is a bug and shows its traceback

        return launch(splash)
    from engine.cli import main

    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(run())
