"""The cost model: a step costs the drafter's time plus one target forward over the tokens it verifies; speedup is
tokens per step over that cost, in units of a plain decoding step. Chains use the expected-length formula from the
measured per-token acceptance, trees and lookahead their measured tau."""

from __future__ import annotations

import bisect
import statistics
import time

import torch
from transformers import DynamicCache

from engine.cache import crop

FORWARD_SIZES = tuple(range(1, 65))  # every k in 1..64 (about 10 s on this CPU)
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
    model: torch.nn.Module, sizes=FORWARD_SIZES, context: int = 128, repeats: int = 7
) -> dict[int, float]:
    """Median seconds of one cached target forward over k new tokens after `context` tokens, for each k."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    prefix = torch.randint(0, vocab, (1, context), device=device)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, cache=cache, use_cache=True)
    costs = {}
    for k in sizes:
        times = []
        for _ in range(repeats):
            step = torch.randint(0, vocab, (1, k), device=device)
            t = time.perf_counter()
            model(input_ids=step, cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
            crop(cache, context)
        costs[k] = statistics.median(times)
    return costs


def interpolate(costs: dict[int, float], k: float) -> float:
    """Forward cost for k tokens, linear between measured sizes (clamped at the ends)."""
    sizes = sorted(costs)
    if k <= sizes[0]:
        return costs[sizes[0]]
    if k >= sizes[-1]:
        return costs[sizes[-1]] * k / sizes[-1]
    i = bisect.bisect_left(sizes, k)
    lo, hi = sizes[i - 1], sizes[i]
    w = (k - lo) / (hi - lo)
    return costs[lo] * (1 - w) + costs[hi] * w


def predict_speedup(
    tokens_per_step: float, verify_tokens: float, draft_seconds: float, costs: dict[int, float]
) -> float:
    """Speedup over plain decoding: tokens per step / (draft time + forward over verify_tokens), in plain steps."""
    step = draft_seconds + interpolate(costs, verify_tokens)
    return tokens_per_step * interpolate(costs, 1) / step


def predictions(methods: dict[str, dict], costs: dict[int, float]) -> dict[str, dict]:
    """Predicted against measured speedup for each method's aggregate (see suite.aggregate)."""
    out = {}
    for name, m in methods.items():
        if name == "ar" or not m.get("steps"):
            continue
        gamma = m.get("chain_length")
        if gamma and m.get("token_acceptance") is not None:  # a chain: the formula from per-token acceptance
            expected = chain_expected_length(m["token_acceptance"], gamma)
        else:
            expected = m["tau"]
        predicted = predict_speedup(expected, m["verify_tokens_per_step"], m["draft_ms_per_step"] / 1e3, costs)
        out[name] = {
            "expected_tokens_per_step": round(expected, 3),
            "predicted_speedup": round(predicted, 3),
            "measured_speedup": m["speedup"],
            "measured_over_predicted": round(m["speedup"] / predicted, 3) if predicted else None,
        }
    return out
