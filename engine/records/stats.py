"""One statistics accumulator, fed step events, with the one definition of every metric (docs/ARCHITECTURE.md):
the decoder's run summary, the app's lane headers and charts, the benchmark suite and the model card all read it.

- tau (mean accepted length): tokens emitted per verification step, the target's own token included; the prefill's
  token is not counted.
- acceptance: accepted draft tokens / proposed draft depth (the deepest node of each step's draft).
- acceptance by depth d: P(accept at depth d | the step reached depth d - 1) (engine/records/metrics.py).
- throughput: new tokens / seconds from the start of prefill to the end of the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.decoding.tree import is_chain, node_depths
from engine.records.events import StepEvent
from engine.records.metrics import DepthAcceptance


@dataclass
class RunStats:
    steps: int = 0  # verification steps (the prefill is step 0 and not counted)
    emitted: int = 0  # tokens those steps emitted
    new_tokens: int = 0  # every new token, the prefill's included
    accepted: int = 0  # accepted draft tokens
    proposed_depth: int = 0  # sum over steps of the draft's depth
    verify_tokens: int = 0  # tokens the verifying forwards ran over: the pending token, nodes, side branch
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    clock: float = 0.0  # the run's own clock at its latest step
    chain: bool = True  # every draft so far was a chain
    by_depth: DepthAcceptance = field(default_factory=DepthAcceptance)
    tokens: list[int] = field(default_factory=list)
    # lookahead: n-grams pooled, steps that verified pooled n-grams, and of those the ones that accepted a token
    pool_size: int | None = None
    guess_steps: int = 0
    hit_steps: int = 0
    drafted_steps: int = 0  # steps that verified at least one drafted token
    cost: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum and sum of squares: a step's seconds a token

    def add(self, ev: StepEvent) -> None:
        self.tokens.extend(ev.tokens)
        self.new_tokens, self.clock = ev.new_tokens, ev.clock
        if ev.step == 0:
            self.prefill_seconds = ev.verify_seconds
        else:
            n_acc = len(ev.accepted_nodes)
            self.steps += 1
            self.emitted += len(ev.tokens)
            self.accepted += n_acc
            self.proposed_depth += max(node_depths(ev.draft_parents), default=0)
            self.by_depth.add(ev.draft_parents, n_acc)
            self.draft_seconds += ev.draft_seconds
            self.verify_seconds += ev.verify_seconds
            self.chain = self.chain and is_chain(ev.draft_parents)
            side = sum(map(len, ev.notes.window or []))
            self.verify_tokens += 1 + len(ev.draft_tokens) + side
            self.drafted_steps += bool(ev.draft_tokens) or bool(side)
            per_token = (ev.draft_seconds + ev.verify_seconds) / max(1, len(ev.tokens))
            self.cost[0] += per_token
            self.cost[1] += per_token * per_token
        if ev.notes.pool_size is not None:
            self.pool_size = ev.notes.pool_size
            if ev.notes.ngrams:
                self.guess_steps += 1
                self.hit_steps += bool(ev.accepted_nodes)

    @property
    def tau(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed_depth if self.proposed_depth else None

    @property
    def acceptance_by_depth(self) -> list[float]:
        return self.by_depth.rates()

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.clock if self.clock > 0 else 0.0

    @property
    def hit_rate(self) -> float | None:
        """Lookahead: of the steps that verified pooled n-grams, the share that accepted at least one token."""
        return self.hit_steps / self.guess_steps if self.guess_steps else None

    @property
    def drafted_share(self) -> float:
        return self.drafted_steps / self.steps if self.steps else 0.0

    def cost_spread(self) -> float:
        """The relative standard error of the mean step cost a token: how far this run's speed is known."""
        n, total, squares = self.steps, self.cost[0], self.cost[1]
        if n < 2 or total <= 0:
            return math.inf
        mean = total / n
        var = max(0.0, squares / n - mean * mean) * n / (n - 1)
        return math.sqrt(var / n) / mean


@dataclass(frozen=True)
class Speedup:
    """A lane's speed over plain decoding's in the same race, with what it rests on."""

    value: float  # throughput over plain decoding's
    drafted: float  # share of the lane's steps that verified a draft
    noise: float  # two standard errors of the two runs' step costs combined: a smaller difference is a tie

    @property
    def verdict(self) -> str:
        """ "1.32x", "1.03x, a tie", or "no drafts: plain steps" for a lane whose speed says nothing of drafting."""
        if self.drafted == 0:
            return "no drafts: plain steps"
        if abs(self.value - 1.0) <= self.noise:
            return f"{self.value:.2f}x, a tie"
        return f"{self.value:.2f}x"


def compare(lane: RunStats, plain: RunStats) -> Speedup | None:
    """`lane`'s speedup over `plain` (None before both have a speed)."""
    if lane.tokens_per_second <= 0 or plain.tokens_per_second <= 0:
        return None
    noise = 2.0 * math.hypot(lane.cost_spread(), plain.cost_spread())
    return Speedup(lane.tokens_per_second / plain.tokens_per_second, lane.drafted_share, noise)


@dataclass(frozen=True)
class Decomposition:
    """Why a lane is as fast as it is: speedup = tau / (draft + verify + other), each part in plain-decoding steps
    (plain decoding's seconds per token in the same race) per verification step of the lane; `other` is the prompt's
    prefill spread over the lane's steps."""

    tau: float
    draft: float
    verify: float
    other: float
    plain_ms: float  # one plain step, in milliseconds

    @property
    def speedup(self) -> float:
        cost = self.draft + self.verify + self.other
        return self.tau / cost if cost > 0 else 0.0


def decompose(lane: RunStats, plain: RunStats | None, plain_step: float | None = None) -> Decomposition | None:
    """`lane`'s speedup over `plain` taken apart (None before both have run a step). With no plain run, `plain_step`
    (seconds of a one-token forward, as the load timed it) stands for plain decoding's step."""
    if plain is not None and plain.new_tokens and plain.clock > 0:
        step = plain.clock / plain.new_tokens  # seconds per plain token, its prefill included
    else:
        step = plain_step or 0.0
    if not lane.steps or step <= 0:
        return None
    n = lane.steps * step
    other = max(0.0, lane.clock - lane.draft_seconds - lane.verify_seconds)
    return Decomposition(lane.tau, lane.draft_seconds / n, lane.verify_seconds / n, other / n, step * 1e3)
