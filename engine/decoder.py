"""The speculative loop every variant shares: prefill once, then propose -> verify -> commit until a stop.

Invariant between steps: the target cache holds KV for every committed token but the last ("pending") one. A step
runs the target once over [pending] + draft nodes with a tree mask, keeps the accepted path, and compacts the cache
to the pending token plus that path; the bonus token becomes the new pending token.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from engine.budget import FullBudget, remembered
from engine.cache import cache_length, check_window, compact_tail
from engine.drafters.base import DecodeState, Drafter
from engine.errors import GlanceError
from engine.events import RunSummary, StepEvent
from engine.forward import forward_for, greedy_ids
from engine.forward_timing import measured_once
from engine.sampling import SamplingConfig, logits_to_probs
from engine.stats import RunStats
from engine.step import commit, cut, eos_set, first_token, prefill_event, step_event, sync
from engine.tree import Draft, tree_attention_mask, tree_position_ids

TOP_TOKENS = 5
CancelCheck = Callable[[], bool] | threading.Event | None


def _is_cancelled(cancel: CancelCheck) -> bool:
    if cancel is None:
        return False
    return cancel.is_set() if isinstance(cancel, threading.Event) else bool(cancel())


@dataclass
class GenerationResult:
    tokens: list[int]
    summary: RunSummary
    events: list[StepEvent]


class Decoder:
    """One target, one drafter, one sampling setting. `stream()` yields StepEvents and finally a RunSummary."""

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
    ):
        """`details`: give every event the target's probability of each emitted token and its top tokens per
        verified row (tooltips, the step inspector); benchmarks turn it off, it costs a softmax and a top-k.
        `budget`: how deep each step may draft (engine/budget.py; default: as deep as the drafter's settings)."""
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
        self.details = details
        self.budget = self.drafter.budget_for(budget)
        self.cost_aware = budget is not None and budget.name != "full"  # lookahead sizes its window (fit_batch)
        self.budget_name = budget.name if self.cost_aware else self.budget.name  # what sized this run's drafts
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype

    def check_fits(self, prompt_tokens: int) -> None:
        """GlanceError when a run of this prompt length would reach past the target's or the drafter's context."""
        check_window(self.target.config, prompt_tokens + self.max_new_tokens + self.drafter.extra_positions)
        self.drafter.check_context(prompt_tokens + self.max_new_tokens)

    def _forward(self, ids: torch.Tensor, cache, draft: Draft | None = None, logits_at: list[int] | None = None):
        """Target forward over `ids` [1, S]; with a draft, ids are [pending] + tree nodes + side tokens under the
        draft's mask and positions."""
        mask = positions = None
        if draft is not None and (len(draft) or draft.side_tokens):
            past = cache_length(cache)
            width = self.forward.mask_width(cache, ids.shape[1])  # the forward's own width: no padding after
            mask = tree_attention_mask(draft.parents, past, self.dtype, self.device, draft.side_visible, width)
            positions = tree_position_ids(draft.parents, past, self.device, draft.side_offsets)
        hidden, layers = self.drafter.needs_hidden_states, self.drafter.feature_layers
        return self.forward(ids, cache, mask, positions, hidden, layers, logits_at)

    def _target_view(self, logits: torch.Tensor, tokens: list[int], rows: list[int]):
        """The target's probability of each emitted token and its top tokens, at the rows that emitted them (the
        pending token's and the accepted path's; softmax at T=1 when greedy), for tooltips and the step inspector.
        Rows no token came from stay empty: their softmax and top-k were the bulk of the cost on large trees.
        Nothing without `details`. logits: [1 + n, V]."""
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

    @torch.no_grad()
    def time_forwards(self, cancel: Callable[[], bool] | None = None) -> None:
        """Time the target forwards that sizing this decoder's drafts reads (lookahead's window widths, the budget's
        spine widths: `measured_once`, once a session), so that a run started later does not wait for them. A
        session's first run spent 0.53 s (the first budgeted method) and 1.46 s (lookahead) there on the bundled target,
        compiled, on the bf16 EPYC; 14 s in all on SmolLM2-135M, eager."""
        if self.cost_aware:
            self.drafter.fit_batch(1, lambda widths: self._forward_costs(widths, cancel))
        self.budget.price_forwards(lambda widths: self._forward_costs(widths, cancel))

    def _forward_costs(self, widths, cancel: Callable[[], bool] | None = None) -> dict[int, float]:
        """The target's steady one-row forward seconds per token count, measured once a session (`measured_once`)."""
        return measured_once(self.target, 1, widths, cancel)

    @torch.no_grad()
    def stream(self, prompt_ids: list[int], cancel: CancelCheck = None) -> Iterator[StepEvent | RunSummary]:
        if not prompt_ids:
            raise GlanceError("the prompt is empty: give at least one token of text")
        run_id = uuid.uuid4().hex[:12]
        gen = torch.Generator().manual_seed(self.sampling.seed)
        drafter = self.drafter
        if self.cost_aware:  # lookahead's window sized to this target's forward costs (no depth cap reaches it)
            drafter.fit_batch(1, self._forward_costs)
        drafter.reset()
        self.budget.reset(remembered(self.target, drafter, 1, self.sampling))
        self.budget.price_forwards(self._forward_costs)
        self.check_fits(len(prompt_ids))
        self.forward = forward_for(self.target)  # eager, or compiled when compile_model compiled the target
        cache = self.forward.new_cache(len(prompt_ids) + self.max_new_tokens + self.drafter.extra_positions)
        state = DecodeState(list(prompt_ids), len(prompt_ids), self.sampling, gen)
        new: list[int] = []
        steps = forwards = 0
        draft_s = verify_s = 0.0
        stats = RunStats()
        stop = None

        sync(self.device)
        t0 = time.perf_counter()
        # Prefill: the whole prompt; its last logits give the first new token (not counted in tau).
        # the LM head on the last row only: no drafter reads the prompt's logits
        out = self._forward(torch.tensor([prompt_ids], device=self.device), cache, logits_at=[len(prompt_ids) - 1])
        forwards += 1
        logits = out.logits[0, -1:].float()  # [1, V]
        first = first_token(logits[0], self.sampling, gen)
        state.tokens.append(first)
        state.target_out = out
        new.append(first)
        drafter.begin(state)
        sync(self.device)
        prefill_s = time.perf_counter() - t0
        probs, top = self._target_view(logits, [first], [0])
        event = prefill_event(run_id, self.variant, first, prefill_s, probs, top)
        stats.add(event)
        yield event
        _, stop = cut([first], self.max_new_tokens, self.eos)

        while stop is None:
            if _is_cancelled(cancel):
                stop = "cancelled"
                break
            left = self.max_new_tokens - len(new)
            ts = time.perf_counter()
            cap = self.budget.choose(left - 1)  # None: as deep as the drafter's settings allow
            draft = drafter.propose(state, max_tokens=left - 1 if cap is None else min(left - 1, cap))
            if self.budget.narrow:
                draft = draft.spine()  # the budget chose the greedy chain: a tree's width costs more than it wins
            self.budget.hindsight(*drafter.hindsight(), depth=drafter.hindsight_depth)
            sync(self.device)
            tv = time.perf_counter()
            past = cache_length(cache)
            ids = [[state.tokens[-1]] + draft.tokens + draft.side_tokens]
            out = self._forward(torch.tensor(ids, device=self.device), cache, draft)  # over [1, 1 + n + m]
            forwards += 1
            logits = out.logits[0, : 1 + len(draft)]  # [1 + n, V], model dtype: rules convert as needed
            best = None  # every row's argmax, in one transfer: greedy verification and lookahead's guesses
            if self.sampling.greedy or draft.side_tokens:
                best = greedy_ids(out)[0].tolist()
            step = commit(draft, logits, self.sampling, gen, left, self.eos, best and best[: 1 + len(draft)])
            compact_tail(cache, past, step.rows)  # the pending token and the accepted path
            emitted, rows, stop = step.tokens, step.rows, step.stop
            state.tokens.extend(emitted)
            state.target_out = out
            state.rows = rows
            state.side_logits = out.logits[0, 1 + len(draft) :] if draft.side_tokens else None  # [m, V]
            state.side_best = best[1 + len(draft) :] if draft.side_tokens else None
            sync(self.device)
            tu = time.perf_counter()
            drafter.update(state, draft, step.accepted)
            sync(self.device)
            te = time.perf_counter()
            d_s, v_s = (tv - ts) + (te - tu), tu - tv
            self.budget.observe(cap, draft, len(step.accepted), d_s, v_s, step.accepted)
            draft_s += d_s
            verify_s += v_s
            new.extend(emitted)
            steps += 1
            probs, top = self._target_view(logits, emitted, rows)
            clock = prefill_s + draft_s + verify_s
            event = step_event(run_id, self.variant, steps, draft, step, d_s, v_s, clock, len(new), probs, top)
            if self.budget.name != "full":
                event.extra["depth_cap"] = cap  # what the budget allowed this step (None: no cap)
                event.extra["narrow"] = self.budget.narrow
            stats.add(event)
            yield event

        self.budget.finish()
        wall = prefill_s + draft_s + verify_s
        yield RunSummary(
            run_id=run_id,
            variant=self.variant,
            prompt_tokens=len(prompt_ids),
            token_ids=new,
            new_tokens=len(new),
            steps=steps,
            target_forwards=forwards,
            mean_accepted_length=stats.tau,
            acceptance_rate=stats.acceptance,
            acceptance_by_depth=stats.acceptance_by_depth,
            tokens_per_second=len(new) / wall if wall > 0 else 0.0,
            wall_seconds=wall,
            prefill_seconds=prefill_s,
            draft_seconds=draft_s,
            verify_seconds=verify_s,
            stop_reason=stop,
            approximate=drafter.approximate and not self.sampling.greedy,
            settings={
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "seed": self.sampling.seed,
                "max_new_tokens": self.max_new_tokens,
                "draft_budget": self.budget_name,
                **drafter.settings(),
            },
        )

    def generate(self, prompt_ids: list[int], cancel: CancelCheck = None) -> GenerationResult:
        events: list[StepEvent] = []
        for item in self.stream(prompt_ids, cancel):
            if isinstance(item, RunSummary):
                return GenerationResult(item.token_ids, item, events)
            events.append(item)
        raise RuntimeError("stream ended without a summary")
