"""The batch sweep: every method decodes B prompts at once for each B; speedup over batched plain decoding at the
same B shows where batching eats the win.

Each cell is taken apart the way the cost model reads it: speedup = tokens per row-step x rows in use / (draft time
+ verify time), the times in units of plain decoding's step at the same B. As B grows the target stops being memory
bound, so a forward over k tokens per row costs more plain steps; drafting costs more with more rows; and in a static
batch the rows that ended early sit idle until the slowest one ends, where plain rows of one length end together. A
method stops paying where its tokens no longer cover those costs. `predict` replays the smallest batch's run at every
B and prices it from a grid of measured forward costs over (batch, tokens)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.bench.suite import BenchSetup, Progress
from engine.budget.draft_budget import make_budget
from engine.decoding.loop import Decoder
from engine.drafters.build import build_drafter
from engine.errors import GlanceError
from engine.heads.compiled_readout import compiled_readout_of
from engine.heads.compiled_step import compiled_step_of, compiles_drafting
from engine.heads.medusa import MedusaHeads
from engine.models.loading import LoadedModel
from engine.registry import spec
from engine.runtime.forward import CompiledForward, forward_for


def run_sweep(
    setup: BenchSetup,
    prompts: list[dict],
    methods: list[str],
    batch_sizes: list[int],
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    continuous: bool = False,
    time_grid: Callable[[int], dict[int, float]] | None = None,
) -> dict:
    """{"batch_sizes": [...], "rows": {B: {method: {tokens_per_second, speedup, tau, matched_rows, rows}}}}.
    `time_grid(B)`: the target's forward seconds over B rows by tokens a row ({k: seconds}), timed right after
    B's cells and kept as "forward_ms", so the prediction's prices and the cells they predict come from the same
    minutes of this host (whose speed drifts: timed after the whole sweep, the grid once ran 20% faster than the
    cells had).

    Every batch size decodes the same max(len(prompts), max(batch_sizes)) prompts, B rows at a time, so the numbers
    compare the same work: static batches of B prompts by default, each decoded until its slowest row ends while
    the rows that ended sit idle (speculative rows end at different steps, plain rows of one length together).
    `continuous`: as servers batch, finished rows take waiting prompts (engine/decoding/loop.py: `join_rows`), each
    method decoding the prompts in two calls (half each, methods interleaved, alternating order). On the bf16 EPYC at
    B = 2 and 4 neither won: each join is an eager prefill forward of its own (about 10 ms of fixed cost, three
    plain steps), against idle rows that cost little at these batch sizes (README). matched_rows counts rows equal
    to batched plain decoding's (all of them in float32; in bfloat16 other batch shapes round differently and
    near-tied greedy choices can flip)."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise GlanceError("batch sizes must be positive integers, e.g. --batch-sizes 1,2,4,8")
    methods = ["ar"] + [m for m in methods if m != "ar" and not m.startswith("hf_")]
    encoded = [setup.encode(p) for p in prompts]
    if not encoded:
        raise GlanceError("the sweep has no prompts")

    def decoder(method: str, max_new_tokens: int | None = None) -> Decoder:
        drafter = build_drafter(method, setup.target, setup.parts, setup.options, setup.sampling)
        budget = make_budget(setup.draft_budget or "full")  # full by default: the physics, undamped
        new = max_new_tokens or setup.max_new_tokens
        return Decoder(setup.target.model, drafter, setup.sampling, new, setup.eos, details=False, budget=budget)

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
        decoder(m, 8).generate_batch(encoded[:2])
        done += 1
        if progress:
            progress(done, total, f"warm-up {m}")
    rows: dict = {}
    forward_ms: dict = {}
    size = max(len(encoded), max(batch_sizes))  # every batch size decodes the same prompts, B at a time
    pool = [encoded[i % len(encoded)] for i in range(size)]
    for b in batch_sizes:
        step = prompts_per_call(size, b, continuous)
        chunks = [pool[i : i + step] for i in range(0, size, step)]
        acc = {m: {"tokens": 0, "wall": 0.0, "steps": 0, "emitted": 0, "forwards": 0, "out": [], "draft": 0.0,
                   "verify": 0.0, "width": 0, "batched": False, "prefills": 0, "row_widths": []}
               for m in methods}  # fmt: skip
        for c, chunk in enumerate(chunks):  # methods interleaved per chunk, alternating order: drift hits all alike
            for m in methods if c % 2 == 0 else methods[::-1]:
                if cancel and cancel():
                    raise GlanceError("the sweep was cancelled")
                dec = decoder(m)
                res = dec.generate_batch(chunk, rows=b)
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
                a["batched"] = spec(m).part is not None  # a model drafts: one call per depth for all rows
                a["row_widths"] += res.row_widths  # in the pool's order: chunks are consecutive prompts
        rows[b] = {}
        for m in methods:
            a = acc[m]
            batched_steps = max(a["forwards"] - a["prefills"], 1)  # verification forwards
            rows[b][m] = {
                "tokens": a["tokens"],
                "tokens_per_second": round(a["tokens"] / a["wall"], 2) if a["wall"] else 0.0,
                "tau": round(a["emitted"] / a["steps"], 3) if a["steps"] else 0.0,
                "forwards": a["forwards"],
                "draft_ms_per_step": round(a["draft"] / batched_steps * 1e3, 3),
                "verify_ms_per_step": round(a["verify"] / batched_steps * 1e3, 3),
                "width": round(a["width"] / batched_steps, 2),  # tokens per row in one verification forward
                "active_rows": round(a["steps"] / batched_steps, 2),  # rows still decoding (and drafting) per step
                "verify_forwards": batched_steps,
                "prefills": a["prefills"],
                "prefill_ms": round((a["wall"] - a["draft"] - a["verify"]) * 1e3, 3),
                "row_widths": a["row_widths"],  # per prompt, its tokens in each verification forward
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
            # rows that ended sit idle in a static batch: the share of plain decoding's rows still producing tokens
            plain_rows = rows[b]["ar"]["active_rows"]  # 0 where every prompt ended at its first token
            r["rows_in_use"] = round(r["active_rows"] / plain_rows, 3) if plain_rows else 1.0
            # the parts, in plain steps at this batch size: speedup ~ tau x rows in use / (draft + verify)
            r["draft_steps"] = round(r["draft_ms_per_step"] / plain_step, 3) if plain_step else None
            r["verify_steps"] = round(r["verify_ms_per_step"] / plain_step, 3) if plain_step else None
        if time_grid is not None:
            if progress:
                progress(done, total, f"cost grid: timing batched target forwards at batch {b}")
            forward_ms[b] = {k: round(v * 1e3, 3) for k, v in time_grid(b).items()}
    budget = setup.draft_budget or "full"
    return {
        "batch_sizes": list(batch_sizes),
        "methods": methods,
        "rows": rows,
        "continuous": continuous,
        "draft_budget": budget,
        **({"forward_ms": forward_ms} if time_grid is not None and all(forward_ms.values()) else {}),
    }


def break_even(sweep: dict) -> dict[str, int | None]:
    """Per method, the smallest batch size at which it is no faster than plain decoding (None: it always wins)."""
    out = {}
    for m in sweep["methods"]:
        if m == "ar":
            continue
        out[m] = next((b for b in sweep["batch_sizes"] if (sweep["rows"][b][m]["speedup"] or 0) <= 1.0), None)
    return out


def prompts_per_call(size: int, b: int, continuous: bool) -> int:
    """How many of the sweep's `size` prompts one decoder call takes at batch size b: one static batch, or half of
    them decoding continuously in b rows."""
    return max(b, -(-size // 2)) if continuous else b


def replay(widths: list[list[int]], b: int, continuous: bool = False) -> tuple[list[tuple[int, int]], int]:
    """The batched steps of the sweep's calls at batch size b where prompt q's row puts `widths[q][t]` tokens in
    its step t's forward (as a measured run drafted them): (rows decoding, forward width) per step, the width being
    the widest row's (the others pad), and the prefill forwards. Static: each batch decodes until its slowest row
    ends. Continuous: `Decoder.stream`'s rule, waiting prompts take the finished rows once half the batch is
    free, or every row is, or the queue's last prompts can go."""
    steps: list[tuple[int, int]] = []
    prefills = 0
    call = prompts_per_call(len(widths), b, continuous)
    for i in range(0, len(widths), call):
        prefills += _replay_call(widths[i : i + call], b, steps)
    return steps, prefills


def _replay_call(widths: list[list[int]], b: int, steps: list[tuple[int, int]]) -> int:
    """One decoder call over `widths`' prompts in b rows (see `replay`): appends its steps, returns its prefills."""
    join = -(-b // 2)
    waiting = list(range(b, len(widths)))
    rows = {s: [q, 0] for s, q in enumerate(range(min(b, len(widths)))) if widths[q]}  # slot: [prompt, its step]
    prefills = 1
    while rows or waiting:
        while waiting:  # joins, before every step (a joined prompt that ended at its first token frees its row)
            free = [s for s in range(b) if s not in rows][: len(waiting)]
            if not free or (rows and len(free) < min(join, len(waiting))):
                break
            taken = [waiting.pop(0) for _ in free]
            rows.update({s: [q, 0] for s, q in zip(free, taken) if widths[q]})
            prefills += 1
        if not rows:
            break
        now = [widths[q][t] for q, t in rows.values()]
        steps.append((len(now), max(now)))
        for s, (q, t) in list(rows.items()):
            if t + 1 >= len(widths[q]):
                del rows[s]
            else:
                rows[s][1] = t + 1
    return prefills


def predict(sweep: dict, grid: dict[int, dict[int, float]]) -> dict[str, dict]:
    """Per method: the predicted speedup at every batch size and the predicted crossover (the smallest B predicted
    at or under 1x; None: never within the sweep), beside the measured ones.

    The smallest batch B0's run is replayed at every B (`replay`): each prompt drafts what it drafted at B0, so a
    batch's steps, the rows still decoding in each (rows that ended sit idle in a static batch) and each step's
    width (its widest row's) follow from B0's per-row widths. A step over a rows of k tokens is priced as `grid`'s
    measured forward over (a, k), plus what a decoding step at a rows pays beyond the grid's one-token forward
    (plain decoding's measured step at that batch size minus the grid's: the per-row host work, which grows with
    the rows; on the bf16 EPYC -0.4 ms at B = 1 and +1.3 ms at B = 4), linear between batch sizes and widths; times
    what B0's run measured over what that says for B0's own steps. Drafting costs B0's time per step, times the
    rows drafting for row-by-row drafters, or times plain decoding's step at those rows over B0's (one call per
    depth for all rows: EAGLE's drafting grew 1.5x from B = 1 to 2 and 2.3x to 4 where plain decoding's step grew
    1.4x and 2.1x). Prefills cost plain decoding's measured prefill at that B. Plain decoding is replayed the same
    way, so the prediction is a ratio of two priced runs. Under an adaptive budget B0's drafts are what the budget
    drafted at B0's prices: the prediction says what drafting that way would give, and the budget falls back towards
    plain steps where it does not pay."""
    sizes = [b for b in sweep["batch_sizes"] if b in grid]
    rows = sweep["rows"]
    if not sizes or "row_widths" not in rows[sizes[0]]["ar"]:
        return {}
    b0, continuous = sizes[0], bool(sweep.get("continuous"))
    measured = [(rows[b]["ar"]["draft_ms_per_step"] + rows[b]["ar"]["verify_ms_per_step"]) / 1e3 for b in sizes]

    def plain_step(a: float) -> float:
        """Plain decoding's measured step at a rows, linear between the sweep's batch sizes."""
        return float(np.interp(a, sizes, measured))

    def grid_cost(a: float, k: float) -> float:
        """The grid's forward seconds over a rows of k tokens each, linear between its batch sizes and widths."""
        at = []
        for b in sizes:
            ks = sorted(grid[b])
            at.append(float(np.interp(k, ks, [grid[b][x] for x in ks])))
        return float(np.interp(a, sizes, at))

    def step_cost(a: float, k: float) -> float:
        return grid_cost(a, k) + plain_step(a) - grid_cost(a, 1)

    def priced(m: str, b: int) -> float | None:
        """Seconds of method m's B0 run replayed at batch size b."""
        first = rows[b0][m]
        steps0, _ = replay(first["row_widths"], b0, continuous)
        model0 = sum(step_cost(a, w) for a, w in steps0)
        if not steps0 or model0 <= 0:
            return None
        factor = first["verify_ms_per_step"] * first["verify_forwards"] / 1e3 / model0  # measured over model, at B0
        draft0 = first["draft_ms_per_step"] / 1e3  # per batched step at B0
        rows0 = sum(a for a, _ in steps0) / len(steps0)
        plain0 = sum(plain_step(a) for a, _ in steps0) / len(steps0)
        steps, prefills = replay(first["row_widths"], b, continuous)
        plain_at_b = rows[b]["ar"]
        seconds = prefills * plain_at_b["prefill_ms"] / 1e3 / max(plain_at_b["prefills"], 1)
        for a, w in steps:
            grows = plain_step(a) / plain0 if first.get("batched_drafting") else a / rows0
            seconds += draft0 * grows + factor * step_cost(a, w)
        return seconds

    plain = {b: priced("ar", b) for b in sizes}
    out = {}
    for m in sweep["methods"]:
        if m == "ar":
            continue
        per_batch = {}
        for b in sizes:
            mine = priced(m, b)
            ok = mine and plain[b] and rows[b0][m]["tokens"]
            per_batch[b] = (
                round(rows[b0][m]["tokens"] / mine / (rows[b0]["ar"]["tokens"] / plain[b]), 3) if ok else None
            )
        out[m] = {
            "predicted_speedup": per_batch,
            "predicted_crossover": next((b for b in sizes if (per_batch[b] or 0) <= 1.0), None),
            "measured_crossover": next((b for b in sizes if (rows[b][m]["speedup"] or 0) <= 1.0), None),
        }
    return out
