"""The cost model: a step costs the drafter's time plus one target forward over the tokens it verifies; speedup is
tokens per step over that cost, in units of a plain decoding step. Chains use the expected-length formula from the
measured per-token acceptance, trees and lookahead their measured tau."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from engine.runtime.forward import forward_for
from engine.runtime.forward_timing import time_width

FORWARD_SIZES = tuple(range(1, 65))  # every k in 1..64 (about 15 s on an AMX Xeon, 40 s without AMX)
SHOWN_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # the ones the Markdown table prints


def chain_expected_length(acceptance: float, gamma: int) -> float:
    """Expected tokens per step of a gamma-token chain whose tokens are each accepted with probability a:
    (1 - a^(gamma + 1)) / (1 - a) (Leviathan et al. 2023), gamma + 1 when a = 1."""
    a = min(max(acceptance, 0.0), 1.0)
    if a >= 1.0:
        return float(gamma + 1)
    return (1 - a ** (gamma + 1)) / (1 - a)


@torch.no_grad()
def forward_costs(
    model: torch.nn.Module, sizes=FORWARD_SIZES, context: int = 128, repeats: int = 3, cancel=None, progress=None
) -> dict[int, float]:
    """Median seconds of one cached target forward over k new tokens after `context` tokens, for each k. The sizes
    are measured in interleaved rounds, so drift in the machine's speed hits every k alike. `cancel()` true: stops
    after the current forward and returns {}; `progress(done, total, what)` is called once per round."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    prefix = torch.randint(0, vocab, (1, context), device=device)
    forward = forward_for(model)  # compiled when decoding is: the costs are what decoding pays
    cache = forward.new_cache(context + max(sizes))
    forward(prefix, cache)
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for r in range(repeats):
        if progress is not None:
            progress(r, repeats, "cost model: timing target forwards")
        for k in sizes:
            if cancel is not None and cancel():
                return {}
            times[k].append(time_width(forward, cache, 1, k, context, vocab, None, device))
    return {k: statistics.median(v) for k, v in times.items()}


GRID_TOKENS = (1, 2, 4, 8, 16, 24, 32)  # forward widths the batch sweep's cost grid measures


@torch.no_grad()
def forward_grid(
    model: torch.nn.Module, batch_sizes, sizes=GRID_TOKENS, context: int = 128, repeats: int = 2, cancel=None
) -> dict[int, dict[int, float]]:
    """{B: {k: median seconds}} of one cached target forward over B rows x k new tokens after `context` tokens each:
    what verification costs as the batch grows, under a mask per row as batches run (with B > 1). Rounds interleave
    every (B, k); `cancel()` true returns {}."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    forward = forward_for(model)
    dtype = next(model.parameters()).dtype
    caches = {}
    for b in batch_sizes:
        caches[b] = forward.new_cache(context + max(sizes))
        forward(torch.randint(0, vocab, (b, context), device=device), caches[b])
    times: dict[int, dict[int, list[float]]] = {b: {k: [] for k in sizes} for b in batch_sizes}
    for _ in range(repeats):
        for b in batch_sizes:
            for k in sizes:
                if cancel is not None and cancel():
                    return {}
                times[b][k].append(time_width(forward, caches[b], b, k, context, vocab, dtype, device))
    return {b: {k: statistics.median(v) for k, v in row.items()} for b, row in times.items()}


def fit_line(costs: dict[int, float]) -> tuple[float, float]:
    """Least-squares a + b * k through the measured costs: robust to the noise of single sizes."""
    ks = list(costs)
    n = len(ks)
    if n == 1:
        return costs[ks[0]], 0.0
    mk = sum(ks) / n
    mc = sum(costs.values()) / n
    var = sum((k - mk) ** 2 for k in ks)
    b = sum((k - mk) * (costs[k] - mc) for k in ks) / var if var else 0.0
    return mc - b * mk, b


def cost_model(costs: dict[int, float], plain_step: float | None = None) -> Callable[[float], float]:
    """Seconds of a forward over k tokens: the fitted line's shape, levelled so that k = 1 costs `plain_step` (plain
    decoding's measured step in the same run) when given, so drift between the two measurements cancels."""
    a, b = fit_line(costs)
    scale = plain_step / (a + b) if plain_step and a + b > 0 else 1.0
    return lambda k: (a + b * k) * scale


def predict_speedup(
    tokens_per_step: float, verify_tokens: float, draft_seconds: float, cost: Callable[[float], float]
) -> float:
    """Speedup over plain decoding: tokens per step / (draft time + forward over verify_tokens), in plain steps."""
    return tokens_per_step * cost(1) / (draft_seconds + cost(verify_tokens))


def predictions(methods: dict[str, dict], costs: dict[int, float]) -> dict[str, dict]:
    """Predicted against measured speedup for each method's aggregate (see suite.aggregate)."""
    plain = methods.get("ar", {}).get("verify_ms_per_step")
    cost = cost_model(costs, plain / 1e3 if plain else None)
    out = {}
    for name, m in methods.items():
        if name == "ar" or not m.get("steps"):
            continue
        gamma = m.get("chain_length")
        if gamma and m.get("token_acceptance") is not None:  # a chain: the formula from per-token acceptance
            expected = chain_expected_length(m["token_acceptance"], gamma)
        else:
            expected = m["tau"]
        predicted = predict_speedup(expected, m["verify_tokens_per_step"], m["draft_ms_per_step"] / 1e3, cost)
        out[name] = {
            "expected_tokens_per_step": round(expected, 3),
            "predicted_speedup": round(predicted, 3),
            "measured_speedup": m["speedup"],
            "measured_over_predicted": round(m["speedup"] / predicted, 3) if predicted else None,
        }
    return out
