"""Read a GGUF file's header once per load: transformers parses it three times (config, tokenizer, weights), and
parsing SmolLM2's 49k-entry vocabulary costs seconds each time (numpy indexing per entry). It also rebuilds gguf's
tensor-name table once per submodule (397 times for SmolLM2); one table per architecture and depth is enough."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()  # one patched load at a time: the reader class is a module attribute


@contextmanager
def one_reader_per_file() -> Iterator[None]:
    """While inside, `gguf.GGUFReader(path)` returns one shared reader per (path, mode) and `gguf.get_tensor_name_map`
    one table per arguments. transformers imports both from `gguf` at each call and only reads what they return
    (fields, tensors' memory maps, name lookups), so sharing is safe."""
    import gguf

    with _LOCK:
        original = gguf.GGUFReader
        readers: dict[tuple[str, str], object] = {}

        def shared(path, mode: str = "r"):
            key = (os.path.realpath(os.fspath(path)), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        original_map = gguf.get_tensor_name_map
        gguf.GGUFReader = shared
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original_map)  # read only by its callers
        try:
            yield
        finally:
            gguf.GGUFReader = original
            gguf.get_tensor_name_map = original_map
