"""The one contract between engine, app, session logs and benchmarks: per-step events and per-run summaries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DraftNotes:
    """What a drafter says about its draft besides the nodes: each field None where the drafter says nothing."""

    rule: str | None = None  # Medusa: "typical" when typical acceptance (approximate) judged the draft
    window: list[list[int]] | None = None  # lookahead: the Jacobi window's levels fed with this step
    ngrams: list[list[int]] | None = None  # lookahead: the pooled n-grams this step verified
    pool_size: int | None = None  # lookahead: n-grams in its pool
    draft_ids: list[int] | None = None  # EAGLE-3: each node's id in the head's reduced vocabulary
    draft_vocab: int | None = None  # EAGLE-3: the size of that vocabulary
    target_in_draft_vocab: bool | None = None  # EAGLE-3: whether the target's own token was in it
    block_size: int | None = None  # DFlash: the block one draft forward filled (the pending token + masks)


@dataclass
class BudgetNote:
    """What a cost-aware budget allowed a step: its depth cap (None: none) and whether only the greedy spine ran."""

    depth_cap: int | None = None
    narrow: bool = False


@dataclass
class StepEvent:
    """One verification step of one run (step 0 is the prefill, which emits the target's first token)."""

    run_id: str
    variant: str
    step: int
    draft_tokens: list[int]  # proposed nodes, flat
    draft_parents: list[int]  # parent node of each (-1 = the pending token)
    accepted_nodes: list[int]  # node indices of the accepted path
    tokens: list[int]  # tokens emitted this step: accepted draft tokens, then the target's own token
    from_draft: list[bool]  # per emitted token: True if the drafter proposed it
    target_probs: list[float]  # the target's probability of each emitted token (under the sampling settings)
    draft_seconds: float
    verify_seconds: float
    clock: float  # seconds on this run's own clock, from the start of prefill to the end of this step
    new_tokens: int  # tokens emitted so far, this step included
    notes: DraftNotes = field(default_factory=DraftNotes)
    budget: BudgetNote | None = None  # None: no cost-aware budget sized this step
    # per verified row (the pending token, then each node): the target's top tokens as [token, prob] pairs, filled
    # for the rows that emitted a token (the pending token's and the accepted path's), empty for the others
    target_top: list[list[list]] = field(default_factory=list)
    prefill: bool = False  # step 0: the prompt's forward, which emits the target's first token

    @property
    def accepted_length(self) -> int:
        """tau of this step: tokens emitted, the target's own token included."""
        return len(self.tokens)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunSummary:
    """What a run produced and how it went (metrics as defined in docs/ARCHITECTURE.md, computed by
    engine/records/stats.py)."""

    run_id: str
    variant: str
    prompt_tokens: int
    token_ids: list[int]
    new_tokens: int
    steps: int  # verification steps, prefill excluded
    target_forwards: int  # prefill included
    mean_accepted_length: float  # tau: mean tokens per verification step
    acceptance_rate: float | None  # accepted draft tokens / proposed tokens on the proposed chain (None: no drafts)
    acceptance_by_depth: list[float]  # P(accept at depth d | reached depth d - 1), d = 1..
    tokens_per_second: float
    wall_seconds: float
    prefill_seconds: float
    draft_seconds: float
    verify_seconds: float
    stop_reason: str  # "eos" | "max_new_tokens" | "cancelled"
    approximate: bool = False  # True when an acceptance rule is not exact (Medusa's typical acceptance)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
