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

The earlier Glance variant (`lookahead_glance.py`, `--lookahead-variant glance`) keys no column to the pending
token, seeds W tokens, grows levels without sliding, keeps 8 N-grams per key and verifies the G most recent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from engine.drafters.base import DecodeState, Drafter, side_guesses
from engine.drafters.lookahead_glance import GlanceLookaheadDrafter
from engine.drafters.ngram_pool import NgramDrafter, NgramPool
from engine.drafters.spec import BuildContext, DrafterSpec, knob
from engine.tree import Draft, ngram_trie

# Chosen by measurement on this project's 2-core Xeon (docs/METHODS.md): 4/5/4 was the fastest of eight W/N/G
# tried. The reference's 7B suggestion (W 7, N 5, G 7) and the paper's (W 15, N 5, G 15) were tuned on GPUs, where
# a wide forward is nearly free.
DEFAULT_WINDOW = 4
DEFAULT_NGRAM = 5
DEFAULT_GUESSES = 4
VARIANTS = ("reference", "glance")


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


class LookaheadDrafter(NgramDrafter):
    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        ngram: int = DEFAULT_NGRAM,
        guesses: int = DEFAULT_GUESSES,
        context_ngrams: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(window, ngram, guesses, context_ngrams, seed)

    def reset(self) -> None:
        self.pool = NgramPool(self.guesses)
        self.levels: list[list[int]] = []
        self.layout: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}
        self._root = -1  # the pending token of the step in flight: the key of window column 0
        self._fed = 0  # committed tokens already fed to the pool
        self._reset_guesses()

    @property
    def full(self) -> bool:
        return len(self.levels) == self.ngram - 1

    def begin(self, state: DecodeState) -> None:
        rng = random.Random(self.seed)
        prompt = state.tokens[: state.prompt_len]
        seeded = max(1, self.window + self.ngram - 3)
        self.levels = [[rng.choice(prompt) for _ in range(seeded)]]
        self._fed = 0
        self._feed_context(state)

    def pooled(self, root: int) -> list[tuple[int, ...]]:
        return self.pool.lookup(root) if self.full else []

    @torch.no_grad()
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        if self.guesses == 0:  # nothing would ever be verified: plain decoding, no window either
            return Draft()
        if max_tokens == 0:  # a plain step (the budget's, or the run's last token): no window
            return self.plain_step(state)
        self._root = state.tokens[-1]
        conts = self.pooled(self._root)
        conts = [c[:max_tokens] for c in conts]
        tokens, parents, _ = ngram_trie(conts)
        sizes = tuple(map(len, self.levels))
        if sizes not in self.layout:
            self.layout[sizes] = window_layout(sizes)
        offsets, visible = self.layout[sizes]
        meta = {
            "window": [list(level) for level in self.levels],
            "ngrams": [[self._root, *c] for c in conts],
            "pool_size": len(self.pool),
        }
        side = [tok for level in self.levels for tok in level]
        return Draft(tokens, parents, meta=meta, side_tokens=side, side_offsets=offsets, side_visible=visible)

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        if not draft.side_tokens:  # a plain step: the window waits, the pool takes the committed text
            self._feed_context(state)
            return
        newest = self.levels[-1]
        guesses = side_guesses(state)[len(draft.side_tokens) - len(newest) :]  # one per column
        if self.full:
            self._harvest(guesses)
            if len(self.levels) == 1:  # N = 2: the guesses sit one position on, on level 0's columns
                self.levels = [guesses]
            else:  # slide: the oldest level goes, the next drops its column 0 (under the new pending token)
                self.levels = [self.levels[1][1:], *self.levels[2:], guesses]
        elif len(self.levels) == 1:  # filling: every level slides one column, the guesses become a level
            self.levels = [self.levels[0][1:], guesses]
        else:
            self.levels = [level[1:] for level in self.levels] + [guesses[1:]]
        self._feed_context(state)

    def _harvest(self, guesses: list[int]) -> None:
        """Pool each column of the full window with its new guess as an N-gram, keyed by its level-0 token."""
        if len(self.levels) == 1:
            for first, guess in zip(self.levels[0], guesses):
                self.pool.add((first, guess))
            return
        level0 = [self._root, *self.levels[0]]
        for c, guess in enumerate(guesses):
            self.pool.add((level0[c], *(level[c] for level in self.levels[1:]), guess))

    def settings(self) -> dict:
        return {"variant": "reference", **super().settings()}


@dataclass
class LookaheadOptions:
    lookahead_window: int = knob(
        DEFAULT_WINDOW,
        "W: window width (Jacobi guesses per level); under the auto draft budget W/N/G are the most a run may use: "
        "it shrinks them to what the measured forward pays for",
        lo=1,
        hi=32,
        label="W",
    )
    lookahead_ngram: int = knob(DEFAULT_NGRAM, "N: n-gram size (the window keeps N - 1 levels)", lo=2, hi=8, label="N")
    lookahead_guesses: int = knob(
        DEFAULT_GUESSES,
        "G: n-grams kept per key, all verified when the key is pending (0: plain decoding)",
        lo=0,
        hi=32,
        label="G",
    )
    lookahead_variant: str = knob(
        "reference",
        "reference: LookaheadDecoding's algorithm; glance: Glance's earlier variant, faster here (docs/METHODS.md)",
        choices=VARIANTS,
        label="variant",
    )
    lookahead_context: bool = knob(
        True,
        "also pool the n-grams of the prompt and the committed text (--no-context-ngrams: Jacobi n-grams only)",
        flag="--no-context-ngrams",
        label="pool prompt and output n-grams",
    )


def build(ctx: BuildContext) -> Drafter:
    o = ctx.options
    if o.lookahead_variant == "glance":
        return GlanceLookaheadDrafter(
            window=o.lookahead_window,
            ngram=o.lookahead_ngram,
            guesses=o.lookahead_guesses,
            context_ngrams=o.lookahead_context,
        )
    return LookaheadDrafter(
        window=o.lookahead_window,
        ngram=o.lookahead_ngram,
        guesses=o.lookahead_guesses,
        context_ngrams=o.lookahead_context,
    )


SPEC = DrafterSpec(
    name="lookahead",
    label="lookahead",
    color="#ba68c8",
    summary="Jacobi iteration over a 2D window fills an n-gram pool; pooled n-grams are verified (Fu et al. 2024)",
    build=build,
    options=LookaheadOptions,
)
