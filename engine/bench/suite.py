"""The benchmark suite: every method on every prompt, sequentially, methods interleaved per prompt so drift hits all
alike, after a warm-up; per-run records, then aggregates per method and per prompt category."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.bench.clock import ModelClock
from engine.bench.reference import REFERENCES, hf_generate, reference_assistant, reference_available
from engine.budget.draft_budget import make_budget
from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.build import NEEDS, DrafterOptions, build_drafter
from engine.errors import GlanceError
from engine.heads.readout import candidates, draft_step
from engine.models.chat import encode_prompt, stop_ids, use_chat
from engine.models.loading import LoadedModel
from engine.records.stats import RunStats, Speedup
from engine.registry import DRAFTERS
from engine.runtime.forward import forward_for

Progress = Callable[[int, int, str], None]  # (done, total, what)
WARMUP_TOKENS = 16


@dataclass
class BenchSetup:
    """Loaded models and the settings every method shares."""

    target: object  # LoadedModel
    parts: dict = field(default_factory=dict)
    options: DrafterOptions = field(default_factory=DrafterOptions)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 64

    chat: bool | None = None  # prompts as user messages in the chat template (None: when the model has one)
    # How deep each step drafts (engine/budget/draft_budget.py): "auto" or "full"; None: auto for the suite, full for
    # the sweep
    # (the sweep shows where batching kills the win, undamped by the budget).
    draft_budget: str | None = None
    compiled: list = field(
        default_factory=list
    )  # CompileReports of the models compiled at load (engine/runtime/forward.py)

    @property
    def eos(self) -> list[int]:
        return stop_ids(self.target.model, self.target.tokenizer, use_chat(self.target.tokenizer, self.chat))

    def encode(self, record: dict) -> list[int]:
        """A prompt-suite record's ids: its "prompt", after its "history" of earlier turns where it has one."""
        chat = use_chat(self.target.tokenizer, self.chat)
        return encode_prompt(self.target.tokenizer, record["prompt"], chat, record.get("history"))

    def timed_modules(self) -> list:
        # The target's LM head and embeddings too: EAGLE's head calls them outside the target's forward.
        model = self.target.model
        mods = [model, model.get_output_embeddings(), model.get_input_embeddings()]
        for part in self.parts.values():  # draft models and heads
            if isinstance(part, LoadedModel):
                mods.append(part.model)
            elif isinstance(part, torch.nn.Module):
                mods.append(part)
                mods.append(candidates(part))  # the head's top-k read-out (engine/heads/readout.py)
                mods.append(draft_step(part))  # EAGLE's head forward and read-out in one call (compiled or not)
        # A compiled forward runs the graph, not the model's module call: its own module's hooks time it.
        return mods + [f for f in map(forward_for, mods[:1] + mods[3:]) if isinstance(f, torch.nn.Module)]

    def check(self, prompts: list[dict], methods: list[str], batch_sizes: list[int] | None = None) -> None:
        """Refuse, before the first run, what a benchmark would only find out later: a prompt its template cannot
        render, a prompt too long for a method's context (named), a batch size the device has no memory for."""
        from engine.runtime.cache import check_window
        from engine.runtime.memory import batch_bytes, free_bytes

        lengths = {}
        for i, record in enumerate(prompts):
            name = str(record.get("id", f"#{i + 1}"))
            try:
                lengths[name] = len(self.encode(record))
            except GlanceError as exc:
                raise GlanceError(f"prompt {name!r}: {exc}") from None
        longest = max(lengths, key=lengths.get)
        for method in methods:
            try:
                if method in REFERENCES:
                    check_window(self.target.model.config, lengths[longest] + self.max_new_tokens)
                elif self.available(method):
                    drafter = build_drafter(method, self.target, self.parts, self.options, self.sampling)
                    Decoder(self.target.model, drafter, self.sampling, self.max_new_tokens).check_fits(lengths[longest])
            except GlanceError as exc:
                raise GlanceError(f"{method} on prompt {longest!r} ({lengths[longest]} tokens): {exc}") from None
        free = free_bytes(self.target.device)
        for rows in batch_sizes or []:
            need = batch_bytes(self.target.model, rows, lengths[longest] + self.max_new_tokens + 64)
            if free is not None and need > 0.8 * free:
                raise GlanceError(
                    f"batch size {rows} needs about {need / 2**20:,.0f} MiB for its caches and logits and "
                    f"{self.target.device} has {free / 2**20:,.0f} MiB free: use smaller --batch-sizes"
                )

    def available(self, method: str) -> bool:
        if method in REFERENCES:
            return reference_available(method, self.target.model, self.parts)
        return method not in NEEDS or self.parts.get(NEEDS[method]) is not None


