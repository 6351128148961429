"""Session logs in JSON Lines: a header, one line per step event, one summary line per run.

Each line is written whole and flushed, so a crash loses at most the line being written; a failed write (a full
disk) is truncated back, so the file always holds complete lines only. The reader stops at the last complete line.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, is_dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path

from engine.errors import GlanceError
from engine.records.events import DraftNotes, RunSummary, StepEvent
from engine.runtime.machine import cpu_features, cpu_name

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
        "cpu_features": cpu_features(),  # bfloat16 matrix instructions and L3: what a log's speeds depend on
    }


class SessionLogWriter:
    """Append-only JSONL writer. Use as a context manager; `header` must come first."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered: a line reaches the file whole or the failed part is cut off again. With a buffer, a failed
            # flush left the bytes in it, and truncating (which flushes first) failed the same way.
            self._fh = open(self.path, "ab", buffering=0)
        except OSError as exc:
            raise GlanceError(f"cannot write the session log {self.path}: {exc.strerror or exc}") from None

    def _write(self, record: dict) -> None:
        if self._fh.closed:
            raise GlanceError(f"the session log {self.path} is closed")
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        pos = os.fstat(self._fh.fileno()).st_size
        try:
            view = memoryview(line)
            while view:  # a raw write may take only part of the line
                written = self._fh.write(view)
                view = view[written:]
        except OSError as exc:
            try:  # leave complete lines only, then stop: a full disk will not take the next line either
                os.ftruncate(self._fh.fileno(), pos)
            except OSError:
                pass
            self.close()
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

    def event(self, item: StepEvent | RunSummary, text: StepText | None = None) -> None:
        """One step or summary line; a step's `text` (what the app showed) goes with it."""
        kind = "summary" if isinstance(item, RunSummary) else "step"
        record = {"type": kind, **item.to_dict()}
        if text is not None:
            record["pieces"], record["rejected_pieces"] = text.pieces, text.rejected
        self._write(record)

    def close(self) -> None:
        """Close the file; never raises (nothing is buffered, so nothing can be lost here)."""
        try:
            self._fh.close()
        except OSError:
            pass

    def __enter__(self) -> SessionLogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class StepText:
    """A step's text as the app showed it: each emitted token's piece, and the rejected draft tokens' pieces."""

    pieces: list[str]
    rejected: list[str] = field(default_factory=list)


@dataclass
class SessionLog:
    header: dict
    steps: list[StepEvent] = field(default_factory=list)
    texts: list[StepText | None] = field(default_factory=list)  # per step: its text, where the app logged it
    offsets: list[int] = field(default_factory=list)  # per step: its line's byte offset (`read_target_top`)
    summaries: list[RunSummary] = field(default_factory=list)
    truncated: bool = False  # the file ended in a partial line (a crash mid-write)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, why) of lines that were not read

    def skipped_note(self) -> str:
        """One line about skipped lines for a status bar ("" when none)."""
        if not self.skipped:
            return ""
        first = ", ".join(f"line {n} ({why})" for n, why in self.skipped[:3])
        more = f" and {len(self.skipped) - 3} more" if len(self.skipped) > 3 else ""
        return f"skipped {len(self.skipped)} unreadable line(s): {first}{more}"


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, record or None, why not) for every complete line; a last line without its newline (cut
    mid-write) is not yielded."""
    with open(path, "rb") as fh:
        yield from _lines(fh)


def _lines(fh) -> Iterator[tuple[int, dict | None, str]]:
    for number, _, rec, why in _lines_at(fh):
        yield number, rec, why


def _lines_at(fh) -> Iterator[tuple[int, int, dict | None, str]]:
    """(line number, byte offset, record or None, why not) for every complete line of a binary file."""
    offset = 0
    for number, raw in enumerate(fh, start=1):
        if not raw.endswith(b"\n"):
            return
        at, offset = offset, offset + len(raw)
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            yield number, at, None, "not JSON"
            continue
        except RecursionError:
            yield number, at, None, "JSON nested too deeply"
            continue
        if not isinstance(rec, dict):
            yield number, at, None, "not a JSON object"
            continue
        yield number, at, rec, ""


def iter_records(path: str | os.PathLike) -> Iterator[dict]:
    """The complete, well-formed JSON object lines of the file."""
    for _, rec, _ in iter_lines(path):
        if rec is not None:
            yield rec


@functools.cache
def _checker(hint) -> Callable[[object], bool]:
    """Whether a JSON value fits a field's type hint (int, float, str, bool, list[...], dict, X | None), as a compiled
    test for one type hint: the hint is taken apart once, not once per value of a large log."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        options = [_checker(a) for a in args]
        return lambda v: any(check(v) for check in options)
    if hint is type(None):
        return lambda v: v is None
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return lambda v: type(v) is float or (type(v) is int)
    if origin is int:
        return lambda v: type(v) is int
    if origin is list:
        if not args:
            return lambda v: type(v) is list
        item = _checker(args[0])
        if args[0] in (int, float, str, bool):  # flat lists of scalars: one pass, no call per item
            allowed = {int, float} if args[0] is float else {args[0]}
            return lambda v: type(v) is list and all(type(x) in allowed for x in v)
        return lambda v: type(v) is list and all(item(x) for x in v)
    return lambda v: isinstance(v, origin)


