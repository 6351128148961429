"""Lookahead decoding (Fu et al. 2024), as LookaheadDecoding (hao-ai-lab) defines it: no draft model, no training.

Each step is one target forward over two branches.

The lookahead branch is a 2D window of N - 1 levels and W columns. Level l, column c sits at position
root + c + l; level 0, column 0 is the pending token itself (the root), so the window stores W - 1 tokens on
level 0 and W on each level after it. A token sees level 0 up to its column and its own column on levels 1..l,
so every column reads as one contiguous guessed continuation. The newest level's outputs are the next Jacobi
guesses; with them each column yields an N-gram, pooled under its level-0 token: column 0's under the pending
token. Then the window slides one position: the oldest level goes, the next one drops its column 0 (which now
lies under the new pending token) and the guesses become the newest level.

The window starts as one level of W + N - 3 random prompt tokens. While it fills (N - 2 steps) every level slides
one column per step and the newest level's outputs become a new level, so it reaches W - 1 + (N - 2) W tokens.

The verification branch holds every pooled N-gram keyed by the pending token (the pool keeps at most G per key,
least recently added dropped first), merged into a trie and verified like any draft tree (deterministic
candidates, q = 1). It runs once the window is full. With `context_ngrams` on (the reference's
POOL_FROM_PROMPT) the pool also takes the N-grams of the prompt and of every committed token.

Differences from the reference, none of which changes which tokens are emitted: pooled N-grams sharing a prefix
are merged into one trie instead of verified as separate branches (fewer tokens in the forward); G = 0 drops the
window too (nothing would be verified: plain decoding); EOS guesses in the window are kept (the reference swaps
them for prompt tokens); N = 2 (which the reference does not run) keeps a one-level window with no column under
the pending token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from engine.decoding.tree import Draft, ngram_trie
from engine.drafters.base import DecodeState, Drafter, side_guesses
from engine.drafters.ngram_pool import WINDOW_MARGIN, NgramPool, expected_tau, row_tokens
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, knob
from engine.errors import GlanceError
from engine.records.events import DraftNotes

# Chosen by measurement on this project's 2-core Xeon (docs/METHODS.md): 4/5/4 was the fastest of eight W/N/G
# tried. The reference's 7B suggestion (W 7, N 5, G 7) and the paper's (W 15, N 5, G 15) were tuned on GPUs, where
# a wide forward is nearly free.
DEFAULT_WINDOW = 4
DEFAULT_NGRAM = 5
DEFAULT_GUESSES = 4


def window_cells(sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(level, column) of each stored window token, level by level: level 0 holds columns 1..sizes[0] (its column
    0 is the pending token), every later level columns 0..size - 1."""
    return [(lvl, c + (lvl == 0)) for lvl, size in enumerate(sizes) for c in range(size)]


def window_layout(sizes: tuple[int, ...]) -> tuple[list[int], torch.Tensor]:
    """Offsets from the root and the [m, m] visibility of a window with `sizes[l]` tokens on level l: (l, c) sits
    at c + l and sees (0, c') for 1 <= c' <= c and (l', c) for 1 <= l' <= l (the root it always sees)."""
    cells = window_cells(sizes)
    offsets = [c + lvl for lvl, c in cells]
    visible = torch.zeros(len(cells), len(cells), dtype=torch.bool)
    for row, (lvl, c) in enumerate(cells):
        for col, (lvl2, c2) in enumerate(cells):
            visible[row, col] = (lvl2 == 0 and c2 <= c) or (1 <= lvl2 <= lvl and c2 == c)
    return offsets, visible


