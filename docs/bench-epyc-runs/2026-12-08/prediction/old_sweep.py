"""The batch sweep: every method decodes B prompts at once for each B; speedup over batched plain decoding at the
same B shows where batching eats the win.

Each cell is taken apart the way the cost model reads it: speedup = tokens per step / (draft time + verify time),
both in units of plain decoding's step at the same B. As B grows the target stops being memory bound, so a forward
over k tokens per row costs more plain steps, and drafting (row by row here) costs B times its single-row time; a
method stops paying where that sum passes its tokens per step. `predict` forecasts every cell and the crossover
from the single-row cell and a grid of measured forward costs over (batch, tokens)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.batch import BatchDecoder
from engine.bench.suite import BenchSetup, Progress
from engine.budget import make_budget
from engine.errors import GlanceError
from engine.forward import CompiledForward, forward_for
from engine.heads.compiled_readout import compiled_readout_of
from engine.heads.compiled_step import compiled_step_of, compiles_drafting
from engine.heads.medusa import MedusaHeads
from engine.models import LoadedModel
from engine.variants import build_drafter


def run_sweep(
    setup: BenchSetup,
    prompts: list[dict],
    methods: list[str],
    batch_sizes: list[int],
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    continuous: bool = False,
) -> dict:
    """{"batch_sizes": [...], "rows": {B: {method: {tokens_per_second, speedup, tau, matched_rows, rows}}}}.

    Every batch size decodes the same max(len(prompts), max(batch_sizes)) prompts, B rows at a time, so the numbers
    compare the same work: static batches of B prompts by default, each decoded until its slowest row ends while
    the rows that ended sit idle (speculative rows end at different steps, plain rows of one length together).
    `continuous`: as servers batch, finished rows take waiting prompts (engine/batch.py: `join_rows`), each method
    decoding the prompts in two calls (half each, methods interleaved, alternating order). On the bf16 EPYC at
    B = 2 and 4 neither won: each join is an eager prefill forward of its own (about 10 ms of fixed cost, three
    plain steps), against idle rows that cost little at these batch sizes (README). matched_rows counts rows equal
    to batched plain decoding's (all of them in float32; in bfloat16 other batch shapes round differently and
    near-tied greedy choices can flip)."""
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
        budget = make_budget(setup.draft_budget or "full")  # full by default: the physics, undamped
        return BatchDecoder(setup.target.model, make, setup.sampling, setup.max_new_tokens, setup.eos, budget=budget)

    total, done = len(methods) * (1 + len(batch_sizes)), 0
    models = [setup.target.model] + [p.model for p in setup.parts.values() if isinstance(p, LoadedModel)]
    for model in models:  # compiled forwards: their batched graphs now, not in a timed cell
        forward = forward_for(model)
        if isinstance(forward, CompiledForward) and forward.graph is not None:
            forward.warm_up(2, "a model", lambda i, n, what: progress and progress(done, total, what))
    for part in setup.parts.values():  # compiled EAGLE drafting steps and Medusa read-outs: their batched graphs too
        step = compiled_step_of(part) if compiles_drafting(part) else None
        if step is not None:
            if progress:
                progress(done, total, "compiling a head's drafting step in batches")
            step.warm_up(2)
        readout = compiled_readout_of(part) if isinstance(part, MedusaHeads) else None
        if readout is not None:
            if progress:
                progress(done, total, "compiling the Medusa heads' read-out in batches")
            for k in {k for k, _, _ in readout.graphs}:  # every k a proposal asked for so far (the default tree's
                readout.warm_up(k, rows=2)  # at load), every head's graph and head 0's
    for m in methods:  # warm-up at batch 2
        BatchDecoder(setup.target.model, decoder(m).make_drafter, setup.sampling, 8, setup.eos).generate(encoded[:2])
        done += 1
        if progress:
            progress(done, total, f"warm-up {m}")
    rows: dict = {}
    size = max(len(encoded), max(batch_sizes))  # every batch size decodes the same prompts, B at a time
    pool = [encoded[i % len(encoded)] for i in range(size)]
    for b in batch_sizes:
        step = max(b, -(-size // 2)) if continuous else b  # prompts per call: half of them, or one static batch
        chunks = [pool[i : i + step] for i in range(0, size, step)]
        acc = {m: {"tokens": 0, "wall": 0.0, "steps": 0, "emitted": 0, "forwards": 0, "out": [], "draft": 0.0,
                   "verify": 0.0, "width": 0, "batched": False, "prefills": 0} for m in methods}  # fmt: skip
        for c, chunk in enumerate(chunks):  # methods interleaved per chunk, alternating order: drift hits all alike
            for m in methods if c % 2 == 0 else methods[::-1]:
                if cancel and cancel():
                    raise GlanceError("the sweep was cancelled")
                dec = decoder(m)
                res = dec.generate(chunk, rows=b)
                a = acc[m]
                a["tokens"] += res.new_tokens
                a["wall"] += res.wall_seconds
                a["steps"] += sum(res.steps)
                a["emitted"] += res.new_tokens - len(chunk)
                a["forwards"] += res.forwards
                a["prefills"] += res.prefills
                a["out"] += res.tokens
                a["draft"] += res.draft_seconds
                a["verify"] += res.verify_seconds
                a["width"] += res.verify_width
                a["batched"] = res.batched_drafting
        rows[b] = {}
        for m in methods:
            a = acc[m]
            batched_steps = max(a["forwards"] - a["prefills"], 1)  # verification forwards
            rows[b][m] = {
                "tokens_per_second": round(a["tokens"] / a["wall"], 2) if a["wall"] else 0.0,
                "tau": round(a["emitted"] / a["steps"], 3) if a["steps"] else 0.0,
                "forwards": a["forwards"],
                "draft_ms_per_step": round(a["draft"] / batched_steps * 1e3, 3),
                "verify_ms_per_step": round(a["verify"] / batched_steps * 1e3, 3),
                "width": round(a["width"] / batched_steps, 2),  # tokens per row in one verification forward
                "active_rows": round(a["steps"] / batched_steps, 2),  # rows still decoding (and drafting) per step
                "batched_drafting": a["batched"],  # one draft call per depth for all rows (else one per row)
                "matched_rows": sum(x == y for x, y in zip(a["out"], acc["ar"]["out"])),
                "rows": len(a["out"]),
            }
            done += 1
            if progress:
                progress(done, total, f"batch {b} {m}")
        base = rows[b]["ar"]["tokens_per_second"]
        plain_step = rows[b]["ar"]["draft_ms_per_step"] + rows[b]["ar"]["verify_ms_per_step"]
        for r in rows[b].values():
            r["speedup"] = round(r["tokens_per_second"] / base, 3) if base else None
            # the parts, in plain steps at this batch size: speedup ~ tau / (draft + verify)
            r["draft_steps"] = round(r["draft_ms_per_step"] / plain_step, 3) if plain_step else None
            r["verify_steps"] = round(r["verify_ms_per_step"] / plain_step, 3) if plain_step else None
    return {"batch_sizes": list(batch_sizes), "methods": methods, "rows": rows, "continuous": continuous}


def break_even(sweep: dict) -> dict[str, int | None]:
    """Per method, the smallest batch size at which it is no faster than plain decoding (None: it always wins)."""
    out = {}
    for m in sweep["methods"]:
        if m == "ar":
            continue
        out[m] = next((b for b in sweep["batch_sizes"] if (sweep["rows"][b][m]["speedup"] or 0) <= 1.0), None)
    return out


def predict(sweep: dict, grid: dict[int, dict[int, float]]) -> dict[str, dict]:
    """Per method: the predicted speedup at every batch size and the predicted crossover (the smallest B predicted
    at or under 1x; None: never within the sweep), beside the measured ones. Inputs: the smallest batch's cell (tau,
    draft milliseconds per step), each cell's forward width (a property of the drafts, not of speed) and `grid`, the
    measured forward seconds over (B, k). Drafting row by row is taken to cost its time at the smallest batch B0
    times the ratio of rows still decoding per step (a shape of the run, like the width, not a speed); batched
    drafting (one small-model call per depth for all rows, memory bound at these sizes) the same time as at B0.
    Verification, over the rows still decoding (finished rows leave the batch: `active_rows`, the grid linear
    between batch sizes), costs grid(active, width) / grid(B, 1) plain steps, times what B0's cell measured over
    what the grid says there (its `verify_steps` against grid(B0, width) / grid(B0, 1)). The grid times each shape
    in runs of its own; in decoding, a verify follows other graphs and pays the switch, and the loop verifies and
    compacts every row: on the AMX host at B = 1, prompt lookup's verify cost 1.25 plain steps where the grid said
    0.93, and without the factor every predicted crossover of the sweep came one batch size late."""
    sizes = [b for b in sweep["batch_sizes"] if b in grid]
    if not sizes:
        return {}
    b0 = sizes[0]
    rows = sweep["rows"]
    out = {}

    def cost(b: int, k: float) -> float:
        """The grid's forward seconds at batch b over k tokens a row, linear between measured widths."""
        ks = sorted(grid[b])
        return float(np.interp(k, ks, [grid[b][x] for x in ks]))

    def cost_rows(rows_in: float, k: float) -> float:
        """The forward seconds over k tokens a row for `rows_in` rows on average (finished rows leave the batch),
        linear between the grid's batch sizes."""
        return float(np.interp(rows_in, sizes, [cost(b, k) for b in sizes]))

    for m in sweep["methods"]:
        if m == "ar":
            continue
        first = rows[b0][m]
        grid_verify0 = cost(b0, first["width"]) / cost(b0, 1)
        measured0 = first.get("verify_steps")  # None where B0's plain step was not measured
        factor = measured0 / grid_verify0 if measured0 and grid_verify0 > 0 else 1.0
        per_batch = {}
        for b in sizes:
            plain = cost(b, 1)
            rows_ratio = (
                1.0
                if rows[b][m].get("batched_drafting")
                else rows[b][m].get("active_rows", b) / first.get("active_rows", b0)
            )
            draft = first["draft_ms_per_step"] / 1e3 * rows_ratio / plain
            verify = factor * cost_rows(rows[b][m].get("active_rows", b), rows[b][m]["width"]) / plain
            per_batch[b] = round(first["tau"] / (draft + verify), 3) if draft + verify > 0 else None
        out[m] = {
            "predicted_speedup": per_batch,
            "predicted_crossover": next((b for b in sizes if (per_batch[b] or 0) <= 1.0), None),
            "measured_crossover": next((b for b in sizes if (rows[b][m]["speedup"] or 0) <= 1.0), None),
        }
    return out
