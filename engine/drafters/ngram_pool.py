"""What both lookahead variants share (lookahead.py, lookahead_glance.py): the n-gram pool, the settings check and
feeding the committed text's n-grams to the pool."""

from __future__ import annotations

import math
from collections import OrderedDict

from engine.budget import FullBudget
from engine.drafters.base import DecodeState, Drafter, ForwardCosts
from engine.errors import GlanceError
from engine.tree import Draft
from engine.window_budget import WindowBudget


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

    def touch(self, key: int, rest: tuple[int, ...]) -> None:
        """Count a continuation as used: it moves to the newest end (Glance's variant, after an acceptance)."""
        bucket = self.by_key.get(key)
        if bucket is not None and rest in bucket:
            bucket.move_to_end(rest)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """Every continuation pooled under `key`, oldest first."""
        return list(self.by_key.get(key, ()))

    def recent(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """Up to `limit` continuations of `key`, newest first."""
        return self.lookup(key)[::-1][: max(limit, 0)]


# Tokens per step a lookahead row expects from the tokens it adds to a forward (w): a + b ln w, the lookahead paper's
# scaling (steps fall linearly in the log of a step's FLOPs), fitted on the bundled target, greedy, one row, float32,
# at the benchmark's lengths: 8 suite prompts at 64 tokens (w = 33 (the default 4/5/4) 2.94, 25 2.68, 19 2.64, 13
# 2.42, 9 2.14, 7 2.10, 5 (1/3/1) 2.00, 3 (1/2/1) 1.60) and the 4 off-suite prompts at 128 (3.39, 3.10, 3.07, 2.99,
# 2.47, 2.39, 2.24, 1.69); the fit is within 0.25 of each. (The earlier fit, 1.29 + 0.22 ln w from 32-token rows at
# B = 2 to 8, sat below both: the n-gram pool fills as a run goes on.) Before a run under the cost-aware budget, a
# row keeps the window with the most expected tokens per second of the target's measured forward
# (`NgramDrafter.fit_batch`): on the AVX2 EPYC, where 33 tokens cost 4.4 one-token forwards, 1/3/1 (off the suite
# 1.68x of plain decoding against 0.97x for 4/5/4; on the suite 1.48x against 0.88x).
TAU_FIT = (1.07, 0.60)
# A larger window than the smallest stage (1/3/1) must rate this share above it: the fit is within 0.25 tokens a
# step, and a larger window's forward costs more in a decode than measured alone (the window's mask, its n-gram
# bookkeeping). Once the compiled target ran forwards of five to 16 tokens in a graph traced at 16 (engine/forward.py:
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


class NgramDrafter(Drafter):
    """A lookahead drafter's settings (W columns, N-grams, G guesses) and its pool of the committed text's n-grams;
    subclasses build the window and the pool in `reset`."""

    name = "lookahead"
    budgeted = False  # its drafts are n-gram lookups: nearly free to make, cheap to verify

    def __init__(self, window: int, ngram: int, guesses: int, context_ngrams: bool, seed: int) -> None:
        if window < 1:
            raise GlanceError(f"the lookahead window must be at least 1 (got {window})")
        if ngram < 2:
            raise GlanceError(f"the lookahead n-gram size must be at least 2 (got {ngram})")
        if guesses < 0:
            raise GlanceError(f"lookahead guesses must be >= 0 (got {guesses})")
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self.extra_positions = window + ngram  # window tokens sit at most W + N - 2 past the pending one
        self.context_ngrams = context_ngrams
        self.seed = seed
        self.reset()  # the subclass's pool, window and fed count

    def row_tokens(self) -> int:
        """Tokens this row adds to a verifying forward at most (`row_tokens` of its settings)."""
        return row_tokens(self.window, self.ngram, self.guesses)

    def shrunk(self) -> list[tuple[int, int, int]]:
        """(W, N, G) from the settings down to (1, 3, 1), one shrink at a time: N first (down to 4, then to 3 once W
        and G are at most 2), then the larger of W and G. Not down to N = 2 (one guessed token a column): 1/2/1 lost
        to 1/3/1 in every measurement (one row on the AVX2 EPYC 1.27-1.39x against 1.48-1.68x, B = 8 on the AMX
        Xeon 1.02x against 1.04x), while the log fit of tau rates the two within a few percent, so on the EPYC's
        measured costs the choice between them was a coin toss."""
        w, n, g = self.window, self.ngram, self.guesses
        stages = [(w, n, g)]
        while True:
            if n > 4 or (n > 3 and max(w, g) <= 2):
                n -= 1
            elif max(w, g) > 1:
                w, g = (w - 1, g) if w >= g else (w, g - 1)
            else:
                return stages
            stages.append((w, n, g))

    def fit_batch(self, rows: int, forward_costs: ForwardCosts) -> None:
        """The one of `shrunk()` with the most expected tokens per second: `expected_tau` of its tokens a row over
        the target's forward cost measured at `rows` rows (`forward_costs(widths)`: {tokens a row: seconds}); for one
        row, a larger one than the smallest only where it rates WINDOW_MARGIN above it (not batches). Where
        the forward costs about the same at every width (a GPU) that is the whole window; on this CPU at B = 4 a
        small one. Exactness is untouched: only the window's and the guesses' sizes change, as with any setting."""
        stages = self.shrunk()
        width = {s: row_tokens(*s) for s in stages}
        costs = forward_costs(sorted(set(width.values())))
        if not costs:
            return
        rate = {s: expected_tau(width[s]) / costs[width[s]] for s in stages}
        floor = rate[stages[-1]] * (1 + (WINDOW_MARGIN if rows == 1 else 0.0))  # a larger window's bar
        larger = [s for s in stages[:-1] if rate[s] >= floor]
        best = max(larger, key=rate.get) if larger else stages[-1]  # the first (largest) of ties
        self.window, self.ngram, self.guesses = best
        self.extra_positions = self.window + self.ngram
        self.reset()

    def budget_for(self, budget: FullBudget | None) -> FullBudget:
        """Under a cost-aware budget, a `WindowBudget`: each step runs the window or decodes plain, whichever has
        paid more in this run (no depth cap reaches the window). One row only: batches run their windows every step."""
        if budget is None or budget.name == "full":
            return FullBudget()
        return WindowBudget(width=self.row_tokens, guessed=self.take_guessed)

    def _reset_guesses(self) -> None:
        """Forget the plain steps' notes (a subclass's `reset` calls it)."""
        self._unresolved: list[tuple[int, list[tuple[int, ...]]]] = []  # plain steps' (position, pooled guesses)
        self.guessed: list[int] = []  # ... scored once committed (take_guessed)

    def pooled(self, root: int) -> list[tuple[int, ...]]:
        """The pooled continuations a window step would verify with `root` pending (the subclass's rule)."""
        raise NotImplementedError

    def plain_step(self, state: DecodeState) -> Draft:
        """No window this step (a budget's plain step): note what the pool holds for the pending token, so that the
        committed text tells how many tokens a window step would have got from it (`take_guessed`)."""
        self._unresolved.append((len(state.tokens), self.pooled(state.tokens[-1])))
        return Draft()

    def take_guessed(self) -> list[int]:
        """For each plain step whose text has been committed since the last call: how many tokens its pooled
        n-grams guessed right (the longest common prefix with the committed text). It understates a window step's
        gain: the window's own n-grams of the stretch are missing."""
        guessed, self.guessed = self.guessed, []
        return guessed

    def _settle_guesses(self, tokens: list[int]) -> None:
        """Score the plain steps' notes whose guesses' positions are all committed now."""
        while self._unresolved and self._unresolved[0][0] + self.ngram - 1 <= len(tokens):
            at, conts = self._unresolved.pop(0)
            best = 0
            for cont in conts:
                n = 0
                while n < len(cont) and cont[n] == tokens[at + n]:
                    n += 1
                best = max(best, n)
            self.guessed.append(best)

    def _feed_context(self, state: DecodeState) -> None:
        """Pool the n-grams of committed text not yet seen (the reference's POOL_FROM_PROMPT); score the plain steps'
        guesses that are due (every update passes here)."""
        self._settle_guesses(state.tokens)
        if not self.context_ngrams:
            return
        toks, n = state.tokens, self.ngram
        for start in range(max(0, self._fed - n + 1), len(toks) - n + 1):
            self.pool.add(tuple(toks[start : start + n]))
        self._fed = len(toks)

    def settings(self) -> dict:
        return {
            "window": self.window,
            "ngram": self.ngram,
            "guesses": self.guesses,
            "context_ngrams": self.context_ngrams,
            "pool_size": len(self.pool),  # hit and guess rates: engine/stats.py, from the step events
        }
