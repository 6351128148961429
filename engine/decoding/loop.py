"""The speculative loop every method shares, for B rows at once (one row is a batch of one): prefill, then
propose -> verify -> commit until every row stops.

Invariant between steps: row b's cache holds KV for its committed tokens but the last ("pending") one, at columns
0..cached[b] - 1. A step runs the target once over every decoding row's [pending] + draft nodes (+ side tokens),
right-padded to the longest, under each row's tree mask; each row keeps its own accepted path, moved right after its
own prefix (`move_row_entries`), and its bonus token becomes its new pending token. Rows advance by different amounts;
a row that finished leaves the target's batch. Given more prompts than rows, finished rows take waiting prompts
(continuous batching). Masks, cache repair, the budget's feedback and the events come from here for every B.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from engine.budget.draft_budget import DraftBudget, FullBudget, remembered
from engine.decoding.sampling import SamplingConfig, logits_to_probs
from engine.decoding.step import commit, cut, eos_set, first_token, prefill_event, step_event, sync
from engine.decoding.tree import Draft, additive_mask, draft_visibility, host_mask, mask_storage, node_depths
from engine.drafters.base import DecodeState, Drafter
from engine.errors import GlanceError, reason
from engine.records.events import BudgetNote, RunSummary, StepEvent
from engine.records.stats import RunStats
from engine.registry import traits
from engine.runtime.cache import (
    check_editable,
    check_window,
    committed_kv,
    crop,
    is_recurrent,
    keep_batch_rows,
    move_row_entries,
    recurrent_snapshot,
    restore_recurrent,
    write_rows,
)
from engine.runtime.forward import forward_for, greedy_ids
from engine.runtime.forward_timing import measured_once


def chain_only(d: Draft) -> Draft:
    """A draft's greedy spine without a side branch: what a recurrent target can verify in one forward."""
    d = d.spine()
    if not d.side_tokens:
        return d
    return Draft(d.tokens, d.parents, d.q_probs, d.notes, d.typical)


TOP_TOKENS = 5  # the target's top tokens an event carries per emitting row (tooltips, the step inspector)
CancelCheck = Callable[[], bool] | threading.Event | None


def _is_cancelled(cancel: CancelCheck) -> bool:
    if cancel is None:
        return False
    return cancel.is_set() if isinstance(cancel, threading.Event) else bool(cancel())


@dataclass
class RowView:
    """One row of a batched target output, trimmed to that row's real inputs: what a drafter reads."""

    logits: torch.Tensor  # [1, S_b, V]
    hidden_states: tuple | None
    cache: Any = None  # the batch's target cache (every row's entries)
    layer_features: list = field(default_factory=list)  # inputs [1, S_b, H] of the drafter's feature layers


def _row_view(out, b: int, length: int, cache=None) -> RowView:
    hidden = getattr(out, "hidden_states", None)
    return RowView(
        out.logits[b : b + 1, :length],
        tuple(h[b : b + 1, :length] for h in hidden) if hidden is not None else None,
        cache,
        [f[b : b + 1, :length] for f in getattr(out, "layer_features", [])],
    )


@dataclass
class BatchResult:
    tokens: list[list[int]]  # new tokens per prompt
    steps: list[int]  # verification steps each prompt took
    forwards: int  # batched target forwards (prefills included)
    wall_seconds: float
    draft_seconds: float
    verify_seconds: float
    verify_width: int = 0  # tokens per row summed over verification forwards (each forward is B x its width)
    prefills: int = 1  # prefill forwards among `forwards` (more than one where finished rows took waiting prompts)
    # per prompt, its own tokens in each of its verification forwards (pending token, draft, window): what the
    # batch sweep replays to predict other batch sizes (engine/bench/sweep.py: `replay`)
    row_widths: list[list[int]] = field(default_factory=list)
    stops: list[str | None] = field(default_factory=list)  # per prompt: "eos", "max_new_tokens" or "cancelled"
    prefill_seconds: float = 0.0
    budget: str = "full"  # what sized the drafts

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


@dataclass
class GenerationResult:
    tokens: list[int]
    summary: RunSummary
    events: list[StepEvent]


