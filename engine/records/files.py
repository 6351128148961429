"""Writes that either land whole or say why not: through a temporary file beside the target, renamed into place, so
a full disk, a read-only folder or a crash never leaves a truncated file that looks complete."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import GlanceError


def write_bytes_checked(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` whole (flushed to disk), or raise GlanceError naming the path and the reason; nothing
    is left behind on failure."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise GlanceError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def write_text_checked(path: str | os.PathLike, text: str) -> Path:
    """`write_bytes_checked` for UTF-8 text."""
    return write_bytes_checked(path, text.encode("utf-8"))
