"""Races: several decoders on one prompt, never two computing at once on one device.

Interleaved mode advances each lane one step in turn (round robin); each lane's clock adds up only its own steps,
so a UI can show lanes live while the timings stay honest. Sequential mode runs lanes one after another.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from engine.decoding.loop import CancelCheck, Decoder
from engine.records.events import RunSummary, StepEvent


@dataclass
class Lane:
    name: str
    decoder: Decoder


def race(
    lanes: list[Lane], prompt_ids: list[int], cancel: CancelCheck = None, interleaved: bool = True
) -> Iterator[tuple[str, StepEvent | RunSummary]]:
    """Yield (lane name, event) until every lane has yielded its RunSummary."""
    if not interleaved:
        for lane in lanes:
            for item in lane.decoder.run(prompt_ids, cancel):
                yield lane.name, item
        return
    streams = {lane.name: lane.decoder.run(prompt_ids, cancel) for lane in lanes}
    while streams:
        for name in list(streams):
            item = next(streams[name])
            yield name, item
            if isinstance(item, RunSummary):
                del streams[name]
