"""How long a phase has left, from how long its done part took: what a long load, compile or benchmark shows."""

from __future__ import annotations

import time


class PhaseClock:
    """Restarted whenever the phase (its name) changes; `left(done, total)` says about how many seconds remain."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.started = time.perf_counter()

    def left(self, phase: str, done: int, total: int) -> str:
        if phase != self.phase:
            self.phase, self.started = phase, time.perf_counter()
            return ""
        elapsed = time.perf_counter() - self.started
        if done <= 0 or total <= done or elapsed < 1.0:
            return ""
        return f"about {elapsed / done * (total - done):.0f} s left"
