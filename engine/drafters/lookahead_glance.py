"""Glance's own lookahead variant (`--lookahead-variant glance`), kept beside the reference algorithm
(`lookahead.py`) because it measured faster on this project's CPU (docs/METHODS.md).

Same two branches in one forward as the reference. It differs in four ways:
- the window has N - 1 full levels of W guessed tokens; token (level l, column c) sits at root + 1 + c + l, so no
  column is keyed by the pending token;
- the window starts as one level of W random prompt tokens and grows a level per step, without sliding, until it
  has N - 1; n-grams are harvested once it is full;
- the pool keeps up to `pool_capacity` (8) n-grams per key, least recently used evicted, and an accepted n-gram
  counts as used; each step verifies the G most recently used of the pending token's;
- verification starts at the first step (the prompt's n-grams are pooled at once), not when the window is full.
Exactness is the same: the side branch never sees the trie nor the trie the side branch, and compaction drops the
window from the cache.
"""

from __future__ import annotations

import random

import torch

from engine.drafters.base import DecodeState, side_guesses
from engine.drafters.ngram_pool import NgramDrafter, NgramPool
from engine.errors import GlanceError
from engine.tree import Draft, ngram_trie

# Its defaults, chosen by measurement on this project's 2-core Xeon (bf16, bundled target, 12 suite prompts x 48
# tokens, greedy, 2 repeats interleaved per prompt), W/N/G: tau, speedup over plain decoding: 3/4/3 2.20 1.88x,
# 4/4/4 2.32 1.81x, 5/4/5 2.34 1.81x, 5/5/5 2.56 1.92x, 4/5/4 2.54 2.02x. A first single pass (no repeats) also had
# 4/3/4 2.06, 5/3/5 2.08, 6/5/6 2.53, 5/5/8 2.58, 3/2/3 1.64; without context n-grams 4/3/4 1.86 and 5/4/5 2.00.
DEFAULT_WINDOW = 4
DEFAULT_NGRAM = 5
DEFAULT_GUESSES = 4
DEFAULT_POOL_CAPACITY = 8


def window_layout(levels: int, width: int) -> tuple[list[int], torch.Tensor]:
    """Offsets from the root and the [L*W, L*W] visibility of a window of `levels` x `width` tokens, flattened
    level by level: (l, c) sits at 1 + c + l and sees (0, c') for c' <= c and (l', c) for 1 <= l' <= l."""
    m = levels * width
    offsets = [1 + c + lvl for lvl in range(levels) for c in range(width)]
    visible = torch.zeros(m, m, dtype=torch.bool)
    for lvl in range(levels):
        for c in range(width):
            row = lvl * width + c
            visible[row, : c + 1] = True  # the oldest level up to this column
            for up in range(1, lvl + 1):
                visible[row, up * width + c] = True  # this column in the newer levels, itself included
    return offsets, visible


class GlanceLookaheadDrafter(NgramDrafter):
    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        ngram: int = DEFAULT_NGRAM,
        guesses: int = DEFAULT_GUESSES,
        pool_capacity: int = DEFAULT_POOL_CAPACITY,
        context_ngrams: bool = True,
        seed: int = 0,
    ) -> None:
        if pool_capacity < 1:
            raise GlanceError(f"the n-gram pool capacity must be at least 1 (got {pool_capacity})")
        self.pool_capacity = pool_capacity
        super().__init__(window, ngram, guesses, context_ngrams, seed)

    def reset(self) -> None:
        self.pool = NgramPool(self.pool_capacity)
        self.levels: list[list[int]] = []
        self.layout: dict[int, tuple[list[int], torch.Tensor]] = {}
        self._fed = 0  # committed tokens already fed to the pool
        self._reset_guesses()

    def begin(self, state: DecodeState) -> None:
        rng = random.Random(self.seed)
        prompt = state.tokens[: state.prompt_len]
        self.levels = [[rng.choice(prompt) for _ in range(self.window)]]
        self._fed = 0
        self._feed_context(state)

    def pooled(self, root: int) -> list[tuple[int, ...]]:
        return self.pool.recent(root, self.guesses)

    @torch.no_grad()
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        if self.guesses == 0:  # nothing would ever be verified: plain decoding, no window either
            return Draft()
        if max_tokens == 0:  # a plain step (the budget's, or the run's last token): no window
            return self.plain_step(state)
        conts = self.pooled(state.tokens[-1])
        conts = [c[:max_tokens] for c in conts]
        tokens, parents, _ = ngram_trie(conts)
        levels = len(self.levels)
        if levels not in self.layout:
            self.layout[levels] = window_layout(levels, self.window)
        offsets, visible = self.layout[levels]
        meta = {
            "window": [list(level) for level in self.levels],
            "ngrams": [[state.tokens[-1], *c] for c in conts],
            "pool_size": len(self.pool),
        }
        side = [tok for level in self.levels for tok in level]
        return Draft(tokens, parents, meta=meta, side_tokens=side, side_offsets=offsets, side_visible=visible)

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        if not draft.side_tokens:  # a plain step: the window waits, the pool takes the committed text
            self._feed_context(state)
            return
        width, levels = self.window, len(self.levels)
        guesses = side_guesses(state)[(levels - 1) * width : levels * width]  # the newest level's outputs
        if levels == self.ngram - 1:  # full window: harvest one n-gram per column, then slide
            for c in range(width):
                self.pool.add(tuple(level[c] for level in self.levels) + (guesses[c],))
            self.levels = self.levels[1:] + [guesses]
        else:
            self.levels.append(guesses)
        if accepted:  # the accepted n-gram proved useful: keep it
            path = tuple(draft.tokens[i] for i in accepted)
            for gram in draft.meta.get("ngrams", []):
                if tuple(gram[1 : 1 + len(path)]) == path:
                    self.pool.touch(gram[0], tuple(gram[1:]))
        self._feed_context(state)

    def settings(self) -> dict:
        return {"variant": "glance", "pool_capacity": self.pool_capacity, **super().settings()}
