"""A head's candidates: the k most likely tokens per row of its logits, as one module call.

The top-k over the vocabulary is part of reading a head's output distribution, like the LM head before it, so it
runs inside a module that the benchmark's clock times as model compute (engine/bench/clock.py): what the clock
reports as overhead is then the drafting loop's own host work (tree building, masks, transfers).

EAGLE's heads draft depth by depth: a head forward, then its read-out. `draft_step(head)` does both in one call,
eager by default; `compile_head(head)` compiles it as one graph per head (engine/heads/compiled_step.py).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


def top_candidates(head: nn.Module, x: torch.Tensor, k: int, log_probs: bool = True, first: bool = False):
    """(values, indices) [..., k]: the k best tokens per row of `head.logits(x)` [..., V], with their
    log-probabilities (`log_probs=False`: raw logits, enough when only the ids are read). `first`: Medusa's head 0
    alone, [1, ..., k] (a draft one token deep reads nothing deeper)."""
    logits = (head.first_logits(x)[None] if first else head.logits(x)).float()  # [..., V]
    if log_probs:
        logits = torch.log_softmax(logits, dim=-1)
    return logits.topk(min(k, logits.shape[-1]), dim=-1)


class TopCandidates(nn.Module):
    """forward(x [..., H], k, log_probs, first) -> (values, indices) [..., k]: `top_candidates` of the head."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.__dict__["head"] = weakref.ref(head)  # not a submodule, and no cycle that keeps the head alive
        self.__dict__["compiled"] = None  # a CompiledReadout, when the session compiles Medusa's read-out

    def forward(self, x: torch.Tensor, k: int, log_probs: bool = True, first: bool = False):
        compiled = self.compiled
        if compiled is not None and compiled.takes(x):
            return compiled(x, k, log_probs, first)
        return top_candidates(self.head(), x, k, log_probs, first)


def run_draft_step(head: nn.Module, tokens, features, positions, cache, mask, k: int):
    """One drafting depth of an EAGLE head: (outputs [B, S, H], log-probs [B, S, k], target ids [B, S, k]).
    It calls `head.forward`, not the module, so a compiled copy of it keeps the clock's hooks outside its graph."""
    out = head.forward(tokens, features, positions, cache, mask)  # [B, S, H]
    values, ids = top_candidates(head, out, k)
    return out, values, head.to_target(ids)


class DraftStep(nn.Module):
    """forward(tokens [B, S], features [B, S, F], positions [B, S], cache, mask [B or 1, 1, S, past + S] or None
    (a run of one row that sees everything), k) -> (outputs [B, S, H], log-probs [B, S, k], target ids [B, S, k]).
    A module, so that the clock times the head and its read-out as one model call; `compiled` (if set) runs
    instead of the eager step once the head's cache holds entries (engine/heads/compiled_step.py)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.__dict__["head"] = weakref.ref(head)
        self.__dict__["compiled"] = None  # a CompiledDraftStep, when the session compiles heads

    def forward(self, tokens, features, positions, cache, mask, k: int):
        compiled = self.compiled
        if compiled is not None and compiled.takes(cache):
            return compiled(tokens, features, positions, cache, mask, k)
        return run_draft_step(self.head(), tokens, features, positions, cache, mask, k)


_READOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head -> TopCandidates
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head -> DraftStep


def candidates(head: nn.Module) -> TopCandidates:
    """The one TopCandidates module of `head` (the clock hooks this same module)."""
    readout = _READOUTS.get(head)
    if readout is None:
        readout = _READOUTS[head] = TopCandidates(head)
    return readout


def draft_step(head: nn.Module) -> DraftStep:
    """The one DraftStep module of an EAGLE or EAGLE-3 head (the clock hooks this same module)."""
    step = _STEPS.get(head)
    if step is None:
        step = _STEPS[head] = DraftStep(head)
    return step


def readouts() -> list[TopCandidates]:
    """Every head's TopCandidates made so far (live heads only)."""
    return list(_READOUTS.values())


def draft_steps() -> list[DraftStep]:
    """Every head's DraftStep made so far (live heads only)."""
    return list(_STEPS.values())
