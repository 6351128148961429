"""The boundary for files a user hands Glance (model and head configs, prompt files, log lines, settings): each is
read with its size bounded, decoded as UTF-8, parsed with its nesting bounded, and its fields checked for type and
range where they enter. Every failure is one GlanceError naming the file and the field, never a library traceback."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from engine.errors import GlanceError

MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; a tokenizer_config with a long template, a megabyte or two
BIG = 1 << 24  # no hidden size, head count or vocabulary id of a model Glance can run is this large


def read_text(path: str | os.PathLike, what: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """The file's text, refused when missing, larger than `limit` bytes or not UTF-8."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limit:
            raise GlanceError(f"{path} is {size / 1e6:.1f} MB, too large for {what} (at most {limit / 1e6:.0f} MB)")
        data = path.read_bytes()
    except OSError as exc:
        raise GlanceError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GlanceError(f"{path} is not UTF-8 text (byte {exc.start}): not {what}") from None


def parse_json(text: str | bytes, where: str) -> object:
    """json.loads that turns every failure, deep nesting included, into one GlanceError naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GlanceError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise GlanceError(f"{where} is not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise GlanceError(f"{where} is nested too deeply to read") from None


def read_json(path: str | os.PathLike, what: str, limit: int = MAX_CONFIG_BYTES) -> object:
    return parse_json(read_text(path, what, limit), str(path))


def read_json_object(path: str | os.PathLike, what: str, limit: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON file that must hold one object (a config.json)."""
    data = read_json(path, what, limit)
    if not isinstance(data, dict):
        raise GlanceError(f"{path} holds a JSON {type(data).__name__}, not an object: not {what}")
    return data


def whole(value: object, field: str, where: str, lo: int = 1, hi: int = BIG) -> int:
    """`value` as an int in [lo, hi]; a bool, a fraction, a string or an out-of-range number is refused."""
    ok = type(value) is int or (type(value) is float and math.isfinite(value) and value == int(value))
    if not ok or not lo <= int(value) <= hi:
        raise GlanceError(f"{where}: {field} is {value!r}, not a whole number from {lo} to {hi}")
    return int(value)


def number(value: object, field: str, where: str, lo: float = 0.0, hi: float = math.inf, above: bool = True) -> float:
    """`value` as a finite float with lo < value <= hi (lo <= value when `above` is False)."""
    ok = type(value) in (int, float) and math.isfinite(value)
    if not ok or not (value > lo if above else value >= lo) or value > hi:
        raise GlanceError(f"{where}: {field} is {value!r}, not a number {'above' if above else 'from'} {lo:g}")
    return float(value)


def whole_list(value: object, field: str, where: str, length: int, lo: int, hi: int) -> list[int]:
    """A list of exactly `length` whole numbers in [lo, hi]."""
    if not isinstance(value, list) or len(value) != length:
        raise GlanceError(f"{where}: {field} is {value!r}, not a list of {length} whole numbers")
    return [whole(v, field, where, lo, hi) for v in value]
