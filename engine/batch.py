"""Batched speculative decoding: B prompts at once, one target forward per step for every row, each row drafted,
verified and accepted on its own, so rows advance by different amounts.

Every row keeps its own cache length: after each step a per-row gather packs row b's cache to its committed tokens
(right-padded to the longest row) and the mask hides each row's padding. Drafters are per row (their own caches,
pools and hidden states) and draft one row at a time; only the target's verification is batched. A drafter sees a
`RowView` of the batched output laid out exactly like a batch-1 forward, so every variant runs unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from engine.cache import gather_rows
from engine.drafters.base import DecodeState, Drafter
from engine.errors import GlanceError
from engine.sampling import SamplingConfig, logits_to_probs, sample
from engine.tree import Draft, draft_visibility, node_depths
from engine.verify import verify


@dataclass
class RowView:
    """One row of a batched target output, trimmed to that row's real inputs."""

    logits: torch.Tensor  # [1, S_b, V]
    hidden_states: tuple | None
    cache: Any = None


@dataclass
class BatchResult:
    tokens: list[list[int]]  # new tokens per row
    steps: list[int]  # verification steps each row took
    forwards: int  # batched target forwards (prefill included)
    wall_seconds: float
    draft_seconds: float
    verify_seconds: float

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def mean_accepted_length(self) -> float:
        """tau over all rows: tokens emitted by verification steps per step (the prefill token excluded)."""
        steps = sum(self.steps)
        return (self.new_tokens - len(self.tokens)) / steps if steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


def _row_view(out, b: int, length: int) -> RowView:
    hidden = getattr(out, "hidden_states", None)
    return RowView(
        out.logits[b : b + 1, :length],
        tuple(h[b : b + 1, :length] for h in hidden) if hidden is not None else None,
    )


