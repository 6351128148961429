"""A fixed-size KV cache a compiled forward writes in place, with Glance's edits: crop, compaction, per-row gather.

transformers' `StaticCache` keeps each layer's keys and values in buffers [B, H, slots, D] whose addresses never
change, so a compiled graph (and a CUDA graph) can write new entries at `cumulative_length` without reallocating.
Entries past the length are stale and always masked. Glance keeps the length on the host as well, so that nothing
reads the device to know it, and edits the cache by copying kept entries into place and moving the length back.
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from engine.errors import GlanceError

CAPACITY_STEP = 256  # capacities are rounded up to this, so that runs of similar length share buffers' shapes
# Entries a compaction may move inside the next compiled forward (padded to this, so one graph takes any number);
# a compaction that moves more (paths longer than 16) is done at once, eager.
MOVE_SLOTS = 16
# Buffers hold this many entries past the capacity, never written: attention slices the keys to its window
# (engine/runtime/attention_window.py), and a window as wide as the buffers would make the slice contiguous, which the
# compiled graph guards on (a second graph per size, compiled when a run first fills its cache).
SPARE_SLOTS = 1


def apply_moves(layers, src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Copy entries `src` to `dst` [moves] in every layer's keys and values [B, H, capacity, D] (with `rows`: entry
    src[i] of batch row rows[i] to dst[i] of that row): every source is read before any destination is written.
    Eager in `settle`, and traced into the compiled forward's graph."""
    for layer in layers:
        for buf in (layer.keys, layer.values):
            if rows is None:
                buf.index_copy_(2, dst, buf.index_select(2, src))
            else:
                buf[rows, :, dst] = buf[rows, :, src]  # [M, H, D]: the right side is read whole first


