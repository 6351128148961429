"""Lookahead's n-gram pool, and what a window of a given size is expected to earn (the cost-aware window fit)."""

from __future__ import annotations

import math
from collections import OrderedDict


class NgramPool:
    """N-grams keyed by their first token; per key at most `capacity` continuations in order of addition. Adding
    one already there moves it to the newest end; a full key drops its oldest (the reference's token_map)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.by_key: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_key.values())

    def add(self, gram: tuple[int, ...]) -> None:
        """Insert (or refresh) an n-gram given as (first token, continuation...)."""
        key, rest = gram[0], tuple(gram[1:])
        if not rest or self.capacity <= 0:
            return
        bucket = self.by_key.setdefault(key, OrderedDict())
        if rest in bucket:
            bucket.move_to_end(rest)
            return
        bucket[rest] = None
        if len(bucket) > self.capacity:
            bucket.popitem(last=False)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """Every continuation pooled under `key`, oldest first."""
        return list(self.by_key.get(key, ()))


# Tokens per step a lookahead row expects from the tokens it adds to a forward (w): a + b ln w, the lookahead paper's
# scaling (steps fall linearly in the log of a step's FLOPs), fitted on the bundled target, greedy, one row, float32,
# at the benchmark's lengths: 8 suite prompts at 64 tokens (w = 33 (the default 4/5/4) 2.94, 25 2.68, 19 2.64, 13
# 2.42, 9 2.14, 7 2.10, 5 (1/3/1) 2.00, 3 (1/2/1) 1.60) and the 4 off-suite prompts at 128 (3.39, 3.10, 3.07, 2.99,
# 2.47, 2.39, 2.24, 1.69); the fit is within 0.25 of each. (The earlier fit, 1.29 + 0.22 ln w from 32-token rows at
# B = 2 to 8, sat below both: the n-gram pool fills as a run goes on.) Before a run under the cost-aware budget, a
# row keeps the window with the most expected tokens per second of the target's measured forward
# (`LookaheadDrafter.fit_window`): on the AVX2 EPYC, where 33 tokens cost 4.4 one-token forwards, 1/3/1 (off the suite
# 1.68x of plain decoding against 0.97x for 4/5/4; on the suite 1.48x against 0.88x).
TAU_FIT = (1.07, 0.60)
# A larger window than the smallest stage (1/3/1) must rate this share above it: the fit is within 0.25 tokens a
# step, and a larger window's forward costs more in a decode than measured alone (the window's mask, its n-gram
# bookkeeping). Once the compiled target ran forwards of five to 16 tokens in a graph traced at 16
# (engine/runtime/forward.py:
# SEVERAL_TOKENS), 2/3/2 (nine tokens, 6.65 ms a forward in a decode against 5.3-5.9 for 1/3/1's four) rated 5% above
# 1/3/1 and ran off the suite at 0.89-1.15x of plain decoding where 1/3/1 ran 1.59-1.61x (bf16 EPYC, interleaved,
# three rounds). Where a forward costs about the same at every width (a GPU), 4/5/4 rates 50% above 1/3/1. One row
# only: batches' windows were measured without it (the sweep), and nothing here measured them again.
WINDOW_MARGIN = 0.15


def row_tokens(window: int, ngram: int, guesses: int) -> int:
    """Tokens a lookahead row adds to a verifying forward at most: the pending one, the window's N - 1 levels of W
    columns, and G guesses of N - 1 tokens."""
    return 1 + (ngram - 1) * (window + guesses)


def expected_tau(width: int) -> float:
    """Tokens per step expected of a lookahead row that adds `width` tokens to the verifying forward."""
    a, b = TAU_FIT
    return a + b * math.log(width)
