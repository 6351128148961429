"""The drafter protocol: one small, batch-native interface every method implements, so the loop never branches on
the method. A drafter serves every row of a run: it proposes for all rows at once (one model call per depth where it
has a model), and one row is a batch of one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine.decoding.sampling import SamplingConfig
from engine.decoding.tree import Draft

# The latest positions a catch-up's hindsight reads: each costs a row of the vocabulary projection (Medusa's head 0,
# EAGLE's read-out, the draft model's LM head), and a probe after a long stretch of plain steps would read them all.
HINDSIGHT_ROWS = 24


@dataclass
class DecodeState:
    """What the loop shares with a drafter about one row. `tokens` are all committed tokens, prompt included; the
    last one is pending (the target has not cached it yet)."""

    tokens: list[int]
    prompt_len: int
    sampling: SamplingConfig
    generator: torch.Generator
    # The row's part of the target's latest forward, laid out as a batch of one (logits [1, S, V], hidden states,
    # and `layer_features`, the inputs [1, S, H] of the drafter's `feature_layers`), for drafters that read them.
    target_out: Any = None
    # After a verification step: the row of that forward that predicted each emitted token (0: the pending token).
    rows: list[int] = field(default_factory=list)
    # The side branch's rows of that forward's logits, [m, V] (lookahead's window), or None.
    side_logits: torch.Tensor | None = None
    # Those side rows' argmax tokens (lookahead's next guesses), read back with the verification's.
    side_best: list[int] | None = None
    # Per `Drafter.context_layers` layer, the target cache's (keys, values) [1, h, n, d] of the row's n committed
    # tokens (the pending one not yet cached), set by the loop before each `propose`: views, valid until the next step.
    context: list | None = None


def side_guesses(state: DecodeState) -> list[int]:
    """The argmax token of each side row of the latest verification (lookahead's window), read once per step."""
    if state.side_best is None:
        state.side_best = state.side_logits.float().argmax(-1).tolist()
    return state.side_best


Hindsight = tuple[list[bool], list[bool] | None]  # one row's catch-up: (guess matched, first choice matched)


class Drafter:
    """Base drafter: proposes nothing for any row, which is plain autoregressive decoding."""

    name = "ar"
    approximate = False  # True when its acceptance rule is not exact
    needs_hidden_states = False  # ask the target forward for hidden states
    feature_layers: tuple[int, ...] = ()  # decoder layers whose inputs the target forward captures (EAGLE-3)
    extra_positions = 0  # positions past the committed text a step may use (lookahead's window)
    context_layers: tuple[int, ...] = ()  # target cache layers whose committed keys and values it reads (Gemma 4's)

    def reset(self, rows: int) -> None:
        """A run of `rows` rows starts: forget the previous one."""
        self._caught_up: list[Hindsight] = []

    def begin(self, row: int, state: DecodeState) -> None:
        """Row `row` starts a prompt, right after its prefill (also when it takes a waiting prompt mid-run)."""

    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        """One draft per row, row b's at most `max_tokens[b]` deep (no path after the pending token longer: the
        tokens left, or the budget's cap; 0 asks for a plain step). `states[b]` None: the row is not decoding."""
        return [Draft() for _ in states]

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        """After verification; `state.tokens` already holds the accepted path and the bonus token."""

    def note_hindsight(self, matches: list[bool], first: list[bool] | None = None) -> None:
        """Record what a row's catch-up learned: whether the drafter's greedy guess matched the target's token at
        each committed position nobody drafted (a tree's drafter also says whether its first choice did)."""
        if matches:
            self._caught_up.append((matches, first))

    def hindsight(self) -> list[Hindsight]:
        """What the latest `propose` caught up on, per row that learned something; taken once. The budget reads it
        as acceptance it gets for free at steps nobody drafted (engine/budget). Greedy decoding only."""
        taken, self._caught_up = getattr(self, "_caught_up", []), []
        return taken

    def check_context(self, positions: int) -> None:
        """Raise GlanceError when a run of `positions` tokens is more than the drafter's own model can take."""

    def settings(self) -> dict:
        return {}
