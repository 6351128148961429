"""One benchmark run: the suite (with transformers' rows and the cost model) and/or the batch sweep, as one dict."""

from __future__ import annotations

from collections.abc import Callable

from engine.bench.cost import fit_line, forward_costs, forward_grid, predictions
from engine.bench.report import environment
from engine.bench.suite import BenchSetup, Progress, run_suite
from engine.bench.sweep import break_even, predict, run_sweep
from engine.drafters.build import describe_parts


def run_benchmark(
    setup: BenchSetup,
    prompts: list[dict],
    methods: list[str],
    repeats: int = 1,
    batch_sizes: list[int] | None = None,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    continuous: bool = False,
) -> dict:
    """With batch_sizes: the sweep only (`continuous`: see run_sweep); otherwise the suite, its reference rows
    (hf_* methods) and the cost model."""
    setup.check(prompts, methods, batch_sizes)
    target = setup.target
    results: dict = {
        "environment": environment(target, str(target.device), str(target.dtype).removeprefix("torch.")),
        "models": {"target": target.describe(), **describe_parts(setup.parts)},
        "settings": {
            "methods": methods,
            "prompts": len(prompts),
            "repeats": repeats,
            "max_new_tokens": setup.max_new_tokens,
            "temperature": setup.sampling.temperature,
            "top_p": setup.sampling.top_p,
            "seed": setup.sampling.seed,
            "drafters": setup.options.flat(),
            "draft_budget": setup.draft_budget or ("full" if batch_sizes else "auto"),
            "batch_sizes": batch_sizes,
            "batching": ("continuous" if continuous else "static") if batch_sizes else None,
            "compiled": {r.name: round(r.seconds, 1) if r.compiled else r.note for r in setup.compiled},
        },
    }
    if batch_sizes:
        time_grid = lambda b: forward_grid(target.model, [b], cancel=cancel).get(b, {})  # noqa: E731
        sweep = run_sweep(setup, prompts, methods, batch_sizes, progress, cancel, continuous, time_grid)
        sweep["break_even_batch"] = break_even(sweep)
        if "forward_ms" in sweep:  # each batch size's forwards, timed right after its cells
            grid = {b: {k: ms / 1e3 for k, ms in row.items()} for b, row in sweep["forward_ms"].items()}
            sweep["predictions"] = predict(sweep, grid)
        results["sweep"] = sweep
        return results
    suite = run_suite(setup, prompts, methods, repeats, progress, cancel)
    results["suite"] = suite
    costs = forward_costs(target.model, cancel=cancel, progress=progress)
    if not costs:  # stopped: the suite's results stand, without the cost model
        results["stopped"] = "cost model"
        return results
    results["cost_model"] = {
        "forward_ms": {k: round(v * 1e3, 3) for k, v in costs.items()},
        "fit_ms": dict(zip(("a", "b"), (round(x * 1e3, 4) for x in fit_line(costs)))),
        "predictions": predictions(suite["methods"], costs),
    }
    return results
