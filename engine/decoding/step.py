"""One decoding step's commit logic for one row: the first token after prefill, verification of a draft against the
target's rows, the cut at EOS or the token budget, and the rows of the verifying forward that predicted each emitted
token (what Medusa and EAGLE read their next features from)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.decoding.sampling import SamplingConfig, logits_to_probs, sample
from engine.decoding.tree import Draft
from engine.decoding.verify import verify
from engine.records.events import StepEvent


@dataclass
class StepOutcome:
    """What one verification step decided for one sequence."""

    accepted: list[int]  # accepted draft nodes, root to leaf
    tokens: list[int]  # emitted tokens: the accepted nodes' tokens, then the target's own, cut at EOS / budget
    rows: list[int]  # verify-forward row that predicted each emitted token (0: the pending token, i + 1: node i)
    from_draft: list[bool]  # per emitted token: True when the drafter proposed it
    stop: str | None  # "eos" | "max_new_tokens" | None (go on)


def sync(device: torch.device) -> None:
    """Wait for the device, so that host timers measure its work (CUDA and MPS run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def first_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """The token after the prompt from the prefill's last row of logits [V]."""
    if sampling.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, sampling), generator)


def cut(tokens: list[int], budget: int, eos: set[int]) -> tuple[int, str | None]:
    """How many of `tokens` to keep: up to and including the first EOS, or `budget` tokens, whichever comes first."""
    for i, tok in enumerate(tokens):
        if tok in eos:
            return i + 1, "eos"
        if i + 1 >= budget:
            return i + 1, "max_new_tokens"
    return len(tokens), None


def commit(
    draft: Draft,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    budget: int,
    eos: set[int],
    best: list[int] | None = None,
) -> StepOutcome:
    """Verify `draft` against the target's rows `logits` [1 + n, V] (root first) and cut the result. `best`: each
    row's argmax when the forward computed it (greedy verification then reads no logits)."""
    verdict = verify(draft, logits, sampling, generator, best)
    tokens = [draft.tokens[i] for i in verdict.accepted] + [verdict.bonus]
    rows = [0] + [i + 1 for i in verdict.accepted]
    from_draft = [True] * len(verdict.accepted) + [False]
    keep, stop = cut(tokens, budget, eos)
    return StepOutcome(list(verdict.accepted), tokens[:keep], rows[:keep], from_draft[:keep], stop)


def eos_set(eos_token_ids: list[int] | int | None) -> set[int]:
    if isinstance(eos_token_ids, int):
        return {eos_token_ids}
    return set(eos_token_ids or [])


def step_event(
    run_id: str,
    variant: str,
    step: int,
    draft: Draft,
    outcome: StepOutcome,
    draft_seconds: float,
    verify_seconds: float,
    clock: float,
    new_tokens: int,
    target_probs: list[float] | None = None,
    target_top: list | None = None,
) -> StepEvent:
    """The event of a verification step (step >= 1), from the draft and what the step decided."""
    return StepEvent(
        run_id=run_id,
        variant=variant,
        step=step,
        draft_tokens=list(draft.tokens),
        draft_parents=list(draft.parents),
        accepted_nodes=list(outcome.accepted),
        tokens=list(outcome.tokens),
        from_draft=list(outcome.from_draft),
        target_probs=target_probs or [],
        draft_seconds=draft_seconds,
        verify_seconds=verify_seconds,
        clock=clock,
        new_tokens=new_tokens,
        notes=draft.notes,
        target_top=target_top or [],
    )


def prefill_event(
    run_id: str, variant: str, token: int, seconds: float, target_probs=None, target_top=None
) -> StepEvent:
    """Step 0: the prefill, which emits the target's first token."""
    return StepEvent(
        run_id=run_id,
        variant=variant,
        step=0,
        draft_tokens=[],
        draft_parents=[],
        accepted_nodes=[],
        tokens=[token],
        from_draft=[False],
        target_probs=target_probs or [],
        draft_seconds=0.0,
        verify_seconds=seconds,
        clock=seconds,
        new_tokens=1,
        prefill=True,
        target_top=target_top or [],
    )
