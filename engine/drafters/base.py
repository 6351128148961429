"""The drafter protocol: one small interface every variant implements, so the loop never branches on the variant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.budget import FullBudget
from engine.sampling import SamplingConfig
from engine.tree import Draft

# The target's measured forward cost in a batch: {tokens a row: seconds} for the widths asked (engine/forward_timing.py)
ForwardCosts = Callable[[list[int]], dict[int, float]]
HINDSIGHT_ROWS = 24  # the latest positions a catch-up's hindsight reads (Drafter.hindsight_rows)


@dataclass
class DecodeState:
    """What the loop shares with its drafter. `tokens` are all committed tokens, prompt included; the last one is
    pending (the target has not cached it yet)."""

    tokens: list[int]
    prompt_len: int
    sampling: SamplingConfig
    generator: torch.Generator
    # Outputs of the target's latest forward (logits [1, S, V], hidden states, and `layer_features`, the inputs
    # [1, S, H] of the drafter's `feature_layers`) for drafters that read them.
    target_out: Any = None
    # After a verification step: the row of that forward that predicted each emitted token (0: the pending token).
    rows: list[int] = field(default_factory=list)
    # The side branch's rows of that forward's logits, [m, V] (lookahead's window), or None.
    side_logits: torch.Tensor | None = None
    # Those side rows' argmax tokens (lookahead's next guesses), read back with the verification's.
    side_best: list[int] | None = None


def side_guesses(state: DecodeState) -> list[int]:
    """The argmax token of each side row of the latest verification (lookahead's window), read once per step."""
    if state.side_best is None:
        state.side_best = state.side_logits.float().argmax(-1).tolist()
    return state.side_best


class RowByRow:
    """How a batch drafts when its drafter offers nothing better: each row's drafter proposes on its own."""

    def __init__(self, drafters: list[Drafter]) -> None:
        self.drafters = drafters

    def replace(self, row: int, drafter: Drafter) -> None:
        """Row `row` decodes a new prompt with `drafter` (a batch that decodes continuously, engine/batch.py)."""
        self.drafters[row] = drafter

    def propose(self, states: list[DecodeState], max_tokens: list[int], active: list[bool]) -> list[Draft]:
        return [d.propose(s, m) if a else Draft() for d, s, m, a in zip(self.drafters, states, max_tokens, active)]


class Drafter:
    """Base drafter: proposes nothing, which is plain autoregressive decoding."""

    name = "ar"
    approximate = False  # True when its acceptance rule is not exact
    needs_hidden_states = False  # ask the target forward for hidden states
    feature_layers: tuple[int, ...] = ()  # decoder layers whose inputs the target forward captures (EAGLE-3)
    extra_positions = 0  # positions past the committed text a step may use (lookahead's window)
    # Whether a draft budget may cap this drafter's depth. False where drafting costs next to nothing and a deeper
    # draft adds few verified tokens (n-gram drafters): a cap would only cut accepted tokens.
    budgeted = True

    def begin(self, state: DecodeState) -> None:
        """Called once after prefill."""

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        """A draft at most `max_tokens` deep: no path after the pending token longer than that (the tokens left to
        generate, or a draft budget's depth cap; 0 asks for no draft, a plain step)."""
        return Draft()

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        """Called after verification; `state.tokens` already holds the accepted path and the bonus token."""

    # what the latest `propose` caught up on (a drafter that learns it sets them there; `hindsight` takes them):
    # whether the target's token was among the guesses at each position, and (a tree's) whether it was the first one
    matches: list[bool] = []
    first_matches: list[bool] | None = None  # None: a chain's, the same as `matches`
    hindsight_depth: int | None = None
    # Hindsight reads the latest `hindsight_rows` positions caught up on, not all: each costs a row of the vocabulary
    # projection (Medusa's head 0, EAGLE's read-out, the draft model's LM head), and a probe after a long stretch
    # of plain steps read every one. Off the suite Medusa's catch-up over 16 plain steps took 4.5 ms of a probe's
    # 5.8 (a plain step: 4.8); with probes backed off to 128-256 steps apart it read up to 256 rows.
    hindsight_rows = HINDSIGHT_ROWS

    def hindsight(self) -> tuple[list[bool], list[bool] | None]:
        """Whether the drafter's greedy guess matched the target's token at each committed position it caught up on
        during its latest `propose` (in order; [] when it learned nothing): acceptance a draft budget gets for free
        at steps nobody drafted (engine/budget.py), as deep as `hindsight_depth` (None: a chain's guesses, each
        position's depth 1 and the next positions' deeper ones). A tree's drafter also says whether its first
        choice matched (the greedy spine's, Draft.spine); a chain's gives None. Greedy decoding only. Taken once:
        the next call returns [] unless another catch-up set `matches`."""
        matches, first = self.matches, self.first_matches
        if matches:
            self.matches, self.first_matches = [], None
        return matches, first

    def check_context(self, positions: int) -> None:
        """Raise GlanceError when a run of `positions` tokens is more than the drafter's own model can take."""

    def reset(self) -> None:
        """Forget everything from the previous run."""

    def budget_for(self, budget: FullBudget | None) -> FullBudget:
        """The budget a one-row run of this drafter takes when given `budget` (None: none): the budget itself where
        it may cap this drafter's depth (`budgeted`), else a full one. Lookahead gates its window instead."""
        return budget if budget is not None and self.budgeted else FullBudget()

    def budgeted_in_batch(self, rows: int) -> bool:
        """Whether a batch of `rows` rows may cap this drafter's depth (engine/batch.py): `budgeted` by default."""
        return self.budgeted

    def fit_batch(self, rows: int, forward_costs: ForwardCosts) -> None:
        """Size the draft for a batch of `rows` rows under the cost-aware budget, before the run, from the target's
        forward costs measured at that batch size (lookahead shrinks its window, which no depth cap reaches); the
        others keep their settings and take the budget's caps."""

    @classmethod
    def batch_drafting(cls, drafters: list[Drafter]) -> RowByRow:
        """What drafts for a batch of these drafters (one per row, engine/batch.py): row by row, unless a drafter
        batches its model calls across rows (one call per depth for every row). Rows must stay exact alone."""
        return RowByRow(drafters)

    def settings(self) -> dict:
        return {}