def decode_once(setup: BenchSetup, method: str, ids: list[int], max_new_tokens: int | None = None) -> dict:
    """One timed run of `method` on one prompt: the raw counts every aggregate is built from."""
    max_new = max_new_tokens or setup.max_new_tokens
    if method in REFERENCES:
        helper = reference_assistant(method, setup.parts, setup.options)
        with ModelClock(setup.timed_modules()) as clock:
            r = hf_generate(method, setup.target.model, ids, max_new, setup.sampling, setup.eos, helper)
        return {**r, "new_tokens": len(r["tokens"]), "model_seconds": clock.seconds}
    drafter = build_drafter(method, setup.target, setup.parts, setup.options, setup.sampling)
    decoder = Decoder(
        setup.target.model,
        drafter,
        setup.sampling,
        max_new,
        setup.eos,
        variant=method,
        details=False,
        budget=make_budget(setup.draft_budget or "auto"),
    )
    with ModelClock(setup.timed_modules()) as clock:
        res = decoder.generate(ids)
    s, st = res.summary, RunStats()
    for e in res.events:
        st.add(e)
    return {
        "tokens": res.tokens,
        "new_tokens": s.new_tokens,
        "wall_seconds": s.wall_seconds,
        "model_seconds": clock.seconds,
        "steps": st.steps,
        "drafted_steps": st.drafted_steps,
        "emitted": st.emitted,
        "accepted": st.accepted,
        "proposed_depth": st.proposed_depth,
        "reached": st.by_depth.reached,
        "accepted_by_depth": st.by_depth.accepted,
        "draft_seconds": st.draft_seconds,
        "verify_seconds": st.verify_seconds,
        "prefill_seconds": st.prefill_seconds,
        "verify_tokens": st.verify_tokens,
        "chain": st.chain,
        # a fixed chain length the drafter was set to (vanilla's gamma, unless adaptive): what the cost model reads
        "chain_length": None if s.settings.get("adaptive") else s.settings.get("gamma"),
    }


def run_suite(
    setup: BenchSetup,
    prompts: list[dict],
    methods: list[str],
    repeats: int = 1,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
) -> dict:
    """Records of every (prompt, repeat, method) run plus aggregates. Plain decoding ("ar") runs first on each
    prompt (the baseline for the lossless check) and again after the others (speedups are against both)."""
    if not prompts:
        raise GlanceError("the benchmark has no prompts")
    if repeats < 1:
        raise GlanceError(f"--repeats must be at least 1 (got {repeats})")
    missing = [m for m in methods if not setup.available(m)]
    if missing:
        raise GlanceError(f"cannot benchmark {', '.join(missing)}: the weights they need are not loaded")
    others = [m for m in methods if m != "ar"]
    order = ["ar"] + others
    encoded = [setup.encode(p) for p in prompts]
    total = len(order) + len(prompts) * repeats * (len(order) + bool(others))
    done = 0
    for m in order:  # warm-up: first forwards, kernels, allocator
        decode_once(setup, m, encoded[0], WARMUP_TOKENS)
        done += 1
        if progress:
            progress(done, total, f"warm-up {m}")
    records = []
    for i, (rec, ids) in enumerate(zip(prompts, encoded)):
        for r in range(repeats):
            baseline = None
            # Plain decoding on both sides of the others, whose order turns round every other time: this host's
            # speed drifts by a tenth within a minute, and against one plain run per prompt the same code read
            # 1.07x and 0.94x minutes apart. Speedups are against plain decoding on both sides.
            turn = others if (i + r) % 2 == 0 else others[::-1]
            for m in ["ar", *turn, *(["ar"] if others else [])]:
                if cancel and cancel():
                    raise GlanceError("the benchmark was cancelled")
                run = decode_once(setup, m, ids)
                if baseline is None:
                    baseline = run["tokens"]
                run["matched"] = run["tokens"] == baseline
                run |= {"method": m, "prompt_id": rec.get("id", str(len(records))), "category": rec.get("category", "")}
                run["repeat"] = r
                del run["tokens"]
                records.append(run)
                done += 1
                if progress:
                    progress(done, total, f"{rec.get('id', '')} {m}")
    return {"records": records, "methods": aggregate(records, setup), "categories": by_category(records)}


def _sum(runs: list[dict], key: str) -> float:
    return sum(r.get(key, 0) for r in runs)