class LookaheadRow:
    """One row's lookahead: its window, its n-gram pool, and the plain steps' notes for the window's budget."""

    def __init__(self, d: LookaheadDrafter) -> None:
        self.d = d
        self.pool = NgramPool(d.guesses)
        self.levels: list[list[int]] = []
        self.root = -1  # the pending token of the step in flight: the key of window column 0
        self.fed = 0  # committed tokens already fed to the pool
        self.unresolved: list[tuple[int, list[tuple[int, ...]]]] = []  # plain steps' (position, pooled guesses)
        self.guessed: list[int] = []  # ... scored once committed (LookaheadDrafter.take_guessed)

    @property
    def full(self) -> bool:
        return len(self.levels) == self.d.ngram - 1

    def begin(self, state: DecodeState) -> None:
        rng = random.Random(self.d.seed)
        prompt = state.tokens[: state.prompt_len]
        seeded = max(1, self.d.window + self.d.ngram - 3)
        self.levels = [[rng.choice(prompt) for _ in range(seeded)]]
        self.feed_context(state)

    def pooled(self, root: int) -> list[tuple[int, ...]]:
        return self.pool.lookup(root) if self.full else []

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        if max_tokens == 0:  # a plain step (the budget's, or the run's last token): no window
            # note what the pool holds for the pending token (full window or not: a window step fills it), so the
            # committed text tells the budget what a window step would have got
            self.unresolved.append((len(state.tokens), self.pool.lookup(state.tokens[-1])))
            return Draft()
        self.root = state.tokens[-1]
        conts = [c[:max_tokens] for c in self.pooled(self.root)]
        tokens, parents, _ = ngram_trie(conts)
        offsets, visible = self.d.layout(tuple(map(len, self.levels)))
        notes = DraftNotes(
            window=[list(level) for level in self.levels],
            ngrams=[[self.root, *c] for c in conts],
            pool_size=len(self.pool),
        )
        side = [tok for level in self.levels for tok in level]
        return Draft(tokens, parents, notes=notes, side_tokens=side, side_offsets=offsets, side_visible=visible)

    def update(self, state: DecodeState, draft: Draft) -> None:
        if not draft.side_tokens:  # a plain step: the window waits, the pool takes the committed text
            self.feed_context(state)
            return
        newest = self.levels[-1]
        guesses = side_guesses(state)[len(draft.side_tokens) - len(newest) :]  # one per column
        if self.full:
            self.harvest(guesses)
            if len(self.levels) == 1:  # N = 2: the guesses sit one position on, on level 0's columns
                self.levels = [guesses]
            else:  # slide: the oldest level goes, the next drops its column 0 (under the new pending token)
                self.levels = [self.levels[1][1:], *self.levels[2:], guesses]
        elif len(self.levels) == 1:  # filling: every level slides one column, the guesses become a level
            self.levels = [self.levels[0][1:], guesses]
        else:
            self.levels = [level[1:] for level in self.levels] + [guesses[1:]]
        self.feed_context(state)

    def harvest(self, guesses: list[int]) -> None:
        """Pool each column of the full window with its new guess as an N-gram, keyed by its level-0 token."""
        if len(self.levels) == 1:
            for first, guess in zip(self.levels[0], guesses):
                self.pool.add((first, guess))
            return
        level0 = [self.root, *self.levels[0]]
        for c, guess in enumerate(guesses):
            self.pool.add((level0[c], *(level[c] for level in self.levels[1:]), guess))

    def feed_context(self, state: DecodeState) -> None:
        """Pool the n-grams of committed text not yet seen (the reference's POOL_FROM_PROMPT); score the plain steps'
        notes whose guesses' positions are all committed now (every update passes here)."""
        toks, n = state.tokens, self.d.ngram
        while self.unresolved and self.unresolved[0][0] + n - 1 <= len(toks):
            at, conts = self.unresolved.pop(0)
            best = 0
            for cont in conts:  # the longest common prefix of a pooled guess with the committed text
                k = 0
                while k < len(cont) and cont[k] == toks[at + k]:
                    k += 1
                best = max(best, k)
            self.guessed.append(best)
        if not self.d.context_ngrams:
            return
        for start in range(max(0, self.fed - n + 1), len(toks) - n + 1):
            self.pool.add(tuple(toks[start : start + n]))
        self.fed = len(toks)


