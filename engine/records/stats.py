"""One statistics accumulator, fed step events, with the one definition of every metric (docs/ARCHITECTURE.md):
the decoder's run summary, the app's lane headers and charts, the benchmark suite and the model card all read it.

- tau (mean accepted length): tokens emitted per verification step, the target's own token included; the prefill's
  token is not counted.
- acceptance: accepted draft tokens / proposed draft depth (the deepest node of each step's draft).
- acceptance by depth d: P(accept at depth d | the step reached depth d - 1) (engine/records/metrics.py).
- throughput: new tokens / seconds from the start of prefill to the end of the last step.
"""

from __future__ import annotations

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