@functools.cache
def _schema(cls) -> tuple[dict, dict]:
    """A record class's field type hints and fields, computed once (a large log has a million records)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclass_fields(cls)}


@functools.cache
def _nested(hint):
    """The dataclass a field's hint names (X or X | None), else None."""
    for option in typing.get_args(hint) or (hint,):
        if is_dataclass(option):
            return option
    return None


def _step_record(rec: dict) -> tuple[dict, StepText | None]:
    """A step line's event fields and its text; an older line's free `extra` dict becomes the typed notes."""
    pieces, rejected = rec.pop("pieces", None), rec.pop("rejected_pieces", None)
    extra = rec.pop("extra", None)
    if isinstance(extra, dict):
        pieces = extra.pop("pieces", pieces)
        rejected = extra.pop("rejected_pieces", rejected)
        extra.pop("log_offset", None)
        if extra.pop("prefill", False):
            rec.setdefault("prefill", True)
        if "depth_cap" in extra:
            rec.setdefault("budget", {"depth_cap": extra.pop("depth_cap"), "narrow": bool(extra.pop("narrow", False))})
        if "target_token_in_draft_vocab" in extra:
            extra["target_in_draft_vocab"] = extra.pop("target_token_in_draft_vocab")
        names = {f.name for f in dataclass_fields(DraftNotes)}
        rec.setdefault("notes", {k: v for k, v in extra.items() if k in names})
    if pieces is None:
        return rec, None
    if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
        raise GlanceError("field 'pieces' is not a list of strings")
    ok = isinstance(rejected, list) and all(isinstance(p, str) for p in rejected)
    return rec, StepText(pieces, rejected if ok else [])


# Header settings the app reads, by type: a value of another type is dropped (and named) when the log is read.
HEADER_SETTINGS = {
    "prompt": str,
    "methods": list[str],
    "temperature": float,
    "top_p": float,
    "dtype": str,
    "forward": str,
    "plain_step": float,
    "max_new_tokens": int,
    "chat": bool,
    "prompt_ids": list[int],
}


def _checked_header(rec: dict, number: int, skipped: list[tuple[int, str]]) -> dict:
    """A header with its parts the readers use of the right types; what is not is dropped and listed in `skipped`."""
    for key in ("settings", "models", "environment"):
        if key in rec and not isinstance(rec[key], dict):
            skipped.append((number, f"header field {key!r} is {type(rec[key]).__name__}, not an object: ignored"))
            rec[key] = {}
    settings = rec.setdefault("settings", {})
    for key, hint in HEADER_SETTINGS.items():
        if key in settings and not _checker(hint)(settings[key]):
            skipped.append((number, f"header setting {key!r} is {type(settings[key]).__name__}, not {hint}: ignored"))
            del settings[key]
    return rec


def check_step(ev: StepEvent) -> None:
    """A step's parts agree with each other (what the app draws from them); GlanceError naming the first that
    does not."""
    n = len(ev.draft_tokens)
    if len(ev.draft_parents) != n:
        raise GlanceError(f"{len(ev.draft_parents)} draft_parents for {n} draft_tokens")
    for i, p in enumerate(ev.draft_parents):
        if not -1 <= p < i:
            raise GlanceError(f"draft_parents[{i}] is {p}: a node's parent comes before it")
    parent = -1
    for a in ev.accepted_nodes:
        if not 0 <= a < n or ev.draft_parents[a] != parent:
            raise GlanceError(f"accepted_nodes {ev.accepted_nodes[:8]} is not a path of the {n}-node draft")
        parent = a
    if len(ev.from_draft) != len(ev.tokens) or len(ev.target_probs) not in (0, len(ev.tokens)):
        raise GlanceError(f"{len(ev.tokens)} tokens with {len(ev.from_draft)} from_draft, {len(ev.target_probs)} probs")
    if any(not 0 <= t < 1 << 31 for t in ev.tokens + ev.draft_tokens) or ev.step < 0 or ev.new_tokens < 0:
        raise GlanceError("a token id past any vocabulary, or a negative step or count")
    if len(ev.target_top) > n + 1:
        raise GlanceError(f"target_top has {len(ev.target_top)} rows for {n + 1} verified rows")
    if not _top_rows_ok(ev.target_top):
        raise GlanceError("target_top is not rows of [token, probability] pairs")
    notes = ev.notes
    for name in ("window", "ngrams"):
        value = getattr(notes, name)
        if value is not None and not all(type(t) is int for level in value for t in level):
            raise GlanceError(f"notes.{name} is not lists of token ids")


