"""Time spent inside model calls, so the loop's own overhead per step can be reported beside it."""

from __future__ import annotations

import time

import torch


class ModelClock:
    """Adds up wall seconds inside the outermost forward calls of the given modules (nested calls count once)."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._start = 0.0
        self._handles = []
        for m in modules:
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))

    def _enter(self, *_) -> None:
        if self._depth == 0:
            self._start = time.perf_counter()
        self._depth += 1

    def _leave(self, *_) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._start

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> ModelClock:
        return self

    def __exit__(self, *_) -> None:
        self.close()
