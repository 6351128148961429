"""Acceptance by draft depth, defined once (docs/ARCHITECTURE.md, "Metrics"): P(accept at depth d | the step
reached depth d - 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.decoding.tree import node_depths


@dataclass
class DepthAcceptance:
    reached: list[int] = field(default_factory=list)  # [d-1]: steps that proposed depth d and accepted d - 1
    accepted: list[int] = field(default_factory=list)  # [d-1]: of those, steps that accepted depth d

    def add(self, draft_parents: list[int], n_accepted: int) -> None:
        depth = max(node_depths(draft_parents), default=0)
        for d in range(1, min(depth, n_accepted + 1) + 1):
            while len(self.reached) < d:
                self.reached.append(0)
                self.accepted.append(0)
            self.reached[d - 1] += 1
            self.accepted[d - 1] += n_accepted >= d

    def rates(self) -> list[float]:
        return [a / r for a, r in zip(self.accepted, self.reached)]
