"""File > Export: a folder with the session log, per-step and per-run CSVs, chart PNGs and a Markdown report."""

from __future__ import annotations

from pathlib import Path

from engine import GlanceError, copy_run, markdown_report, read_session_log, write_runs_csv, write_steps_csv

EXPORT_FILES = ["session.jsonl", "steps.csv", "runs.csv", "report.md"]


def export_session(log_path: Path, folder: Path, charts=None, run: int = -1) -> list[Path]:
    """Write every export file of one run of the log (default: the last) into `folder`, each whole; raises
    GlanceError when the folder cannot be written (a full disk), and removes what this export wrote before then."""
    from engine.records.files import write_text_checked

    folder = Path(folder)
    written: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        copy_run(log_path, folder / "session.jsonl", run)
        written.append(folder / "session.jsonl")
        log = read_session_log(folder / "session.jsonl")
        for name, write in (("steps.csv", write_steps_csv), ("runs.csv", write_runs_csv)):
            write(log, folder / name)
            written.append(folder / name)
        written.append(write_text_checked(folder / "report.md", markdown_report(log)))
        if charts is not None:
            written += [Path(p) for p in charts.export_png(folder)]
    except (OSError, GlanceError) as exc:
        for path in written:
            path.unlink(missing_ok=True)
        if isinstance(exc, GlanceError):
            raise
        raise GlanceError(f"cannot export to {folder}: {exc.strerror or exc}") from None
    return written
