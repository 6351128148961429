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
    """{"batch_sizes": [...], "rows": {B: {method: {tokens_per_second, speedup, tau, matched_rows, rows}}}}.

    Every batch size decodes the same max(len(prompts), max(batch_sizes)) prompts, B rows per batch, so the numbers
    compare the same work. matched_rows counts rows equal to batched plain decoding's (all of them in float32; in
    bfloat16 other batch shapes round differently and near-tied greedy choices can flip)."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise GlanceError("batch sizes must be positive integers, e.g. --batch-sizes 1,2,4,8")
    methods = ["ar"] + [m for m in methods if m != "ar" and not m.startswith("hf_")]
    encoded = [setup.encode(p["prompt"]) for p in prompts]
    if not encoded:
        raise GlanceError("the sweep has no prompts")

    def decoder(method: str) -> BatchDecoder:
        make = (
            None
            if method == "ar"
            else (lambda: build_drafter(method, setup.target, setup.parts, setup.options, setup.sampling))
        )
        return BatchDecoder(setup.target.model, make, setup.sampling, setup.max_new_tokens, setup.eos)

    total, done = len(methods) * (1 + len(batch_sizes)), 0
    for m in methods:  # warm-up at batch 2
        BatchDecoder(setup.target.model, decoder(m).make_drafter, setup.sampling, 8, setup.eos).generate(encoded[:2])
        done += 1
        if progress:
            progress(done, total, f"warm-up {m}")
    rows: dict = {}
    size = max(len(encoded), max(batch_sizes))  # every batch size decodes the same prompts, B at a time
    pool = [encoded[i % len(encoded)] for i in range(size)]
    for b in batch_sizes:
        chunks = [pool[i : i + b] for i in range(0, size, b)]
        rows[b] = {}
        base_tokens: list = []
        for m in methods:
            tokens, wall, steps, emitted, forwards, out = 0, 0.0, 0, 0, 0, []
            for chunk in chunks:
                if cancel and cancel():
                    raise GlanceError("the sweep was cancelled")
                res = decoder(m).generate(chunk)
                tokens += res.new_tokens
                wall += res.wall_seconds
                steps += sum(res.steps)
                emitted += res.new_tokens - len(chunk)
                forwards += res.forwards
                out += res.tokens
            if m == "ar":
                base_tokens = out
            rows[b][m] = {
                "tokens_per_second": round(tokens / wall, 2) if wall else 0.0,
                "tau": round(emitted / steps, 3) if steps else 0.0,
                "forwards": forwards,
                "matched_rows": sum(x == y for x, y in zip(out, base_tokens)),
                "rows": len(out),
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