def parse_record(cls, rec: dict):
    """A StepEvent or RunSummary from a log record, every field present and of its type; GlanceError naming the
    field otherwise."""
    hints, known = _schema(cls)
    unknown = sorted(set(rec) - set(known))
    if unknown:
        raise GlanceError(f"unknown field {unknown[0]!r}")
    for name, f in known.items():
        if name not in rec:
            if f.default is MISSING and f.default_factory is MISSING:
                raise GlanceError(f"missing field {name!r}")
            continue
        nested = _nested(hints[name])
        if nested is not None and isinstance(rec[name], dict):  # a typed part of a record (an event's notes)
            rec[name] = parse_record(nested, rec[name])
        if not _checker(hints[name])(rec[name]):
            raise GlanceError(f"field {name!r} is {type(rec[name]).__name__}, not {hints[name]}")
    return cls(**rec)


def read_session_logs(
    path: str | os.PathLike,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    keep_top: bool = True,
) -> list[SessionLog]:
    """Every run in a log, in file order: each header starts a run (`--log` appends one per command), so runs
    are never merged into one lane. Lines that are not JSON objects, of an unknown type or with a missing or
    mistyped field are skipped and listed in their run's `skipped`; only a file that does not start with a header
    is refused. `progress(bytes read, file size)` is told every few thousand lines; `cancel()` true stops the read
    (GlanceError "reading cancelled"). Without `keep_top` steps come without their `target_top` (two thirds of a
    large log's memory); `offsets` has each step's line to read it back from (`read_target_top`)."""
    path = Path(path)
    if not path.exists():
        raise GlanceError(f"session log not found: {path}")
    if path.is_dir():
        raise GlanceError(f"{path} is a folder, not a session log")
    size = path.stat().st_size
    runs: list[SessionLog] = []
    with open(path, "rb") as fh:
        for number, at, rec, why in _lines_at(fh):
            if number % 2000 == 0:
                if cancel is not None and cancel():
                    raise GlanceError("reading cancelled")
                if progress is not None:
                    progress(fh.tell(), size)
            if not runs:
                if rec is None or rec.get("type") != "header":
                    raise GlanceError(f"{path} is not a Glance session log (its first line is not a header)")
                runs.append(SessionLog({}))
                runs[-1].header = _checked_header(rec, number, runs[-1].skipped)
                continue
            log = runs[-1]
            if rec is None:
                log.skipped.append((number, why))
                continue
            kind = rec.pop("type", None)
            if kind == "header":  # the next run appended to the same file
                runs.append(SessionLog({}))
                runs[-1].header = _checked_header(rec, number, runs[-1].skipped)
                continue
            kinds = {"step": (StepEvent, log.steps), "summary": (RunSummary, log.summaries)}
            if not isinstance(kind, str) or kind not in kinds:
                log.skipped.append((number, f"unknown type {kind!r}"))
                continue
            cls, into = kinds[kind]
            text = None
            try:
                if kind == "step":
                    rec, text = _step_record(rec)
                    if not keep_top and isinstance(rec.get("target_top"), list):
                        rec["target_top"] = []
                item = parse_record(cls, rec)
                if kind == "step":
                    check_step(item)
                into.append(item)
            except GlanceError as exc:
                log.skipped.append((number, str(exc)))
                continue
            if kind == "step":
                log.texts.append(text)
                log.offsets.append(at)
        if not runs:
            raise GlanceError(f"{path} is empty or holds no complete line")
        fh.seek(0, os.SEEK_END)
        if fh.tell():
            fh.seek(-1, os.SEEK_END)
            runs[-1].truncated = fh.read(1) != b"\n"
    if progress is not None:
        progress(size, size)
    return runs


def read_session_log(path: str | os.PathLike, run: int = -1) -> SessionLog:
    """One run of a log (default: the last, the newest); see `read_session_logs`."""
    runs = read_session_logs(path)
    try:
        return runs[run]
    except IndexError:
        raise GlanceError(f"{path} holds {len(runs)} run(s), not run {run}") from None


def copy_run(src: str | os.PathLike, dst: str | os.PathLike, run: int = -1) -> None:
    """Write one run of a log (its header line up to the next header) to `dst`, byte for byte, whole or not at all."""
    from engine.records.files import write_bytes_checked

    with open(src, "rb") as fh:
        starts = [number - 1 for number, rec, _ in _lines(fh) if rec is not None and rec.get("type") == "header"]
    if not starts:
        raise GlanceError(f"{src} is not a Glance session log (it holds no header)")
    first = starts[run]
    end = next((i for i in starts if i > first), None)
    with open(src, "rb") as fh:
        kept = [line for i, line in enumerate(fh) if i >= first and (end is None or i < end)]
    write_bytes_checked(dst, b"".join(kept))


def read_target_top(path: str | os.PathLike, offset: int) -> list:
    """The `target_top` of the step whose line starts at `offset` ([] when that line is gone or not a step)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            rec = json.loads(fh.readline())
    except (OSError, ValueError, RecursionError):
        return []
    top = rec.get("target_top") if isinstance(rec, dict) and rec.get("type") == "step" else None
    return top if isinstance(top, list) and _top_rows_ok(top) else []


def _top_rows_ok(top: list) -> bool:
    """Rows of [token id, probability] pairs, as `target_top` holds them."""
    return all(
        isinstance(row, list)
        and all(isinstance(p, list) and len(p) == 2 and type(p[0]) is int and type(p[1]) in (int, float) for p in row)
        for row in top
    )
