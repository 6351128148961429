"""Session logs in JSON Lines: a header, one line per step event, one summary line per run.

Each line is written whole and flushed, so a crash loses at most the line being written; a failed write (a full
disk) is truncated back, so the file always holds complete lines only. The reader stops at the last complete line.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import GlanceError
from engine.events import RunSummary, StepEvent
from engine.system import cpu_name

FORMAT = "glance-session/1"


def environment() -> dict:
    """Versions that make a log reproducible."""
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "processor": cpu_name(),
    }


class SessionLogWriter:
    """Append-only JSONL writer. Use as a context manager; `header` must come first."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab")
        except OSError as exc:
            raise GlanceError(f"cannot write the session log {self.path}: {exc.strerror or exc}") from None

    def _write(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        pos = self._fh.tell()
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:
            try:  # leave complete lines only
                self._fh.truncate(pos)
            except OSError:
                pass
            raise GlanceError(f"writing the session log {self.path} failed: {exc.strerror or exc}") from None

    def header(self, models: dict, device: str, settings: dict) -> None:
        self._write(
            {
                "type": "header",
                "format": FORMAT,
                "environment": environment(),
                "models": models,
                "device": device,
                "settings": settings,
            }
        )

    def event(self, item: StepEvent | RunSummary) -> None:
        kind = "summary" if isinstance(item, RunSummary) else "step"
        self._write({"type": kind, **item.to_dict()})

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> SessionLogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class SessionLog:
    header: dict
    steps: list[StepEvent] = field(default_factory=list)
    summaries: list[RunSummary] = field(default_factory=list)
    truncated: bool = False  # the file ended in a partial line (a crash mid-write)


def iter_records(path: str | os.PathLike) -> Iterator[dict]:
    """Complete JSON lines of the file; a last line without its newline (cut mid-write) is skipped."""
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            yield json.loads(raw)


def read_session_log(path: str | os.PathLike) -> SessionLog:
    """Read a log back into events and summaries."""
    path = Path(path)
    if not path.exists():
        raise GlanceError(f"session log not found: {path}")
    records = iter_records(path)
    try:
        header = next(records)
    except StopIteration:
        raise GlanceError(f"{path} is empty or holds no complete line") from None
    if header.get("type") != "header":
        raise GlanceError(f"{path} is not a Glance session log (its first line is not a header)")
    log = SessionLog(header)
    for rec in records:
        kind = rec.pop("type")
        if kind == "step":
            log.steps.append(StepEvent(**rec))
        elif kind == "summary":
            log.summaries.append(RunSummary(**rec))
    log.truncated = not path.read_bytes().endswith(b"\n")
    return log
