"""EAGLE drafting for a whole batch: one head forward and read-out per depth for every row's frontier, instead of
one per row and depth.

Each row keeps its own EagleDrafter (its pending (token, feature) pairs, its settings) and grows its own tree
(`GrowingTree`), so every row drafts the tree it would draft alone. The rows share one batched head cache: a row's
committed pairs and its draft entries sit at columns that are tracked per row, a forward's mask lets each new entry
see its row's committed pairs, its own ancestors and itself, and before each step the cache is packed to each
row's committed pairs (a per-row gather, as the target's cache in engine/batch.py).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.cache import cache_length, pack_columns
from engine.drafters.base import DecodeState
from engine.heads.readout import draft_step
from engine.tree import Draft, additive_mask


class BatchedTrees:
    """Grows every drafting row's EAGLE tree with one head call per depth for all of them."""

    def __init__(self, drafters: list, grow: type) -> None:
        """`drafters`: one EagleDrafter per row, all over the same head; `grow`: the tree class (GrowingTree)."""
        self.grow = grow
        self.rows = drafters
        self.head = drafters[0].head
        weight = next(self.head.parameters())
        self.dtype, self.device = weight.dtype, weight.device
        self.cache = self.head.new_cache()
        self.cols: list[list[int]] = [[] for _ in drafters]  # cache columns of row b's committed pairs

    def replace(self, row: int, drafter) -> None:
        """Row `row` decodes a new prompt with `drafter`: its columns are forgotten (packed away before the next
        draft), so the new prompt's pairs are fed as a fresh row's are."""
        self.rows[row] = drafter
        self.cols[row] = []

    def _forward(
        self, feeds: dict[int, tuple[list[int], torch.Tensor, list[int], list[int], list[list[int]]]], readout=True
    ) -> dict:
        """One head forward and read-out. feeds[b] = (tokens, features [n, F], positions, columns every new entry may
        see, columns each new entry may see besides those and itself). Returns {b: (outputs [n, H], the columns the
        new entries took, per new entry its candidates (target ids, log-probs) as lists)}; `readout` False: the
        head forward alone, no candidates (None)."""
        # at least two entries per row (padding: never seen, packed away), so a compiled step has one graph for
        # every batch forward rather than one more for a single new entry
        B, S = len(self.rows), max(2, max(len(f[0]) for f in feeds.values()))
        width = cache_length(self.cache)
        hidden = next(iter(feeds.values()))[1].shape[-1]
        ids, positions = np.zeros((B, S), dtype=np.int64), np.zeros((B, S), dtype=np.int64)
        feats = torch.zeros(B, S, hidden, dtype=self.dtype)  # [B, S, F]
        # visibility built in numpy: a torch index op per entry over a row's hundreds of columns cost 0.8 ms a depth
        visible = np.zeros((B, S, width + S), dtype=bool)
        visible[:, np.arange(S), width + np.arange(S)] = True  # every entry sees itself (padding too)
        for b, (tokens, f, pos, common, extra) in feeds.items():
            n = len(tokens)
            ids[b, :n] = tokens
            feats[b, :n] = f.to(self.dtype)
            positions[b, :n] = pos
            if common:
                visible[b, :n, common] = True
            for r, cols in enumerate(extra):
                if cols:
                    visible[b, r, cols] = True
        device = self.device
        inputs = (
            torch.from_numpy(ids).to(device),
            feats.to(device),
            torch.from_numpy(positions).to(device),
            self.cache,
            additive_mask(torch.from_numpy(visible), self.dtype, device),  # [B, 1, S, width + S]
        )
        if not readout:
            self.head(*inputs)
            return {b: (None, list(range(width, width + len(f[0]))), None) for b, f in feeds.items()}
        out, values, top = draft_step(self.head)(*inputs, self.rows[0].k_read)  # [B, S, H], [B, S, k], [B, S, k]
        values, top = values.tolist(), top.tolist()  # one copy each for every row
        return {
            b: (out[b, :n], list(range(width, width + n)), list(zip(top[b][:n], values[b][:n])))
            for b, n in ((b, len(f[0])) for b, f in feeds.items())
        }

    @torch.no_grad()
    def propose(self, states: list[DecodeState], max_tokens: list[int], active: list[bool]) -> list[Draft]:
        rows = self.rows
        drafts = [Draft() for _ in rows]
        live = [b for b, d in enumerate(rows) if active[b] and d.pending is not None and max_tokens[b] >= 1]
        if not live:
            return drafts
        self.cols = pack_columns(self.cache, self.cols)  # each row's entries at columns 0..n_b - 1
        pending, prompts = {}, {}
        for b in live:  # the pairs committed since the last step, a causal run after the row's earlier pairs
            toks, f = rows[b].take_pending()
            if not self.cols[b] and len(toks) > 1:  # a prompt's pairs: no read-out but the last one's (as one row)
                skip = rows[b].window_prompt(len(toks) - 1)  # the latest pairs only, at their text positions
                prompts[b] = (toks[skip:-1], f[skip:-1])
                toks, f = toks[-1:], f[-1:]
            pending[b] = (toks, f)
        for part, readout in ((prompts, False), (pending, True)):
            if not part:
                continue
            width = cache_length(self.cache)
            at = {b: len(self.cols[b]) + rows[b].skipped for b in part}  # each row's first text position fed
            feeds = {
                b: (
                    toks,
                    f,
                    list(range(at[b], at[b] + len(toks))),
                    self.cols[b],
                    [[width + j for j in range(i)] for i in range(len(toks))],
                )
                for b, (toks, f) in part.items()
            }
            outs = self._forward(feeds, readout)
            if not readout:
                for b in part:
                    self.cols[b] += outs[b][1]
        trees, committed = {}, {}
        for b in live:
            self.cols[b] += outs[b][1]
            committed[b] = len(self.cols[b])
            trees[b] = self.grow(rows[b], outs[b][0][-1], min(rows[b].levels, max_tokens[b]))
        for b in live:
            trees[b].start(outs[b][2][-1])  # the root's candidates: the last pending pair's read-out
        slots = {b: [] for b in live}  # row b's draft entries' columns, by slot
        while True:
            feeds = {}
            for b in live:
                step = trees[b].next_inputs()
                if step is None:
                    continue
                tokens, f, ancestors = step
                seen = [[slots[b][s] for s in anc] for anc in ancestors]  # besides the committed pairs
                position = committed[b] + rows[b].skipped - 1 + trees[b].depth - 1  # the text's (HEAD_CONTEXT)
                feeds[b] = (tokens, f, [position] * len(tokens), self.cols[b], seen)
            if not feeds:
                break
            outs = self._forward(feeds)
            for b in feeds:
                out, cols, tops = outs[b]
                slots[b] += cols
                trees[b].absorb(out, tops)
        for b in live:
            drafts[b] = rows[b].finish(trees[b].draft())
        return drafts