class LookaheadDrafter(Drafter):
    """Lookahead for every row of a run: each row's window and pool are its own (`LookaheadRow`); drafting is n-gram
    bookkeeping on the host, and the window rides in the verifying forward the loop runs for all rows at once."""

    name = "lookahead"

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        ngram: int = DEFAULT_NGRAM,
        guesses: int = DEFAULT_GUESSES,
        context_ngrams: bool = True,
        seed: int = 0,
    ) -> None:
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
        self.layouts: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.rows = [LookaheadRow(self) for _ in range(rows)]

    def begin(self, row: int, state: DecodeState) -> None:
        self.rows[row] = LookaheadRow(self)
        self.rows[row].begin(state)

    def layout(self, sizes: tuple[int, ...]) -> tuple[list[int], torch.Tensor]:
        """Offsets and visibility of a window with these level sizes, made once per shape."""
        if sizes not in self.layouts:
            self.layouts[sizes] = window_layout(sizes)
        return self.layouts[sizes]

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        if self.guesses == 0:  # nothing would ever be verified: plain decoding, no window either
            return [Draft() for _ in states]
        return [r.propose(s, m) if s is not None else Draft() for r, s, m in zip(self.rows, states, max_tokens)]

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        self.rows[row].update(state, draft)

    def row_tokens(self) -> int:
        """Tokens a row adds to a verifying forward at most (`row_tokens` of its settings)."""
        return row_tokens(self.window, self.ngram, self.guesses)

    def take_guessed(self) -> list[int]:
        """For each plain step of row 0 whose text has been committed since the last call: how many tokens its
        pooled n-grams guessed right. It understates a window step's gain: the window's own n-grams are missing."""
        guessed, self.rows[0].guessed = self.rows[0].guessed, []
        return guessed

    def shrunk(self) -> list[tuple[int, int, int]]:
        """(W, N, G) from the settings down to (1, 3, 1), one shrink at a time: N first (down to 4, then to 3 once W
        and G are at most 2), then the larger of W and G. Not down to N = 2 (one guessed token a column): 1/2/1 lost
        to 1/3/1 in every measurement, while the log fit of tau rates the two within a few percent."""
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

    def fit_window(self, rows: int, forward_costs) -> None:
        """Under a cost-aware budget, before a run: the one of `shrunk()` with the most expected tokens per second,
        `expected_tau` of its width over the target's forward cost measured at `rows` rows (`forward_costs(widths)`:
        {tokens a row: seconds}); for one row, a larger one than the smallest only where it rates WINDOW_MARGIN above
        it. Exactness is untouched: only the window's and the guesses' sizes change, as with any setting."""
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
        self.reset(len(self.rows))

    def settings(self) -> dict:
        return {
            "window": self.window,
            "ngram": self.ngram,
            "guesses": self.guesses,
            "context_ngrams": self.context_ngrams,
        }


@dataclass
class LookaheadOptions:
    window: int = knob(
        DEFAULT_WINDOW,
        "W: window width (Jacobi guesses per level); under the auto draft budget W/N/G are the most a run may use: "
        "it shrinks them to what the measured forward pays for",
        lo=1,
        hi=32,
        label="W",
    )
    ngram: int = knob(DEFAULT_NGRAM, "N: n-gram size (the window keeps N - 1 levels)", lo=2, hi=8, label="N")
    guesses: int = knob(
        DEFAULT_GUESSES,
        "G: n-grams kept per key, all verified when the key is pending (0: plain decoding)",
        lo=0,
        hi=32,
        label="G",
    )
    context: bool = knob(
        True,
        "also pool the n-grams of the prompt and the committed text (--no-context-ngrams: Jacobi n-grams only)",
        flag="--no-context-ngrams",
        label="pool prompt and output n-grams",
    )


def build(ctx: BuildContext) -> LookaheadDrafter:
    o = ctx.options
    return LookaheadDrafter(
        window=o.window,
        ngram=o.ngram,
        guesses=o.guesses,
        context_ngrams=o.context,
    )


SPEC = DrafterSpec(
    name="lookahead",
    label="lookahead",
    color="#ba68c8",
    summary="Jacobi iteration over a 2D window fills an n-gram pool; pooled n-grams are verified (Fu et al. 2024)",
    build=build,
    options=LookaheadOptions,
    # its drafts are n-gram lookups, nearly free to make: no depth cap; the budget sizes and gates its window instead
    budget=BudgetTraits(depth_cap="never", window=True),
)
