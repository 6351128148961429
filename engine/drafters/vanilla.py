"""Vanilla speculative decoding: a small draft model proposes a chain (Leviathan et al. 2023; Chen et al. 2023).

The draft keeps its own KV cache over the committed tokens; after verification it is cropped back to the longest
prefix that is still committed, and the next proposal feeds whatever the draft has not seen yet.

With `confidence` > 0 the chain also stops early once the draft's own probability (temperature 1) of its latest
token falls below it, as transformers' `assistant_confidence_threshold` does: a draft forward whose token would
likely be rejected is skipped. The stopping rule reads only the draft's side, so every verified token still goes
through the same exact rule.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.cache import cache_length, crop
from engine.drafters.base import DecodeState, Drafter
from engine.sampling import logits_to_probs, sample
from engine.tree import Draft

MAX_GAMMA = 16


class VanillaDrafter(Drafter):
    name = "vanilla"

    def __init__(
        self,
        draft_model: torch.nn.Module,
        gamma: int = 4,
        adaptive: bool = False,
        target_vocab: int | None = None,
        max_gamma: int = MAX_GAMMA,
        confidence: float = 0.0,
    ):
        if gamma < 1:
            raise ValueError("gamma must be >= 1")
        if not 0.0 <= confidence < 1.0:
            raise ValueError("the draft confidence threshold must be in [0, 1)")
        self.confidence = confidence
        self.model = draft_model
        self.initial_gamma = gamma
        self.gamma = gamma
        self.adaptive = adaptive
        self.max_gamma = max(max_gamma, gamma)
        self.target_vocab = target_vocab
        self.device = next(draft_model.parameters()).device
        self.cache = None
        self.seen: list[int] = []  # tokens whose KV the draft cache holds

    def reset(self) -> None:
        self.cache, self.seen, self.gamma = None, [], self.initial_gamma

    def begin(self, state: DecodeState) -> None:
        self.reset()
        self.cache = DynamicCache(config=self.model.config)

    def _step(self, new_tokens: list[int]) -> torch.Tensor:
        """Feed tokens the draft has not seen; return the logits [V] after the last one."""
        ids = torch.tensor([new_tokens], device=self.device)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True)
        self.seen.extend(new_tokens)
        return out.logits[0, -1]

    def _pad(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft distribution over the target's vocabulary (a smaller draft vocabulary gets zero mass beyond it)."""
        if self.target_vocab is None or probs.shape[-1] == self.target_vocab:
            return probs
        if probs.shape[-1] > self.target_vocab:
            probs = probs[..., : self.target_vocab]
            return probs / probs.sum(-1, keepdim=True)
        return torch.nn.functional.pad(probs, (0, self.target_vocab - probs.shape[-1]))

    @torch.no_grad()
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        n = min(self.gamma, max_tokens)
        if n < 1:
            return Draft()
        # Roll back to the longest committed prefix the draft has seen (at least one token must be fed).
        keep = 0
        limit = min(len(self.seen), len(state.tokens) - 1)
        while keep < limit and self.seen[keep] == state.tokens[keep]:
            keep += 1
        if cache_length(self.cache) > keep:
            crop(self.cache, keep)
        self.seen = self.seen[:keep]
        logits = self._step(state.tokens[keep:])
        tokens, qs = [], []
        for i in range(n):
            q = self._pad(logits_to_probs(logits, state.sampling))  # [V]
            x = int(q.argmax()) if state.sampling.greedy else sample(q, state.generator)
            tokens.append(x)
            qs.append(q)
            if self.confidence and float(torch.softmax(logits.float(), -1)[x]) < self.confidence:
                break  # the draft doubts this token: verify what we have rather than draft on
            if i + 1 < n:
                logits = self._step([x])
        q_probs = None if state.sampling.greedy else torch.stack(qs)  # [n, V]
        return Draft.chain(tokens, q_probs)

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        if self.adaptive and len(draft):
            # transformers' heuristic schedule: +2 after a fully accepted draft, -1 otherwise
            if len(accepted) == len(draft):
                self.gamma = min(self.max_gamma, self.gamma + 2)
            else:
                self.gamma = max(1, self.gamma - 1)

    def settings(self) -> dict:
        return {"gamma": self.initial_gamma, "adaptive": self.adaptive, "confidence": self.confidence}
