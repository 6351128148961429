"""File > Export: a folder with the session log, per-step and per-run CSVs, chart PNGs and a Markdown report."""

from __future__ import annotations

from pathlib import Path

from engine import GlanceError, copy_run, markdown_report, read_session_log, write_runs_csv, write_steps_csv

EXPORT_FILES = ["session.jsonl", "steps.csv", "runs.csv", "report.md"]


def export_session(log_path: Path, folder: Path, charts=None, run: int = -1) -> list[Path]:
    """Write every export file of one run of the log (default: the last) into `folder`; raises GlanceError when
    the folder cannot be written."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        copy_run(log_path, folder / "session.jsonl", run)
        log = read_session_log(folder / "session.jsonl")
        write_steps_csv(log, folder / "steps.csv")
        write_runs_csv(log, folder / "runs.csv")
        (folder / "report.md").write_text(markdown_report(log))
        written = [folder / name for name in EXPORT_FILES]
        if charts is not None:
            written += [Path(p) for p in charts.export_png(folder)]
    except OSError as exc:
        raise GlanceError(f"cannot export to {folder}: {exc.strerror or exc}") from None
    return written
