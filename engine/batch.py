"""Batched speculative decoding: B prompts at once, one target forward per step for every row, each row drafted,
verified and accepted on its own, so rows advance by different amounts.

The commit logic (first token, verification, EOS/budget cut, rows for the next draft) is `engine/step.py`'s, the
same as the single-prompt `Decoder`'s, and both emit StepEvents. Every row keeps its own cache length: after each
step row b's pending token and accepted path are moved after its own prefix (`move_row_entries`; on the static
cache inside the next compiled forward), the rows right-padded to the longest, and the mask hides each row's
padding; a row that finished leaves the target's batch (its cache row too). Drafters are per row (their pools,
pending features and settings). A drafter class may batch its model calls across rows (`Drafter.batch_drafting`:
vanilla, Medusa, EAGLE-2 and EAGLE-3 make one model call per depth for every row); the others draft one row at a
time. A drafter sees a `RowView` of the batched output laid out exactly like a batch-1 forward, so every variant
runs unchanged. Given more prompts than rows, finished rows take waiting prompts
(continuous batching, `stream`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.budget import FullBudget, remembered
from engine.cache import check_window, crop, keep_batch_rows, move_row_entries, write_rows
from engine.drafters.base import DecodeState, Drafter, RowByRow
from engine.errors import GlanceError
from engine.events import StepEvent
from engine.forward import forward_for, greedy_ids
from engine.forward_timing import measured_once
from engine.sampling import SamplingConfig
from engine.step import commit, cut, eos_set, first_token, prefill_event, step_event, sync
from engine.tree import Draft, additive_mask, draft_visibility, host_mask, mask_storage, node_depths


@dataclass
class RowView:
    """One row of a batched target output, trimmed to that row's real inputs."""

    logits: torch.Tensor  # [1, S_b, V]
    hidden_states: tuple | None
    cache: Any = None
    layer_features: list = field(default_factory=list)  # inputs [1, S_b, H] of the drafter's feature layers