def round_capacity(positions: int) -> int:
    return max(CAPACITY_STEP, -(-positions // CAPACITY_STEP) * CAPACITY_STEP)


class StaticKVCache(StaticCache):
    """transformers' StaticCache with a host-side length and in-place edits (`edits_in_place` tells
    engine/runtime/cache.py to call them)."""

    edits_in_place = True
    pinned = True  # buffers marked as static addresses (CUDA graphs); False when the graph freezes constants

    def __init__(self, config, positions: int) -> None:
        super().__init__(config=config, max_cache_len=round_capacity(positions) + SPARE_SLOTS)
        if any(type(layer) is not StaticLayer for layer in self.layers):
            raise GlanceError(
                "the compiled forward needs full-attention layers (this model slides or mixes attention kinds)"
            )
        self.capacity = round_capacity(positions)  # entries it takes; its buffers hold `slots`
        self.length = 0
        self._all_live: list | None = None  # every layer, once all have buffers (engine reads them every step)
        self._counters: list[torch.Tensor] = []  # their write counters
        # A compaction's moves (batch rows, or None for one row's tail; source and destination positions) not yet
        # done: the next compiled forward does them in its graph (two index ops per buffer there, against 32 ops of
        # about 7 us each here, eager, on the bundled target: 0.25 ms a step; a batch's per-row moves took 0.38-0.55
        # ms a step at B = 4); anything else that reads or edits the buffers does them first (`settle`).
        self.moves: tuple[list[int] | None, list[int], list[int]] | None = None
        self._no_moves: dict[bool, tuple[torch.Tensor, ...]] = {}  # `move_inputs` when nothing moves, per kind

    def _live(self) -> list:
        """The layers whose buffers exist (the first forward creates them all); kept once all exist."""
        live = self._all_live
        if live is None:
            live = [layer for layer in self.layers if layer.is_initialized]
            if len(live) == len(self.layers):
                self._all_live = live
                self._counters = [layer.cumulative_length for layer in live]
        return live

    @property
    def slots(self) -> int:
        """Entries each buffer holds: the capacity and the spare ones."""
        return self.capacity + SPARE_SLOTS

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def reserve(self, extra: int) -> None:
        """Make room for `extra` more entries, growing every buffer when they would not fit (no recompile: the
        compiled graph takes any capacity)."""
        need = self.length + extra
        if need <= self.capacity:
            return
        self.settle()
        capacity = round_capacity(2 * need)
        for layer in self.layers:
            layer.max_cache_len = capacity + SPARE_SLOTS
            if layer.is_initialized:
                for name in ("keys", "values"):
                    old = getattr(layer, name)  # [B, H, slots, D]
                    new = old.new_zeros(old.shape[0], old.shape[1], capacity + SPARE_SLOTS, old.shape[3])
                    new[:, :, : self.length] = old[:, :, : self.length]
                    if self.pinned:
                        torch._dynamo.mark_static_address(new)
                    setattr(layer, name, new)
        self.capacity = capacity

    def unpin(self) -> None:
        """Drop the static-address marks transformers puts on the buffers when they are created. A graph compiled
        with frozen weights (CPU) takes every unguarded static address for a constant: it would keep reading and
        writing the buffers it was compiled with, and the counter's value at that time."""
        for layer in self._live():
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                if hasattr(tensor, "_dynamo_static_input_type"):
                    del tensor._dynamo_static_input_type

    def advance(self, count: int) -> None:
        """The forward just wrote `count` entries at [length, length + count) (its layers moved their own counters)."""
        self.length += count

    def set_length(self, length: int) -> None:
        self.length = length
        counters = self._counters if self._all_live else [layer.cumulative_length for layer in self._live()]
        if counters:  # one foreach op, not one fill per layer: this runs after every verification
            torch._foreach_copy_(counters, [torch.tensor(length, dtype=counters[0].dtype)] * len(counters))

    def crop(self, length: int) -> None:
        """Keep the first `length` entries."""
        self.settle()
        self.set_length(min(length, self.length))

    def compact_tail(self, start: int, offsets: list[int]) -> None:
        """Keep [0, start) plus start + each offset (ascending). The length moves back now; the entries that move
        are copied into place by the next forward (`moves`), or by `settle` before anything else reads them."""
        self.settle()
        moved = [(start + i, start + o) for i, o in enumerate(offsets) if o != i]
        if moved:
            self.moves = (None, [s for _, s in moved], [d for d, _ in moved])
            if len(moved) > MOVE_SLOTS:
                self.settle()
        self.set_length(start + len(offsets))

    def settle(self) -> None:
        """Do the pending moves now, eager."""
        if self.moves is None:
            return
        live = self._live()
        if live:
            rows, src, dst = self.moves
            device = live[0].keys.device
            index = [torch.tensor(x, device=device) for x in (src, dst)]
            apply_moves(live, *index, torch.tensor(rows, device=device) if rows is not None else None)
        self.moves = None

    def move_inputs(self, device, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """The pending moves as a compiled forward takes them: sources and destinations [MOVE_SLOTS], and for a
        batch of more than one row their rows, padded with entry 0 of row 0 onto itself (always written: the
        prompt's first token). They stay pending until `moves_done`. A batch's graphs always take rows; a row
        alone (one prompt, or a batch down to its last row) never does."""
        rowed = batch > 1
        if self.moves is None:  # no compaction pending (every plain step of one row): the same padding each time
            kept = self._no_moves.get(rowed)
            if kept is None or kept[0].device != torch.device(device):
                kept = torch.zeros(2 + rowed, MOVE_SLOTS, dtype=torch.long, device=device).unbind(0)
                self._no_moves[rowed] = kept
            return kept
        rows, src, dst = self.moves
        pad = [0] * (MOVE_SLOTS - len(src))
        index = [src + pad, dst + pad]
        if rowed:
            index.append((rows or [0] * len(src)) + pad)
        return torch.tensor(index, device=device).unbind(0)

    def moves_done(self) -> None:
        self.moves = None

    def move_row_entries(self, rows: list[int], src: list[int], dst: list[int], length: int) -> None:
        """Copy entry src[i] of row rows[i] to dst[i] in every layer (all sources read first), then keep `length`
        entries: engine/runtime/cache.py's move_row_entries. Up to MOVE_SLOTS moves wait for the next compiled forward,
        which does them in its graph (`move_inputs`); more are done now."""
        self.settle()
        if rows:
            self.moves = (list(rows), list(src), list(dst))
            if len(rows) > MOVE_SLOTS:
                self.settle()
        self.set_length(length)

    def keep_batch_rows(self, rows: list[int]) -> None:
        """Keep only the batch rows `rows` (ascending) in new buffers: engine/runtime/cache.py's keep_batch_rows."""
        self.settle()
        live = self._live()
        if not live:
            return
        index = torch.tensor(rows, dtype=torch.long, device=live[0].keys.device)
        for layer in live:
            for name in ("keys", "values"):
                new = getattr(layer, name).index_select(0, index)  # [len(rows), H, slots, D]
                if self.pinned:
                    torch._dynamo.mark_static_address(new)
                setattr(layer, name, new)
            layer.batch_size = len(rows)

    def write_rows(self, source: StaticKVCache, rows: list[int], source_rows: list[int]) -> None:
        """Write row source_rows[i] of `source` (its first `source.length` entries) into row rows[i], adding rows
        past the batch's end: engine/runtime/cache.py's write_rows. The length becomes the longer of the two."""
        self.settle()
        source.settle()
        length = source.length
        self.reserve(max(length - self.length, 0))
        live, sources = self._live(), source._live()
        more = max(rows, default=-1) + 1 - (live[0].keys.shape[0] if live else 0)
        for layer in live if more > 0 else ():
            for name in ("keys", "values"):
                old = getattr(layer, name)  # [B, H, slots, D]
                new = torch.cat([old, old.new_zeros(more, *old.shape[1:])])
                if self.pinned:
                    torch._dynamo.mark_static_address(new)
                setattr(layer, name, new)
            layer.batch_size = new.shape[0]
        if rows and live:
            r = torch.tensor(rows, device=live[0].keys.device)
            s = torch.tensor(source_rows, device=live[0].keys.device)
            for layer, src in zip(live, sources):
                for name in ("keys", "values"):  # [B, H, slots, D]
                    getattr(layer, name)[r, :, :length] = getattr(src, name)[s, :, :length]
        self.set_length(max(self.length, length))

    def gather_rows(self, index: torch.Tensor) -> None:
        """Row b keeps entries index[b] (ascending; pad entries point anywhere and stay masked). index: [B, L]."""
        self.settle()
        width = index.shape[1]
        for layer in self._live():
            b, h, _, d = layer.keys.shape
            idx = index.to(layer.keys.device)[:, None, :, None].expand(b, h, width, d)  # [B, H, L, D]
            layer.keys[:, :, :width] = layer.keys.gather(2, idx)
            layer.values[:, :, :width] = layer.values.gather(2, idx)
        self.set_length(width)
