"""A head's candidates: the k most likely tokens per row of its logits, as one module call.

The top-k over the vocabulary is part of reading a head's output distribution, like the LM head before it, so it
runs inside a module that the benchmark's clock times as model compute (engine/bench/clock.py): what the clock
reports as overhead is then the drafting loop's own host work (tree building, masks, transfers).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class TopCandidates(nn.Module):
    """forward(x [..., H], k) -> (values, indices) [..., k]: the head's k best tokens per row of `head.logits(x)`,
    with their log-probabilities (`log_probs=False`: raw logits, enough when only the ids are read)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.__dict__["head"] = weakref.ref(head)  # not a submodule, and no cycle that keeps the head alive

    def forward(self, x: torch.Tensor, k: int, log_probs: bool = True):
        logits = self.head().logits(x).float()  # [..., V]
        if log_probs:
            logits = torch.log_softmax(logits, dim=-1)
        return logits.topk(min(k, logits.shape[-1]), dim=-1)


_READOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head -> TopCandidates


def candidates(head: nn.Module) -> TopCandidates:
    """The one TopCandidates module of `head` (the clock hooks this same module)."""
    readout = _READOUTS.get(head)
    if readout is None:
        readout = _READOUTS[head] = TopCandidates(head)
    return readout
