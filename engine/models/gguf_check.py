"""A GGUF file's header walked once with every count and length checked against the file's own size, before
transformers and gguf read it: a damaged or hostile header (a count of 2^60 entries, a string longer than the
file, a layer count the file holds no tensors for) is one GlanceError instead of a hang or a model with random
layers."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

from engine.errors import GlanceError

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_LAYERS = 4096


class _Walker:
    def __init__(self, data, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def bad(self, what: str) -> GlanceError:
        return GlanceError(f"{self.path} is not a readable GGUF file: {what} (at byte {self.at})")

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.data):
            raise self.bad("the header runs past the end of the file")
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += size
        return value

    def count(self, what: str, least_bytes: int) -> int:
        """A count read from the file, refused when that many entries of `least_bytes` each cannot fit in it."""
        n = self.take("Q")
        if n * least_bytes > len(self.data) - self.at:
            raise self.bad(f"it claims {n:,} {what}, more than the file's {len(self.data):,} bytes can hold")
        return n

    def string(self) -> bytes:
        n = self.count("bytes of a string", 1)
        raw = bytes(self.data[self.at : self.at + n])
        self.at += n
        return raw

    def value(self, kind: int, depth: int = 0):
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string().decode("utf-8", "replace")
        if kind == ARRAY and depth < 2:
            inner = self.take("I")
            least = struct.calcsize("<" + SCALARS[inner]) if inner in SCALARS else 8
            n = self.count("array items", least)
            if inner in SCALARS:  # skipped whole: a vocabulary's scores are 49k floats
                self.at += n * least
                return n
            for _ in range(n):
                self.value(inner, depth + 1)
            return n
        raise self.bad(f"unknown value type {kind}")


def check_gguf_header(path: Path) -> dict:
    """The file's metadata (arrays as their lengths), after checking that its header is whole and that the layer
    count it claims matches the layers it holds tensors for."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk(_Walker(data, path))
    except (OSError, ValueError) as exc:  # ValueError: mmap of an empty file
        raise GlanceError(f"cannot read the GGUF file {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _walk(w: _Walker) -> dict:
    if bytes(w.data[:4]) != b"GGUF":
        raise w.bad("it does not start with the GGUF magic bytes")
    w.at = 4
    version = w.take("I")
    if version not in (2, 3):
        raise w.bad(f"GGUF version {version} (Glance reads 2 and 3)")
    tensors = w.count("tensors", 8 + 4 + 4 + 8)
    entries = w.count("metadata entries", 8 + 4)
    meta: dict = {}
    for _ in range(entries):
        key = w.string().decode("utf-8", "replace")
        meta[key] = w.value(w.take("I"))
    names = []
    for _ in range(tensors):
        names.append(w.string().decode("utf-8", "replace"))
        dims = w.take("I")
        if dims > 8:
            raise w.bad(f"tensor {names[-1]!r} claims {dims} dimensions")
        w.at += 8 * dims + 4 + 8  # shape, type, offset
    arch = meta.get("general.architecture")
    claimed = meta.get(f"{arch}.block_count")
    if isinstance(claimed, int):
        held = {int(m.group(1)) for m in map(re.compile(r"blk\.(\d+)\.").match, names) if m}
        if not 0 < claimed <= MAX_LAYERS or claimed != len(held):
            raise GlanceError(
                f"{w.path} claims {claimed} layers ({arch}.block_count) but holds tensors for {len(held)}: a damaged "
                "or edited file (its missing layers would load as random weights)"
            )
    return meta