def aggregate(records: list[dict], setup: BenchSetup | None = None) -> dict:
    """Per method: tau, acceptance (per depth too), tokens/s, speedup over ar, time per step split into draft,
    verify and overhead outside model calls, and whether every output matched plain decoding."""
    out: dict = {}
    methods = list(dict.fromkeys(r["method"] for r in records))
    for m in methods:
        runs = [r for r in records if r["method"] == m]
        tokens, wall = _sum(runs, "new_tokens"), _sum(runs, "wall_seconds")
        row = {
            "runs": len(runs),
            "new_tokens": int(tokens),
            "tokens_per_second": round(tokens / wall, 2) if wall else 0.0,
            "lossless": all(r["matched"] for r in runs),  # every output identical to plain decoding's
            "matched_runs": sum(r["matched"] for r in runs),
            "overhead_ms_per_step": None,
        }
        steps = _sum(runs, "steps")
        if steps:
            reached = _columns(runs, "reached")
            acc = _columns(runs, "accepted_by_depth")
            calls = steps + len(runs)  # verification steps plus one prefill per run
            row |= {
                "steps": int(steps),
                "drafted_share": round(_sum(runs, "drafted_steps") / steps, 3),
                "tau": round(_sum(runs, "emitted") / steps, 3),
                "acceptance": round(_sum(runs, "accepted") / p, 3) if (p := _sum(runs, "proposed_depth")) else None,
                "token_acceptance": round(sum(acc) / sum(reached), 3) if sum(reached) else None,
                "acceptance_by_depth": [round(a / r, 3) for a, r in zip(acc, reached) if r],
                "draft_ms_per_step": round(_sum(runs, "draft_seconds") / steps * 1e3, 3),
                "verify_ms_per_step": round(_sum(runs, "verify_seconds") / steps * 1e3, 3),
                "verify_tokens_per_step": round(_sum(runs, "verify_tokens") / steps, 2),
                "overhead_ms_per_step": round((wall - _sum(runs, "model_seconds")) / calls * 1e3, 3),
            }
            if all(r.get("chain") for r in runs) and runs[0].get("chain_length") is not None:
                row["chain_length"] = runs[0]["chain_length"]
        out[m] = row
    base = out.get("ar", {}).get("tokens_per_second")
    for row in out.values():
        row["speedup"] = round(row["tokens_per_second"] / base, 3) if base else None
    for m, spread in _per_prompt_speedups(records).items():
        out[m]["speedup_per_prompt"] = [round(f(spread), 3) for f in (min, statistics.median, max)]
        noise = 2 * statistics.stdev(spread) / len(spread) ** 0.5 if len(spread) > 1 else float("inf")
        drafted = out[m].get("drafted_share", 1.0) if m not in REFERENCES else 1.0
        out[m]["verdict"] = Speedup(out[m]["speedup"] or 0.0, drafted, noise).verdict  # "a tie", "no drafts"
    for spec in DRAFTERS:  # each method against transformers' row that does the same (vanilla: assisted generation)
        ref = out.get(spec.reference)
        if spec.name in out and ref and ref["tokens_per_second"]:
            out[spec.name][f"vs_{spec.reference}"] = round(
                out[spec.name]["tokens_per_second"] / ref["tokens_per_second"], 3
            )
    return out


def _per_prompt_speedups(records: list[dict]) -> dict[str, list[float]]:
    """Per method other than plain decoding: each run's tokens per second over plain decoding's in the runs of the
    same prompt and repeat (the plain runs on both sides of it). How far these spread shows how much of a pooled
    speedup is the host's drift: here plain decoding's own runs of one prompt ranged 103-141 tok/s."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["prompt_id"], r.get("repeat", 0)), []).append(r)
    out: dict[str, list[float]] = {}
    for runs in groups.values():
        plain = [r for r in runs if r["method"] == "ar"]
        wall, tokens = _sum(plain, "wall_seconds"), _sum(plain, "new_tokens")
        if not wall or not tokens:
            continue
        base = tokens / wall
        for r in runs:
            if r["method"] != "ar" and r["wall_seconds"]:
                out.setdefault(r["method"], []).append(r["new_tokens"] / r["wall_seconds"] / base)
    return out


def _columns(runs: list[dict], key: str) -> list[int]:
    width = max((len(r.get(key, [])) for r in runs), default=0)
    return [sum(r[key][d] for r in runs if d < len(r.get(key, []))) for d in range(width)]


def by_category(records: list[dict]) -> dict:
    """Per prompt category, per method: tau, tokens/s and speedup over ar within the category."""
    out = {}
    for cat in sorted({r["category"] for r in records}):
        out[cat] = {
            m: {k: v.get(k) for k in ("tau", "tokens_per_second", "speedup")}
            for m, v in aggregate([r for r in records if r["category"] == cat]).items()
        }
    return out
