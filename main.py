"""Glance entry point: `python main.py` opens the app; `python main.py <command>` runs the CLI."""

import os
import sys

# Quiet transformers' advisory warnings on a console the user reads; errors still surface.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def usable_inductor_cache() -> None:
    """torch creates its compile cache folder when it is imported: one that cannot be written (read-only, full, a
    file in the way) failed every command with a traceback. Fall back to a fresh temporary folder, and say so."""
    import getpass
    import tempfile

    wanted = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    try:
        os.makedirs(wanted, exist_ok=True)
        with tempfile.TemporaryFile(dir=wanted):
            pass
    except OSError as exc:
        fallback = tempfile.mkdtemp(prefix="glance-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fallback
        why = exc.strerror or exc
        print(
            f"glance: warning: the compile cache {wanted} cannot be written ({why}); using {fallback}", file=sys.stderr
        )


def run() -> int:
    usable_inductor_cache()
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