class Decoder:
    """One target, one drafter (serving every row), one sampling setting. `stream(prompts, rows)` decodes a batch;
    `run(prompt)` one prompt, its events then its RunSummary."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None = None,
        sampling: SamplingConfig | None = None,
        max_new_tokens: int = 64,
        eos_token_ids: list[int] | int | None = None,
        variant: str | None = None,
        details: bool = True,
        budget: FullBudget | None = None,
        pad_token_id: int = 0,
    ):
        """`details`: give every event the target's probability of each emitted token and its top tokens per
        verified row (tooltips, the step inspector); benchmarks turn it off, it costs a softmax and a top-k.
        `budget`: how deep each step may draft (engine/budget; default: as deep as the drafter's settings)."""
        if max_new_tokens < 1:
            raise GlanceError(f"max new tokens must be at least 1 (got {max_new_tokens})")
        self.target = target
        self.drafter = drafter or Drafter()
        self.sampling = sampling or SamplingConfig()
        self.max_new_tokens = max_new_tokens
        if eos_token_ids is None:
            eos_token_ids = getattr(target.config, "eos_token_id", None)
        self.eos = eos_set(eos_token_ids)
        self.variant = variant or self.drafter.name
        self.recurrent = False  # set per run: whether the target keeps recurrent state (see _replay)
        self.details = details
        self.pad = pad_token_id
        self.given_budget = budget if budget is not None else FullBudget()
        self.traits = traits(self.drafter.name)
        self._budgets: dict[int, FullBudget] = {}  # per batch size: the budget runs of that many rows take
        # With more prompts than rows: how many rows must be free before waiting prompts join them (None: half the
        # batch). Each join runs a prefill forward of its own, so rows join in groups rather than one at a time.
        self.join_rows: int | None = None
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype

    @property
    def cost_aware(self) -> bool:
        return self.given_budget.name != "full"

    def budget_for(self, rows: int) -> FullBudget:
        """The budget a run of `rows` rows takes, as the drafter's spec declares (BudgetTraits): the given one, a
        window gate (lookahead at one row), or a full one where no cap may reach the drafts."""
        if rows not in self._budgets:
            t, budget = self.traits, self.given_budget
            if t.depth_cap == "never" or (t.depth_cap == "batches" and rows == 1):
                budget = FullBudget()
            if self.cost_aware and t.window and rows == 1:
                budget = DraftBudget(window=(self.drafter.row_tokens, self.drafter.take_guessed))
            self._budgets[rows] = budget
        return self._budgets[rows]

    def check_fits(self, prompt_tokens: int) -> None:
        """GlanceError when a run of this prompt length would reach past the target's or the drafter's context."""
        check_window(self.target.config, prompt_tokens + self.max_new_tokens + self.drafter.extra_positions)
        self.drafter.check_context(prompt_tokens + self.max_new_tokens)

    def _forward_costs(self, rows: int, cancel: Callable[[], bool] | None = None):
        """The target's steady forward seconds per token count at `rows` rows, measured once a session."""
        return lambda widths: measured_once(self.target, rows, widths, cancel)

    @torch.no_grad()
    def time_forwards(self, cancel: Callable[[], bool] | None = None) -> None:
        """Time the target forwards that sizing one-row drafts reads (lookahead's window widths, the budget's spine
        widths: measured once a session), so that a run started later does not wait for them."""
        costs = self._forward_costs(1, cancel)
        if self.cost_aware and self.traits.window:
            self.drafter.fit_window(1, costs)
        self.budget_for(1).price_forwards(costs)

    def _target_view(self, logits: torch.Tensor, tokens: list[int], rows: list[int]):
        """The target's probability of each emitted token and its top tokens, at the rows that emitted them (softmax
        at T=1 when greedy), for tooltips and the step inspector; (None, None) without `details`. logits: [1 + n, V]."""
        if not self.details:
            return None, None
        cfg = self.sampling if not self.sampling.greedy else SamplingConfig(temperature=1.0)
        probs = logits_to_probs(logits[rows], cfg)  # [k, V]: only the emitting rows
        emitted = probs[torch.arange(len(rows)), torch.tensor(tokens, device=probs.device)]
        top_p, top_i = probs.topk(min(TOP_TOKENS, probs.shape[-1]), dim=-1)  # [k, TOP]
        emitted, top_p, top_i = emitted.tolist(), top_p.tolist(), top_i.tolist()  # to the host once each
        top: list[list] = [[] for _ in range(max(rows) + 1)]
        for j, r in enumerate(rows):
            top[r] = [[i, round(q, 5)] for i, q in zip(top_i[j], top_p[j])]
        return [round(q, 5) for q in emitted], top

    def _recurrent(self, prompts: int) -> bool:
        """Whether the target keeps recurrent state (a hybrid model's Mamba or Gated DeltaNet layers), which the loop
        undoes by replay; one GlanceError, before anything runs, for what it cannot do yet."""
        cache = forward_for(self.target).new_cache(1)
        check_editable(cache, recurrent_ok=True)  # sliding or quantized layers: refused here, in one line
        layers = getattr(cache, "layers", [])
        if not any(is_recurrent(layer) for layer in layers):
            return False
        if not any(isinstance(layer, DynamicLayer) for layer in layers):  # attention-free: does its cache run?
            try:
                one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
                self.target(input_ids=one, cache=cache, use_cache=True, position_ids=one)
            except Exception as exc:  # transformers' own cached forward (Jamba with only Mamba layers, say)
                raise GlanceError(
                    f"this model has no attention layer and its own cached forward fails ({reason(exc, 120)})"
                ) from None
        if prompts > 1:  # a batch, or prompts taking a finished row's place: the state would need moving per row
            raise GlanceError(
                f"this model keeps recurrent state (Mamba or Gated DeltaNet layers): Glance decodes it "
                f"one prompt at a time (asked for {prompts} together)"
            )
        return True

    def _replay(self, cache, before: list, past: int, kept: torch.Tensor) -> None:
        """Undo a verification forward on a recurrent target: its states back to `before`, the attention entries to
        the `past` it started from, then one forward over the tokens it kept (the pending one and the accepted
        drafts, kept [1, n]) writes both again, exactly as plain decoding would have left them."""
        restore_recurrent(before)
        crop(cache, past)
        positions = torch.arange(past, past + kept.shape[1], device=kept.device)[None]
        self.forward(kept, cache, None, positions, logits_at=[kept.shape[1] - 1])

    def _step_inputs(
        self,
        drafts: list[Draft],
        pending: list[int],
        live: list[int],
        cached: list[int],
        S: int,
        cache,
        recurrent: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """A verification forward's ids [L, S], additive mask [L, 1, S, width] and positions [L, S] for the rows
        `live` (row i decodes row live[i]: its pending token, draft and side tokens, right-padded to S). Row i sees
        its own cache entries [0, cached) and its draft's visibility among the new tokens at [past, past + S);
        padding sees itself only. Built in numpy, `width` the forward's own; one row's plain step needs no mask."""
        past, L = (cached[live[0]] if recurrent else cache.get_seq_length()), len(live)
        ids = np.full((L, S), self.pad, dtype=np.int64)
        if (S == 1 or recurrent) and L == 1 and cached[live[0]] == past:  # one row's chain: causal, no mask
            d = drafts[live[0]]
            ids[0, : 1 + len(d)] = [pending[0], *d.tokens]
            # a recurrent target gets its positions: an all-recurrent cache cannot count its own
            positions = torch.arange(past, past + S, device=self.device)[None] if recurrent else None
            return torch.from_numpy(ids).to(self.device), None, positions
        width = self.forward.mask_width(cache, S)
        storage, lowest = mask_storage(self.dtype)
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

    def _prefill(self, prompts: list[list[int]], cache) -> tuple[Any, list[int]]:
        """One right-padded forward over `prompts` into `cache` (row b's real tokens at columns 0..len_b - 1); the
        LM head runs on each prompt's last token only. Returns the output and those columns (sorted)."""
        lens = [len(p) for p in prompts]
        B, T = len(prompts), max(lens)
        lasts = sorted({n - 1 for n in lens})  # (all rows get each)
        hidden, layers = self.drafter.needs_hidden_states, self.drafter.feature_layers
        if B == 1:  # causal over the prompt, as a forward is by default
            ids = torch.tensor(prompts, device=self.device)
            positions = torch.arange(T, device=self.device)[None] if self.recurrent else None  # (see _step_inputs)
            return self.forward(ids, cache, None, positions, hidden, layers, lasts), lasts
        ids = torch.full((B, T), self.pad, dtype=torch.long)
        visible = torch.zeros(B, T, T, dtype=torch.bool)
        positions = torch.zeros(B, T, dtype=torch.long)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
            visible[b, :, : len(p)] = causal[:, : len(p)]
            positions[b] = torch.arange(T).clamp(max=len(p) - 1)
        mask = additive_mask(visible, self.dtype, self.device)  # [B, 1, T, T]
        out = self.forward(ids.to(self.device), cache, mask, positions.to(self.device), hidden, layers, lasts)
        return out, lasts

    @staticmethod
    def _drop_finished(cache, live: list[int], active: list[bool], cached: list[int]) -> list[int]:
        """The rows of `live` still decoding; the cache keeps only theirs (with speculative steps rows finish at
        different steps, and a finished row would compute in every forward until the last one finished)."""
        keep = [i for i, b in enumerate(live) if active[b]]
        if len(keep) == len(live) or not keep:
            return [live[i] for i in keep]
        keep_batch_rows(cache, keep)
        live = [live[i] for i in keep]
        crop(cache, max(cached[b] for b in live))
        return live

    @torch.no_grad()
    def stream(
        self, prompts: list[list[int]], rows: int | None = None, cancel: CancelCheck = None
    ) -> Iterator[tuple[int, StepEvent] | BatchResult]:
        """(prompt index, StepEvent) for every prompt's prefill and verification steps, then the BatchResult.

        `rows`: how many prompts decode at once (None: all of them). With fewer rows than prompts the batch decodes
        continuously, as a server does: once `join_rows` rows have finished, the next waiting prompts take them
        (prefilled together in a forward of their own, then added to the batch's cache)."""
        if not prompts or any(not p for p in prompts):
            raise GlanceError("the prompt is empty: give at least one token of text")
        if rows is not None and rows < 1:
            raise GlanceError(f"a batch needs at least one row (got {rows})")
        N = len(prompts)
        B = min(rows or N, N)
        drafter = self.drafter
        recurrent = self._recurrent(N)  # before anything runs: what a recurrent target cannot do is refused now
        self.recurrent = recurrent  # the run's summary says so (its trees verified as chains, rejections replayed)
        costs = self._forward_costs(B)
        if self.cost_aware and self.traits.window:  # lookahead's window fitted to the target's forward costs
            drafter.fit_window(B, costs)
        longest = max(len(p) for p in prompts)
        self.check_fits(longest)
        drafter.reset(B)
        budget = self.budget_for(B)
        budget.reset(remembered(self.target, drafter, B, self.sampling))
        budget.price_forwards(costs)
        gens = [torch.Generator().manual_seed(self.sampling.seed + p) for p in range(N)]
        run_ids = [uuid.uuid4().hex[:12] for _ in range(N)]
        self.forward = forward_for(self.target)  # eager, or compiled when compile_model compiled the target
        capacity = longest + self.max_new_tokens + drafter.extra_positions
        cache = self.forward.new_cache(capacity)
        sync(self.device)
        t0 = time.perf_counter()

        waiting = list(range(B, N))  # prompts not started yet, in order
        slot = list(range(B))  # slot[b]: the prompt row b decodes
        states: list[DecodeState | None] = [None] * B
        new: list[list[int]] = [[] for _ in range(N)]
        stops: list[str | None] = [None] * N
        active = [False] * B
        cached = [0] * B  # row b's cache length: every committed token but the pending one
        firsts: dict[int, tuple] = {}  # prompt -> the details of its first token

        def start(b: int, q: int, out, j: int, lasts: list[int]) -> None:  # (prefill details inside its clock)
            """Row b starts prompt q from row j of a prefill's output: its first token, state and drafter row."""
            p = prompts[q]
            logits = out.logits[j, lasts.index(len(p) - 1)].float()  # [V]
            first = first_token(logits, self.sampling, gens[q])
            state = DecodeState(list(p) + [first], len(p), self.sampling, gens[q], _row_view(out, j, len(p)))
            drafter.begin(b, state)
            slot[b], states[b], cached[b], new[q] = q, state, len(p), [first]
            stops[q] = cut([first], self.max_new_tokens, self.eos)[1]
            active[b] = stops[q] is None
            firsts[q] = self._target_view(logits[None], [first], [0])

        def prefilled(taken: list[int], seconds: float) -> Iterator[tuple[int, StepEvent]]:
            for q in taken:
                yield q, prefill_event(run_ids[q], self.variant, new[q][0], seconds, *firsts.pop(q))

        out, lasts = self._prefill(prompts[:B], cache)
        prefills = 1
        for b in range(B):
            start(b, b, out, b, lasts)
        sync(self.device)
        prefill_s = time.perf_counter() - t0
        yield from prefilled(list(range(B)), prefill_s)
        live = list(range(B))  # the rows in the target's batch, in order (finished rows leave it)
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
                own = self.forward.new_cache(capacity)  # the joining prompts' own cache, then the batch's rows
                out, lasts = self._prefill([prompts[q] for q in taken], own)
                if not live:
                    keep_batch_rows(cache, [])  # the batch had ended: the new rows make it
                write_rows(cache, own, list(range(len(live), len(live) + len(freed))), list(range(len(freed))))
                live = live + freed  # their cache rows follow the others'
                prefills += 1
                for j, (b, q) in enumerate(zip(freed, taken)):
                    start(b, q, out, j, lasts)
                    fresh.add(b)
                sync(self.device)
                seconds = time.perf_counter() - t
                prefill_s += seconds
                yield from prefilled(taken, seconds)
            live = self._drop_finished(cache, live, active, cached)

        yield from refill()
        steps = [0] * N
        row_widths: list[list[int]] = [[] for _ in range(N)]
        forwards = 0  # verification forwards
        draft_s = verify_s = 0.0
        width = 0
        traits = self.traits

        while live:
            if _is_cancelled(cancel):
                for b in live:
                    stops[slot[b]] = "cancelled"
                break
            ts = time.perf_counter()
            left = [self.max_new_tokens - len(new[q]) - 1 for q in slot]
            cap = budget.choose(max(left[b] for b in live))  # None: as deep as the drafter allows
            if drafter.context_layers:  # the target's own keys and values, for a drafter that attends to them
                for i, b in enumerate(live):
                    states[b].context = committed_kv(cache, drafter.context_layers, i, cached[b])
            drafts = drafter.propose(
                [s if active[b] else None for b, s in enumerate(states)],
                [n if cap is None else min(n, cap) for n in left],
            )
            if budget.narrow:
                drafts = [d.spine() for d in drafts]  # the greedy chain of every row's tree
            if recurrent:  # a recurrence reads its inputs in order, whatever the mask: chains only, no side branch
                drafts = [chain_only(d) for d in drafts]
            for matches, first in drafter.hindsight():
                budget.hindsight(matches, first, depth=traits.hindsight_depth)
            joined = {b for b in fresh if len(drafts[b])}  # rows whose drafter read its new prompt in this draft
            fresh -= joined
            sync(self.device)
            tv = time.perf_counter()
            sizes = [1 + len(d) + len(d.side_tokens) for d in drafts]
            S = max(sizes[b] for b in live)
            past = cached[live[0]] if recurrent else cache.get_seq_length()  # (one row; an all-recurrent cache)
            width += S
            pending = [states[b].tokens[-1] for b in live]
            ids, mask, positions = self._step_inputs(drafts, pending, live, cached, S, cache, recurrent)
            hidden, layers = drafter.needs_hidden_states, drafter.feature_layers
            before = recurrent_snapshot(cache) if recurrent else None
            out = self.forward(ids, cache, mask, positions, hidden, layers)
            forwards += 1
            outcomes, moved_rows, src, dst = {}, [], [], []
            greedy = self.sampling.greedy or any(d.side_tokens for d in drafts)
            best_rows = greedy_ids(out).tolist() if greedy else None  # [L][S]: every row's argmax, one transfer
            for i, b in enumerate(live):
                d, q = drafts[b], slot[b]
                logits = out.logits[i, : 1 + len(d)]  # [1 + n, V], model dtype: side rows are the drafter's
                best = best_rows[i][: sizes[b]] if best_rows else None
                step = commit(d, logits, self.sampling, gens[q], left[b] + 1, self.eos, best and best[: 1 + len(d)])
                for j, r in enumerate(step.rows):  # the pending token and the accepted path, after the row's prefix
                    if past + r != cached[b] + j:
                        moved_rows.append(i)
                        src.append(past + r)
                        dst.append(cached[b] + j)
                cached[b] += len(step.rows)
                active[b] = step.stop is None
                stops[q] = step.stop
                state = states[b]
                state.tokens.extend(step.tokens)
                state.target_out = _row_view(out, i, sizes[b], cache)
                state.rows = step.rows
                state.side_logits = out.logits[i, 1 + len(d) : sizes[b]] if d.side_tokens else None
                state.side_best = best[1 + len(d) :] if d.side_tokens else None
                new[q].extend(step.tokens)
                steps[q] += 1
                row_widths[q].append(sizes[b])
                outcomes[b] = (step, logits)
            if before is not None and len(outcomes[live[0]][0].rows) < S:  # (one row) drafts were rejected
                self._replay(cache, before, past, ids[:, : len(outcomes[live[0]][0].rows)])
            # every row keeps its prefix in place; entries past a row's own length are stale and masked
            move_row_entries(cache, moved_rows, src, dst, max(cached[b] for b in live))
            live = self._drop_finished(cache, live, active, cached)
            sync(self.device)
            tu = time.perf_counter()
            for b, (step, _) in outcomes.items():
                drafter.update(b, states[b], drafts[b], step.accepted)
            sync(self.device)
            te = time.perf_counter()
            d_s, v_s = (tv - ts) + (te - tu), tu - tv
            paths = [step.accepted for step, _ in outcomes.values()]
            # a step in which a row's drafter read its new prompt is priced by nobody (as a run's first draft)
            accepted = [len(p) for p in paths]
            budget.observe_rows(cap, [drafts[b] for b in outcomes], accepted, d_s, v_s, paths, timed=not joined)
            draft_s += d_s
            verify_s += v_s
            clock = prefill_s + draft_s + verify_s
            for b, (step, logits) in outcomes.items():  # the details after the clock: no drafter pays for them
                q = slot[b]
                probs, top = self._target_view(logits, step.tokens, step.rows)
                event = step_event(
                    run_ids[q], self.variant, steps[q], drafts[b], step, d_s, v_s, clock, len(new[q]), probs, top
                )
                if budget.name != "full":
                    event.budget = BudgetNote(cap, budget.narrow)  # what the budget allowed this step
                yield q, event
            yield from refill()
        budget.finish()
        wall = prefill_s + draft_s + verify_s
        yield BatchResult(
            new,
            steps,
            forwards + prefills,
            wall,
            draft_s,
            verify_s,
            width,
            prefills,
            row_widths,
            stops,
            prefill_s,
            self.given_budget.name if self.cost_aware else budget.name,
        )

    def run(self, prompt_ids: list[int], cancel: CancelCheck = None) -> Iterator[StepEvent | RunSummary]:
        """One prompt: its StepEvents as they happen, then its RunSummary."""
        stats, run_id = RunStats(), ""
        for item in self.stream([prompt_ids], 1, cancel):
            if isinstance(item, BatchResult):
                yield self._summary(item, stats, run_id, len(prompt_ids))
                return
            stats.add(item[1])
            run_id = item[1].run_id
            yield item[1]

    def _summary(self, res: BatchResult, stats: RunStats, run_id: str, prompt_tokens: int) -> RunSummary:
        wall, tokens = res.wall_seconds, res.tokens[0]
        return RunSummary(
            run_id=run_id,
            variant=self.variant,
            prompt_tokens=prompt_tokens,
            token_ids=tokens,
            new_tokens=len(tokens),
            steps=res.steps[0],
            target_forwards=res.forwards,
            mean_accepted_length=stats.tau,
            acceptance_rate=stats.acceptance,
            acceptance_by_depth=stats.acceptance_by_depth,
            tokens_per_second=len(tokens) / wall if wall > 0 else 0.0,
            wall_seconds=wall,
            prefill_seconds=res.prefill_seconds,
            draft_seconds=res.draft_seconds,
            verify_seconds=res.verify_seconds,
            stop_reason=res.stops[0],
            approximate=self.drafter.approximate and not self.sampling.greedy,
            settings={
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "seed": self.sampling.seed,
                "max_new_tokens": self.max_new_tokens,
                "draft_budget": res.budget,
                **self.drafter.settings(),
                **({"state_rollback": "replay", "verified": "greedy chains"} if self.recurrent else {}),
            },
        )

    def generate(self, prompt_ids: list[int], cancel: CancelCheck = None) -> GenerationResult:
        """One prompt to its end: its tokens, summary and events."""
        events: list[StepEvent] = []
        for item in self.run(prompt_ids, cancel):
            if isinstance(item, RunSummary):
                return GenerationResult(item.token_ids, item, events)
            events.append(item)
        raise RuntimeError("run ended without a summary")

    def generate_batch(self, prompts: list[list[int]], rows: int | None = None) -> BatchResult:
        """Every prompt to its end, `rows` at a time (see `stream`); the events are dropped."""
        for item in self.stream(prompts, rows):
            if isinstance(item, BatchResult):
                return item
        raise RuntimeError("stream ended without a result")
