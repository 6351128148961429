"""The batch sweep: every method decodes B prompts at once for each B; speedup over batched plain decoding at the
same B shows where batching eats the win (the target is no longer memory bound, so verifying more tokens costs)."""

from __future__ import annotations

from collections.abc import Callable

from engine.batch import BatchDecoder
from engine.bench.suite import BenchSetup, Progress
from engine.errors import GlanceError
from engine.variants import build_drafter


def run_sweep(
    setup: BenchSetup,
    prompts: list[dict],
    methods: list[str],
    batch_sizes: list[int],
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
) -> dict:
    """{"batch_sizes": [...], "rows": {B: {method: {tokens_per_second, speedup, tau, lossless}}}}."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise GlanceError("batch sizes must be positive integers, e.g. --batch-sizes 1,2,4,8")
    methods = ["ar"] + [m for m in methods if m != "ar" and not m.startswith("hf_")]
    tok = setup.target.tokenizer
    encoded = [tok(p["prompt"])["input_ids"] for p in prompts]
    if not encoded:
        raise GlanceError("the sweep has no prompts")

    def decoder(method: str) -> BatchDecoder:
        make = None if method == "ar" else (lambda: build_drafter(method, setup.target, setup.parts, setup.options))
        return BatchDecoder(setup.target.model, make, setup.sampling, setup.max_new_tokens, setup.eos)

    total, done = len(methods) * (1 + len(batch_sizes)), 0
    for m in methods:  # warm-up at batch 2
        BatchDecoder(setup.target.model, decoder(m).make_drafter, setup.sampling, 8, setup.eos).generate(encoded[:2])
        done += 1
        if progress:
            progress(done, total, f"warm-up {m}")
    rows: dict = {}
    for b in batch_sizes:
        batch = [encoded[i % len(encoded)] for i in range(b)]
        rows[b] = {}
        base_tokens = None
        for m in methods:
            if cancel and cancel():
                raise GlanceError("the sweep was cancelled")
            res = decoder(m).generate(batch)
            if m == "ar":
                base_tokens = res.tokens
            rows[b][m] = {
                "tokens_per_second": round(res.tokens_per_second, 2),
                "tau": round(res.mean_accepted_length, 3),
                "forwards": res.forwards,
                "lossless": res.tokens == base_tokens,
            }
            done += 1
            if progress:
                progress(done, total, f"batch {b} {m}")
        base = rows[b]["ar"]["tokens_per_second"]
        for r in rows[b].values():
            r["speedup"] = round(r["tokens_per_second"] / base, 3) if base else None
    return {"batch_sizes": list(batch_sizes), "methods": methods, "rows": rows}


def break_even(sweep: dict) -> dict[str, int | None]:
    """Per method, the smallest batch size at which it is no faster than plain decoding (None: it always wins)."""
    out = {}
    for m in sweep["methods"]:
        if m == "ar":
            continue
        out[m] = next((b for b in sweep["batch_sizes"] if (sweep["rows"][b][m]["speedup"] or 0) <= 1.0), None)
    return out
