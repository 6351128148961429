"""What a target forward costs, measured on the machine at hand: the cost model's tables (engine/bench/cost.py) and
the batch decoder's sizing of lookahead windows both read it, so a choice made on a CPU is remade on a GPU."""

from __future__ import annotations

import os
import statistics
import time
import weakref
from collections.abc import Callable

import torch

from engine.runtime.cache import context_limit, crop
from engine.runtime.forward import forward_for

CONTEXT = 128  # cached tokens before the timed forwards: a short prompt's worth
# Runs of each shape: the first forwards of a shape right after another graph ran read their weights from memory,
# not cache (every compiled graph holds its own packed copy), so a shape's cost is the least of its last STEADY_RUNS
# runs, and the median over ROUNDS rounds that interleave the widths: one run varies by a tenth either way, and the
# budgets read ratios between widths. `GLANCE_TIMING_ROUNDS` sets the rounds (the test suite takes one: it checks
# what the costs decide, not how precise they are).
RUNS = 6
STEADY_RUNS = 3
_ROUNDS_SET = os.environ.get("GLANCE_TIMING_ROUNDS", "")
ROUNDS = max(1, int(_ROUNDS_SET)) if _ROUNDS_SET.isdigit() else 3

_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(rows, widths, forward kind): costs}


def steady_seconds(forward, step: torch.Tensor, cache, context: int, device, mask: torch.Tensor | None = None) -> float:
    """Seconds of one forward over `step` [B, k] after `context` cached tokens: the least of the last STEADY_RUNS of
    RUNS runs (the first forwards of a shape right after another graph ran slower; see RUNS)."""
    seconds = []
    for _ in range(RUNS):
        t = time.perf_counter()
        forward(step, cache, mask)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t)
        crop(cache, context)
    return min(seconds[-STEADY_RUNS:])


def time_width(forward, cache, rows: int, k: int, context: int, vocab: int, dtype, device) -> float:
    """steady_seconds of `rows` rows x `k` random new tokens after `context` cached ones, called as decoders call it:
    with rows > 1 under a mask per row (a compiled model then runs the graphs its batched warm-up made)."""
    step = torch.randint(0, vocab, (rows, k), device=device)
    mask = torch.zeros(rows, 1, k, context + k, dtype=dtype, device=device) if rows > 1 else None
    return steady_seconds(forward, step, cache, context, device, mask)


@torch.no_grad()
def batch_forward_costs(
    model: torch.nn.Module,
    rows: int,
    widths,
    context: int = CONTEXT,
    repeats: int = ROUNDS,
    cancel: Callable[[], bool] | None = None,
) -> dict[int, float]:
    """{k: median seconds} of one cached forward over `rows` rows x k new tokens after `context` tokens each, called
    as the batch decoder calls it (with rows > 1, under a mask per row, so a compiled model runs the graphs its
    warm-up made). Rounds interleave the widths, so drift hits all alike; `cancel()` true returns {}."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    asked = sorted(set(widths))
    limit = context_limit(model.config)  # a small-context model (GPT-2 with 64 positions) is timed within it
    widths = [k for k in asked if limit is None or 2 * k <= limit] or [1]
    if limit is not None:
        context = max(1, min(context, limit - max(widths)))
    forward = forward_for(model)  # compiled when decoding is: the costs are what decoding pays
    cache = forward.new_cache(context + max(widths))
    forward(torch.randint(0, vocab, (rows, context), device=device), cache)
    dtype = next(model.parameters()).dtype
    times: dict[int, list[float]] = {k: [] for k in widths}
    for _ in range(repeats):
        for k in widths:
            if cancel is not None and cancel():
                return {}
            times[k].append(time_width(forward, cache, rows, k, context, vocab, dtype, device))
    costs = {k: statistics.median(v) for k, v in times.items()}
    return {k: costs.get(k, costs[max(widths)]) for k in asked}  # widths past the context: the widest that fits


def remembered_costs(model: torch.nn.Module, rows: int, widths) -> dict[int, float] | None:
    """What `measured_once` keeps for these arguments, or None when nothing was timed yet (never times)."""
    key = (rows, tuple(sorted(set(widths))), type(forward_for(model)).__name__)
    return _MEMO.get(model, {}).get(key)


def measured_once(
    model: torch.nn.Module, rows: int, widths, cancel: Callable[[], bool] | None = None
) -> dict[int, float]:
    """batch_forward_costs, measured once per model, batch size and widths in a session (one to two seconds on an
    AMX Xeon at B = 4 to 8) and remembered: every batch of that size after the first reuses it. `cancel()` true
    stops it: {} then, remembered by nobody."""
    memo = _MEMO.setdefault(model, {})
    key = (rows, tuple(sorted(set(widths))), type(forward_for(model)).__name__)  # compiled or eager: other costs
    if key not in memo:
        costs = batch_forward_costs(model, rows, key[1], cancel=cancel)
        if cancel is not None and cancel():
            return {}
        memo[key] = costs
    return memo[key]
