"""What both lookahead variants share (lookahead.py, lookahead_glance.py): the n-gram pool, the settings check and
feeding the committed text's n-grams to the pool."""

from __future__ import annotations

from collections import OrderedDict

from engine.drafters.base import DecodeState, Drafter
from engine.errors import GlanceError


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


# Tokens a batch's verifying forward may carry under the cost-aware budget before lookahead shrinks its rows'
# windows (`NgramDrafter.fit_batch`). Measured on the bundled target (bf16, compiled, 16 suite prompts, 32 tokens):
# the default 4/5/4 (33 tokens a row) ran 1.72x at B = 1 but 0.81x at B = 4 (132 tokens a forward); 3/4/3 (19 a
# row, 76 a forward) 1.02x and 2/4/2 (13, 52) 1.07x at B = 4, with 1.75-1.78x at B = 1: a step verifies little
# more than 2 tokens either way, and past about 64 tokens this CPU's forward stops being memory bound.
BATCH_TOKENS = 64


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
        """Tokens one row adds to a verifying forward at most: the pending one, the window's N - 1 levels of W
        columns, and G guesses of N - 1 tokens."""
        return 1 + (self.ngram - 1) * (self.window + self.guesses)

    def fit_batch(self, rows: int, tokens: int = BATCH_TOKENS) -> None:
        """Shrink N, then W or G (the larger first), until `rows` rows fit in `tokens` tokens per forward. Exactness
        is untouched: only the window's and the guesses' sizes change, as with any other setting."""
        while rows * self.row_tokens() > tokens:
            if self.ngram > 4 or (self.ngram > 3 and max(self.window, self.guesses) <= 2):
                self.ngram -= 1
            elif max(self.window, self.guesses) > 1:
                if self.window >= self.guesses:
                    self.window -= 1
                else:
                    self.guesses -= 1
            elif self.ngram > 2:
                self.ngram -= 1
            else:
                break  # W 1, N 2, G 1: as small as a lookahead step gets
        self.extra_positions = self.window + self.ngram
        self.reset()

    def _feed_context(self, state: DecodeState) -> None:
        """Pool the n-grams of committed text not yet seen (the reference's POOL_FROM_PROMPT)."""
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