@dataclass
class BatchResult:
    tokens: list[list[int]]  # new tokens per row
    steps: list[int]  # verification steps each row took
    forwards: int  # batched target forwards (prefill included)
    wall_seconds: float
    draft_seconds: float
    verify_seconds: float
    verify_width: int = 0  # tokens per row summed over verification forwards (each forward is B x its width)
    batched_drafting: bool = False  # the drafter made one model call per depth for all rows (not one per row)
    prefills: int = 1  # prefill forwards among `forwards` (more than one where finished rows took waiting prompts)
    # per prompt, its own tokens in each of its verification forwards (pending token, draft, window): what the
    # batch sweep replays to predict other batch sizes (engine/bench/sweep.py: `replay`)
    row_widths: list[list[int]] = field(default_factory=list)

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
        layer_features=[f[b : b + 1, :length] for f in getattr(out, "layer_features", [])],
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
        variant: str = "batch",
        budget: FullBudget | None = None,
    ) -> None:
        """`budget`: how deep each step may draft, one cap for every row (engine/budget.py): `auto` learns from the
        batch's own step times, so where drafting stops paying at this batch size it drafts less, down to plain
        steps. Default: every step drafts in full."""
        if max_new_tokens < 1:
            raise GlanceError(f"max new tokens must be at least 1 (got {max_new_tokens})")
        self.target = target
        self.make_drafter = make_drafter or Drafter
        self.sampling = sampling or SamplingConfig()
        self.max_new_tokens = max_new_tokens
        if eos_token_ids is None:
            eos_token_ids = getattr(target.config, "eos_token_id", None)
        self.eos = eos_set(eos_token_ids)
        self.pad = pad_token_id
        self.feature_layers: tuple[int, ...] = ()  # set per run from the drafters
        self.variant = variant
        self.budget = budget if budget is not None else FullBudget()
        # With more prompts than rows: how many rows must be free before waiting prompts join them (None: half the
        # batch). Each join runs a prefill forward of its own (eager: about 10 ms of fixed cost on the bundled
        # target, three plain steps), so rows join in groups rather than one at a time (`stream`).
        self.join_rows: int | None = None
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype

    def _forward(
        self, ids: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor, cache, hidden: bool, logits_at=None
    ):
        """ids, positions: [B, S]; visible: [B, S, past + S] bool; logits at the new tokens `logits_at` (None: all)."""
        mask = additive_mask(visible, self.dtype, self.device)  # [B, 1, S, past + S]
        ids, positions = ids.to(self.device), positions.to(self.device)
        return self.forward(ids, cache, mask, positions, hidden, self.feature_layers, logits_at)

    def _step_inputs(
        self, drafts: list[Draft], pending: list[int], live: list[int], cached: list[int], S: int, cache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A verification forward's ids and positions [L, S] and additive mask [L, 1, S, width] for the batch rows
        `live` (row i decodes row live[i]: its pending token, draft and side tokens, right-padded to S). Row i sees its
        own cache entries [0, cached) and its draft's visibility among the new tokens at [past, past + S); padding
        sees itself only. Built in numpy, `width` the forward's own, so the forward takes the mask as it is: built
        with torch ops (a dozen a row) it took 0.2-0.4 ms a step at B = 4 on the bundled target."""
        past, L = cache.get_seq_length(), len(live)
        width = self.forward.mask_width(cache, S)
        storage, lowest = mask_storage(self.dtype)
        ids = np.full((L, S), self.pad, dtype=np.int64)
        positions = np.empty((L, S), dtype=np.int64)
        mask = np.full((L, S, width), lowest, dtype=storage)
        pad_rows = np.arange(S)
        for i, b in enumerate(live):
            d = drafts[b]
            n = 1 + len(d) + len(d.side_tokens)
            ids[i, 0] = pending[i]
            ids[i, 1:n] = d.tokens + d.side_tokens
            mask[i, :, : cached[b]] = 0
            mask[i, :n, past : past + n][draft_visibility(d.parents, d.side_visible).numpy()] = 0
            mask[i, pad_rows[n:], past + pad_rows[n:]] = 0  # padding sees itself only
            positions[i, 0] = cached[b]
            positions[i, 1:n] = np.add(node_depths(d.parents) + list(d.side_offsets), cached[b])
            positions[i, n:] = cached[b]
        mask_t = host_mask(mask, self.dtype)[:, None].to(self.device)  # [L, 1, S, width]
        return torch.from_numpy(ids).to(self.device), mask_t, torch.from_numpy(positions).to(self.device)

    @staticmethod
    def _drop_finished(cache, live: list[int], active: list[bool], cached: list[int]) -> list[int]:
        """The rows of `live` still decoding; the cache keeps only theirs. A finished row computed in every forward
        until the batch's last row finished: with speculative steps rows finish at different steps (at B = 4 on
        the bundled target lookahead's batches held 3.25 decoding rows a step on average, prompt lookup's 2.85)."""
        keep = [i for i, b in enumerate(live) if active[b]]
        if len(keep) == len(live) or not keep:
            return [live[i] for i in keep]
        keep_batch_rows(cache, keep)
        live = [live[i] for i in keep]
        crop(cache, max(cached[b] for b in live))
        return live

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], rows: int | None = None) -> BatchResult:
        """Decode every prompt to its end, `rows` at a time (see `stream`); the per-row step events are dropped."""
        for item in self.stream(prompts, rows):
            if isinstance(item, BatchResult):
                return item
        raise RuntimeError("stream ended without a result")

    def _prefill(self, prompts: list[list[int]], cache, hidden: bool) -> tuple[Any, list[int]]:
        """One right-padded forward over `prompts` into `cache` (row b's real tokens at columns 0..len_b - 1); the
        LM head runs on each prompt's last token only. Returns the output and those columns (sorted)."""
        lens = [len(p) for p in prompts]
        B, T = len(prompts), max(lens)
        ids = torch.full((B, T), self.pad, dtype=torch.long)
        visible = torch.zeros(B, T, T, dtype=torch.bool)
        positions = torch.zeros(B, T, dtype=torch.long)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
            visible[b, :, : len(p)] = causal[:, : len(p)]
            positions[b] = torch.arange(T).clamp(max=len(p) - 1)
        lasts = sorted({n - 1 for n in lens})  # (all rows get each)
        return self._forward(ids, visible, positions, cache, hidden, lasts), lasts

    @torch.no_grad()
    def stream(
        self, prompts: list[list[int]], rows: int | None = None
    ) -> Iterator[tuple[int, StepEvent] | BatchResult]:
        """(prompt index, StepEvent) for every prompt's prefill and verification steps, then the BatchResult. Events
        carry no per-token target probabilities (nothing renders batched rows token by token).

        `rows`: how many prompts decode at once (None: all of them). With fewer rows than prompts the batch decodes
        continuously, as a server does: once `join_rows` rows have finished, the next waiting prompts take them
        (prefilled together in a forward of their own, then added to the batch's cache), so the batch stays nearly
        full until the queue runs dry. Static batches would leave finished rows idle until the batch's slowest row
        ends, and speculative rows end at different steps."""
        if not prompts or any(not p for p in prompts):
            raise GlanceError("every prompt of a batch needs at least one token")
        if rows is not None and rows < 1:
            raise GlanceError(f"a batch needs at least one row (got {rows})")
        N = len(prompts)
        B = min(rows or N, N)
        budget_on = self.budget.name != "full"

        def new_drafter() -> Drafter:
            d = self.make_drafter()
            if budget_on:  # cost-aware: lookahead's windows sized to the batch's forward cost
                d.fit_batch(B, lambda widths: measured_once(self.target, B, widths))
            return d

        drafters = [new_drafter() for _ in range(B)]
        budget = self.budget if drafters[0].budgeted_in_batch(B) else FullBudget()
        budget.reset(remembered(self.target, drafters[0], B, self.sampling))
        budget.price_forwards(lambda widths: measured_once(self.target, B, widths))
        hidden = drafters[0].needs_hidden_states
        self.feature_layers = drafters[0].feature_layers
        gens = [torch.Generator().manual_seed(self.sampling.seed + p) for p in range(N)]
        run_ids = [uuid.uuid4().hex[:12] for _ in range(N)]
        longest = max(len(p) for p in prompts) + self.max_new_tokens
        extra = drafters[0].extra_positions
        check_window(self.target.config, longest + extra)
        drafters[0].check_context(longest)
        self.forward = forward_for(self.target)  # eager, or compiled when compile_model compiled the target
        cache = self.forward.new_cache(longest + extra)
        sync(self.device)
        t0 = time.perf_counter()

        waiting = list(range(B, N))  # prompts not started yet, in order
        slot = list(range(B))  # slot[b]: the prompt row b decodes
        states: list[DecodeState | None] = [None] * B
        new: list[list[int]] = [[] for _ in range(N)]
        active = [False] * B
        cached = [0] * B  # row b's cache length: every committed token but the pending one

        def start(b: int, q: int, out, j: int, lasts: list[int]) -> None:
            """Row b starts prompt q from row j of a prefill's output: its first token, state and drafter."""
            p = prompts[q]
            first = first_token(out.logits[j, lasts.index(len(p) - 1)].float(), self.sampling, gens[q])
            state = DecodeState(list(p) + [first], len(p), self.sampling, gens[q], _row_view(out, j, len(p)))
            drafters[b].begin(state)
            slot[b], states[b], cached[b], new[q] = q, state, len(p), [first]
            active[b] = cut([first], self.max_new_tokens, self.eos)[1] is None

        out, lasts = self._prefill(prompts[:B], cache, hidden)
        prefills = 1
        for b in range(B):
            start(b, b, out, b, lasts)
        sync(self.device)
        prefill_s = time.perf_counter() - t0
        for b in range(B):
            yield b, prefill_event(run_ids[b], self.variant, new[b][0], prefill_s)
        live = list(range(B))  # the rows in the target's batch, in order (finished rows leave it)
        drafting = type(drafters[0]).batch_drafting(drafters)  # row by row, or one model call per depth for all
        fresh: set[int] = set()  # rows that took a waiting prompt and have not drafted for it yet
        join = self.join_rows or -(-B // 2)

        def refill() -> Iterator[tuple[int, StepEvent]]:
            """Waiting prompts take the rows that finished, once `join` of them are free (or every row is, or the
            queue's last prompts can go): their prefill events. Rows that finished leave the batch (`live`)."""
            nonlocal prefills, prefill_s, live
            while waiting:
                live = self._drop_finished(cache, live, active, cached)  # a joined prompt may end at its first token
                freed = [b for b in range(B) if not active[b]][: len(waiting)]  # none of them in the batch now
                if not freed or (live and len(freed) < min(join, len(waiting))):
                    break
                t = time.perf_counter()
                taken = [waiting.pop(0) for _ in freed]
                own = self.forward.new_cache(longest + extra)  # the joining prompts' own cache, then the batch's rows
                out, lasts = self._prefill([prompts[q] for q in taken], own, hidden)
                if not live:
                    keep_batch_rows(cache, [])  # the batch had ended: the new rows make it
                write_rows(cache, own, list(range(len(live), len(live) + len(freed))), list(range(len(freed))))
                live = live + freed  # their cache rows follow the others'
                prefills += 1
                for j, (b, q) in enumerate(zip(freed, taken)):
                    drafters[b] = new_drafter()
                    drafting.replace(b, drafters[b])
                    start(b, q, out, j, lasts)
                    fresh.add(b)
                sync(self.device)
                seconds = time.perf_counter() - t
                prefill_s += seconds
                for q in taken:
                    yield q, prefill_event(run_ids[q], self.variant, new[q][0], seconds)
            live = self._drop_finished(cache, live, active, cached)

        yield from refill()
        steps = [0] * N
        row_widths: list[list[int]] = [[] for _ in range(N)]
        forwards = 0  # verification forwards
        draft_s = verify_s = 0.0
        width = 0

        while live:
            ts = time.perf_counter()
            left = [self.max_new_tokens - len(new[q]) - 1 for q in slot]
            cap = budget.choose(max(left[b] for b in live))  # None: as deep as the drafters allow
            drafts = drafting.propose(states, [n if cap is None else min(n, cap) for n in left], active)
            if budget.narrow:
                drafts = [d.spine() for d in drafts]  # the greedy chain of every row's tree
            joined = {b for b in fresh if len(drafts[b])}  # rows whose drafter read its new prompt in this draft
            fresh -= joined
            sync(self.device)
            tv = time.perf_counter()
            sizes = [1 + len(d) + len(d.side_tokens) for d in drafts]
            S, past = max(sizes[b] for b in live), cache.get_seq_length()
            width += S
            pending = [states[b].tokens[-1] for b in live]
            ids, mask, positions = self._step_inputs(drafts, pending, live, cached, S, cache)
            out = self.forward(ids, cache, mask, positions, hidden, self.feature_layers)
            forwards += 1
            outcomes, moved_rows, src, dst = {}, [], [], []
            greedy = self.sampling.greedy or any(d.side_tokens for d in drafts)
            best_rows = greedy_ids(out).tolist() if greedy else None  # [L][S]: every row's argmax, one transfer
            for i, b in enumerate(live):
                d, q = drafts[b], slot[b]
                logits = out.logits[i, : 1 + len(d)]  # [1 + n, V], model dtype: side rows are the drafter's
                best = best_rows[i][: sizes[b]] if best_rows else None
                left = self.max_new_tokens - len(new[q])
                step = commit(d, logits, self.sampling, gens[q], left, self.eos, best and best[: 1 + len(d)])
                for j, r in enumerate(step.rows):  # the pending token and the accepted path, after the row's prefix
                    if past + r != cached[b] + j:
                        moved_rows.append(i)
                        src.append(past + r)
                        dst.append(cached[b] + j)
                cached[b] += len(step.rows)
                active[b] = step.stop is None
                states[b].tokens.extend(step.tokens)
                states[b].target_out = _row_view(out, i, sizes[b])
                states[b].rows = step.rows
                states[b].side_logits = out.logits[i, 1 + len(d) : sizes[b]] if d.side_tokens else None
                states[b].side_best = best[1 + len(d) :] if d.side_tokens else None
                new[q].extend(step.tokens)
                steps[q] += 1
                row_widths[q].append(sizes[b])
                outcomes[b] = step
            # every row keeps its prefix in place; entries past a row's own length are stale and masked
            move_row_entries(cache, moved_rows, src, dst, max(cached[b] for b in live))
            live = self._drop_finished(cache, live, active, cached)
            sync(self.device)
            tu = time.perf_counter()
            for b, step in outcomes.items():
                drafters[b].update(states[b], drafts[b], step.accepted)
            sync(self.device)
            te = time.perf_counter()
            d_s, v_s = (tv - ts) + (te - tu), tu - tv
            paths = [step.accepted for step in outcomes.values()]
            # a step in which a row's drafter read its new prompt is priced by nobody (as a run's first draft)
            accepted = [len(p) for p in paths]
            budget.observe_rows(cap, [drafts[b] for b in outcomes], accepted, d_s, v_s, paths, timed=not joined)
            draft_s += d_s
            verify_s += v_s
            clock = prefill_s + draft_s + verify_s
            for b, step in outcomes.items():
                q = slot[b]
                yield q, step_event(run_ids[q], self.variant, steps[q], drafts[b], step, d_s, v_s, clock, len(new[q]))
            yield from refill()
        budget.finish()
        wall = prefill_s + draft_s + verify_s
        batched = not isinstance(drafting, RowByRow)
        yield BatchResult(
            new, steps, forwards + prefills, wall, draft_s, verify_s, width, batched, prefills, row_widths
        )