class BatchDecoder:
    """`make_drafter()` builds one fresh drafter per row (None: plain decoding)."""

    def __init__(
        self,
        target: torch.nn.Module,
        make_drafter: Callable[[], Drafter] | None = None,
        sampling: SamplingConfig | None = None,
        max_new_tokens: int = 64,
        eos_token_ids: list[int] | int | None = None,
        pad_token_id: int = 0,
    ) -> None:
        if max_new_tokens < 1:
            raise GlanceError(f"max new tokens must be at least 1 (got {max_new_tokens})")
        self.target = target
        self.make_drafter = make_drafter or Drafter
        self.sampling = sampling or SamplingConfig()
        self.max_new_tokens = max_new_tokens
        if isinstance(eos_token_ids, int):
            eos_token_ids = [eos_token_ids]
        self.eos = set(eos_token_ids or [])
        self.pad = pad_token_id
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype

    def _forward(self, ids: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor, cache, hidden: bool):
        """ids, positions: [B, S]; visible: [B, S, past + S] bool."""
        mask = torch.zeros(visible.shape, dtype=self.dtype)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        return self.target(
            input_ids=ids.to(self.device),
            attention_mask=mask[:, None].to(self.device),  # [B, 1, S, past + S]
            position_ids=positions.to(self.device),
            cache=cache,
            use_cache=True,
            output_hidden_states=hidden,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> BatchResult:
        if not prompts or any(not p for p in prompts):
            raise GlanceError("every prompt of a batch needs at least one token")
        B = len(prompts)
        drafters = [self.make_drafter() for _ in range(B)]
        hidden = drafters[0].needs_hidden_states
        gens = [torch.Generator().manual_seed(self.sampling.seed + b) for b in range(B)]
        cache = DynamicCache(config=self.target.config)
        t0 = time.perf_counter()

        # Prefill, right-padded: row b's real tokens are columns 0..len_b - 1.
        lens = [len(p) for p in prompts]
        T = max(lens)
        ids = torch.full((B, T), self.pad, dtype=torch.long)
        visible = torch.zeros(B, T, T, dtype=torch.bool)
        positions = torch.zeros(B, T, dtype=torch.long)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
            visible[b, :, : len(p)] = causal[:, : len(p)]
            positions[b] = torch.arange(T).clamp(max=len(p) - 1)
        out = self._forward(ids, visible, positions, cache, hidden)
        forwards = 1
        states, new = [], []
        for b, p in enumerate(prompts):
            logits = out.logits[b, len(p) - 1].float()
            first = (
                int(logits.argmax())
                if self.sampling.greedy
                else sample(logits_to_probs(logits, self.sampling), gens[b])
            )
            state = DecodeState(list(p) + [first], len(p), self.sampling, gens[b], _row_view(out, b, len(p)))
            drafters[b].begin(state)
            states.append(state)
            new.append([first])
        cached = list(lens)  # row b's cache length: every committed token but the pending one
        active = [t[0] not in self.eos and self.max_new_tokens > 1 for t in new]
        steps = [0] * B
        draft_s = verify_s = 0.0
        prefill_s = time.perf_counter() - t0

        while any(active):
            ts = time.perf_counter()
            drafts = [
                drafters[b].propose(states[b], self.max_new_tokens - len(new[b]) - 1) if active[b] else Draft()
                for b in range(B)
            ]
            tv = time.perf_counter()
            sizes = [1 + len(d) + len(d.side_tokens) for d in drafts]
            S, past = max(sizes), cache.get_seq_length()
            ids = torch.full((B, S), self.pad, dtype=torch.long)
            visible = torch.zeros(B, S, past + S, dtype=torch.bool)
            positions = torch.zeros(B, S, dtype=torch.long)
            for b, d in enumerate(drafts):
                n = sizes[b]
                ids[b, :n] = torch.tensor([states[b].tokens[-1]] + d.tokens + d.side_tokens)
                visible[b, :, : cached[b]] = True
                visible[b, :n, past : past + n] = draft_visibility(d.parents, d.side_visible)
                visible[b, n:, past + n :] = torch.eye(S - n, dtype=torch.bool)  # padding sees itself only
                offsets = [0] + node_depths(d.parents) + list(d.side_offsets)
                positions[b, :n] = cached[b] + torch.tensor(offsets)
                positions[b, n:] = cached[b]
            out = self._forward(ids, visible, positions, cache, hidden)
            forwards += 1
            keep, verified = [], []
            for b, d in enumerate(drafts):
                if not active[b]:
                    keep.append(list(range(cached[b])))
                    continue
                logits = out.logits[b, : 1 + len(d)].float()  # [1 + n, V]: side rows are the drafter's
                verdict = verify(d, logits, self.sampling, gens[b])
                emitted = [d.tokens[i] for i in verdict.accepted] + [verdict.bonus]
                rows = [0] + [i + 1 for i in verdict.accepted]  # row that predicted each emitted token
                keep.append(list(range(cached[b])) + [past + r for r in rows])
                budget = self.max_new_tokens - len(new[b])
                for i, tok in enumerate(emitted):  # stop at EOS or at the budget, whichever comes first
                    if tok in self.eos or i + 1 >= budget:
                        emitted, rows, active[b] = emitted[: i + 1], rows[: i + 1], False
                        break
                states[b].tokens.extend(emitted)
                states[b].target_out = _row_view(out, b, sizes[b])
                states[b].extra["rows"] = rows
                new[b].extend(emitted)
                steps[b] += 1
                verified.append((b, verdict.accepted))
            longest = max(len(k) for k in keep)
            index = torch.tensor([k + [0] * (longest - len(k)) for k in keep])  # [B, longest]
            gather_rows(cache, index)
            cached = [len(k) for k in keep]
            tu = time.perf_counter()
            for b, accepted in verified:
                drafters[b].update(states[b], drafts[b], accepted)
            te = time.perf_counter()
            draft_s += (tv - ts) + (te - tu)
            verify_s += tu - tv
        wall = prefill_s + draft_s + verify_s
        return BatchResult(new, steps, forwards, wall, draft_s, verify_s)
