"""Vanilla drafting for a whole batch: one draft-model forward per drafting depth for every row, instead of one per
row and depth.

Rows feed different numbers of tokens (each catches up on what it has not seen: one token, or several after a long
acceptance), so one batched draft cache holds every row's entries at different columns. Each row's columns are
tracked; a forward's mask lets a row see its own columns only, and before each step the cache is packed so that
row b's seen tokens sit at columns 0..seen_b - 1 (a per-row gather, as the target's cache in engine/batch.py).
Each row keeps its own VanillaDrafter (gamma, confidence, generator), so rows draft exactly as they would alone.
"""

from __future__ import annotations

import torch

from engine.cache import cache_length, pack_columns
from engine.drafters.base import DecodeState
from engine.forward import forward_for, greedy_ids
from engine.sampling import logits_to_probs, sample
from engine.tree import Draft, additive_mask


class BatchedChains:
    """Drafts a chain for every active row of a batch, one draft forward per depth for all of them."""

    def __init__(self, drafters: list) -> None:
        """`drafters`: one VanillaDrafter per row, all over the same draft model."""
        self.rows = drafters
        self.model = drafters[0].model
        self.device = drafters[0].device
        self.dtype = next(self.model.parameters()).dtype
        self.forward = forward_for(self.model)  # eager, or compiled when compile_model compiled the draft
        self.cache = self.forward.new_cache(max(d.positions for d in drafters) + drafters[0].max_gamma)
        self.cols: list[list[int]] = [[] for _ in drafters]  # cache columns of row b's seen tokens, in order

    def replace(self, row: int, drafter) -> None:
        """Row `row` decodes a new prompt with `drafter`: its columns are forgotten (packed away before the next
        draft), so the new prompt is fed from its start as a fresh row's is."""
        self.rows[row] = drafter
        self.cols[row] = []

    def _forward(self, feeds: list[list[int]], greedy: bool) -> tuple[torch.Tensor, list[int] | None]:
        """Feed row b the tokens `feeds[b]` after its seen ones; the logits [B, V] after each row's last fed token
        (meaningless for a row fed nothing)."""
        B, S = len(feeds), max(1, max(map(len, feeds)))
        width = cache_length(self.cache)
        ids = torch.zeros(B, S, dtype=torch.long)
        visible = torch.zeros(B, S, width + S, dtype=torch.bool)
        positions = torch.zeros(B, S, dtype=torch.long)
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        for b, feed in enumerate(feeds):
            n, seen = len(feed), len(self.cols[b])
            if n:
                ids[b, :n] = torch.tensor(feed)
                visible[b, :n, width : width + n] = causal[:n, :n]
            visible[b, :n, self.cols[b]] = True
            visible[b, n:, width + n :] = torch.eye(S - n, dtype=torch.bool)  # padding sees itself only
            at = seen + self.rows[b].skipped  # the text position of the first token fed
            positions[b, :n] = torch.arange(at, at + n)
            positions[b, n:] = at
            self.cols[b] += range(width, width + n)
        mask = additive_mask(visible, self.dtype, self.device)  # [B, 1, S, width + S]
        lasts = [max(len(f), 1) - 1 for f in feeds]
        at = sorted(set(lasts))  # the LM head on each row's last fed token only (the first draft feeds the prompt)
        out = self.forward(ids.to(self.device), self.cache, mask, positions.to(self.device), logits_at=at)
        last = torch.tensor([at.index(n) for n in lasts], device=out.logits.device)
        rows = torch.arange(B, device=last.device)
        best = greedy_ids(out)[rows, last].tolist() if greedy else None  # each row's argmax, when any row is greedy
        return out.logits[rows, last], best  # [B, V]

    @torch.no_grad()
    def propose(self, states: list[DecodeState], max_tokens: list[int], active: list[bool]) -> list[Draft]:
        rows = self.rows
        want = [min(d.gamma, m) if a else 0 for d, m, a in zip(rows, max_tokens, active)]
        feeds: list[list[int]] = []
        for b, (d, state) in enumerate(zip(rows, states)):
            if not want[b]:
                feeds.append([])
                continue
            keep = d.rewind(state.tokens)
            self.cols[b] = self.cols[b][: keep - d.skipped]
            feeds.append(state.tokens[d.leave_out(state.tokens, keep) :])  # a long catch-up's latest, as one row
        if not any(want):
            return [Draft() for _ in rows]
        self.cols = pack_columns(self.cache, self.cols)  # each row's entries at columns 0..n_b - 1
        tokens: list[list[int]] = [[] for _ in rows]
        qs: list[list[torch.Tensor]] = [[] for _ in rows]
        live = [w > 0 for w in want]
        greedy = any(s.sampling.greedy for s in states)
        while True:
            for b, feed in enumerate(feeds):
                rows[b].seen.extend(feed)
            logits, best = self._forward(feeds, greedy)  # [B, V], [B] or None
            feeds = [[] for _ in rows]
            for b, d in enumerate(rows):
                if not live[b]:
                    continue
                sampling = states[b].sampling
                if sampling.greedy:
                    x = d.greedy_token(logits[b], best[b])
                else:
                    q = d._pad(logits_to_probs(logits[b], sampling))  # [V]
                    x = sample(q, states[b].generator)
                    qs[b].append(q)
                tokens[b].append(x)
                doubt = d.confidence and float(torch.softmax(logits[b].float(), -1)[x]) < d.confidence
                if doubt or len(tokens[b]) == want[b]:
                    live[b] = False
                else:
                    feeds[b] = [x]
            if not any(live):
                break
        return [
            Draft.chain(t, None if states[b].sampling.greedy or not t else torch.stack(qs[b])) if t else Draft()
            for b, t in enumerate(tokens)
        ]
