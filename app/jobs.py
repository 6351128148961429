"""The jobs the window runs on the engine thread, one at a time: a name the status bar can show, and what the
window does for each, declared here rather than by comparing strings."""

from __future__ import annotations

from enum import StrEnum


class Job(StrEnum):
    LOAD = "load"  # load (and compile) the models: the result is a Session
    RACE = "race"  # every chosen lane on one prompt: the result is how it ended
    BENCHMARK = "benchmark"  # the prompt suite or the batch sweep: the result is their results
    OPEN = "open"  # read a session log: the result is the log's runs
    TIMING = "timing"  # time the target's forwards over a range of widths: the result is their costs

    @property
    def stoppable(self) -> bool:
        """Whether Stop ends it: every job checks the cancel flag (a load between parts and compile shapes)."""
        return True

    @property
    def live_charts(self) -> bool:
        """Whether the charts draw as events come (a race's)."""
        return self is Job.RACE
