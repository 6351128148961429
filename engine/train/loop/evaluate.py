"""Measure a trained family for its model card: speculative acceptance on held-out prompts, step costs, samples."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from engine.decoding.loop import Decoder
from engine.models.loading import load_model
from engine.records.stats import RunStats

SAMPLE_PROMPTS = [  # no trailing newline: the model writes the line break and indentation as one token
    "def fibonacci(n):",
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):',
    "import os\n\n\ndef list_python_files(directory):",
]


@torch.no_grad()
def step_latency(model: torch.nn.Module, context: int = 128, new: int = 1, repeats: int = 30) -> float:
    """Median seconds of one cached forward over `new` tokens after `context` tokens."""
    device = next(model.parameters()).device
    ids = torch.randint(10, 1000, (1, context), device=device)
    times = []
    for _ in range(repeats):
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True)
        step = torch.randint(10, 1000, (1, new), device=device)
        t = time.perf_counter()
        model(input_ids=step, cache=cache, use_cache=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def family_parts(target, models: Path, method: str) -> dict:
    """The parts `method` needs from a trained family's folder (draft/, medusa/, eagle/, eagle3/)."""
    from engine.drafters.build import load_parts
    from engine.registry import parts

    return load_parts(target, [method], {p.key: str(models / p.key) for p in parts()})


def speculative_acceptance(
    models: Path,
    prompts: list[dict],
    method: str = "vanilla",
    gamma: int = 4,
    max_new_tokens: int = 64,
    dtype: str = "float32",
    medusa_tree: str | None = None,
) -> dict:
    """Greedy `method` vs plain decoding on every prompt: tau, acceptance, and whether outputs matched."""
    from engine.drafters.build import DrafterOptions, build_drafter

    target = load_model(models / "target", device="cpu", dtype=dtype)
    parts = family_parts(target, models, method)
    options = DrafterOptions(vanilla_gamma=gamma, **({"medusa_tree": medusa_tree} if medusa_tree else {}))
    tok = target.tokenizer
    eos = tok.eos_token_id
    total = RunStats()
    mismatches = []
    by_category: dict[str, list[float]] = {}
    for rec in prompts:
        ids = tok(rec["prompt"])["input_ids"]
        ar = Decoder(target.model, None, max_new_tokens=max_new_tokens, eos_token_ids=eos).generate(ids)
        drafter = build_drafter(method, target, parts, options)
        sp = Decoder(target.model, drafter, max_new_tokens=max_new_tokens, eos_token_ids=eos).generate(ids)
        if sp.tokens != ar.tokens:
            mismatches.append(rec["id"])
        for e in sp.events:
            total.add(e)
        by_category.setdefault(rec["category"], []).append(sp.summary.mean_accepted_length)
    return {
        "method": method,
        "settings": drafter.settings(),
        "dtype": dtype,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "mean_accepted_length": round(total.tau, 3),
        "acceptance_rate": round(total.acceptance or 0.0, 3),
        "tau_by_category": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_category.items())},
        "outputs_identical_to_plain_greedy": not mismatches,
        "mismatched_prompts": mismatches,
    }


def samples(models: Path, max_new_tokens: int = 60) -> list[dict]:
    target = load_model(models / "target", device="cpu", dtype="float32")
    tok = target.tokenizer
    out = []
    for prompt in SAMPLE_PROMPTS:
        res = Decoder(target.model, None, max_new_tokens=max_new_tokens, eos_token_ids=tok.eos_token_id).generate(
            tok(prompt)["input_ids"]
        )
        out.append({"prompt": prompt, "completion": tok.decode(res.tokens, skip_special_tokens=True)})
    return out


def step_costs(models: Path, dtype: str = "bfloat16") -> dict:
    target = load_model(models / "target", device="cpu", dtype=dtype)
    draft = load_model(models / "draft", device="cpu", dtype=dtype)
    t1 = step_latency(target.model)
    t8 = step_latency(target.model, new=8)
    d1 = step_latency(draft.model)
    return {
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "target_ms_per_token": round(t1 * 1e3, 2),
        "target_ms_verify_8": round(t8 * 1e3, 2),
        "draft_ms_per_token": round(d1 * 1e3, 2),
        "draft_over_target": round(d1 / t1, 3),
    }


def compare_settings(
    models: Path,
    prompts: list[dict],
    method: str,
    settings: dict,
    max_new_tokens: int = 64,
    dtype: str = "bfloat16",
    repeats: int = 1,
) -> dict:
    """tau, tokens/s and speedup of greedy `method` under each named DrafterOptions against plain decoding, same
    prompts, same process; used to pick defaults on this CPU (the numbers are written beside the defaults)."""
    from engine.drafters.build import build_drafter

    target = load_model(models / "target", device="cpu", dtype=dtype)
    parts = family_parts(target, models, method)
    eos = target.tokenizer.eos_token_id
    encoded = [target.tokenizer(r["prompt"])["input_ids"] for r in prompts]
    named = {"ar": None, **settings}
    totals = {name: [0.0, 0.0, 0, 0] for name in named}  # tokens, seconds, steps, emitted
    for _ in range(repeats):
        for ids in encoded:  # settings interleaved per prompt, so drift in the machine's speed hits all alike
            for name, options in named.items():
                drafter = None if options is None else build_drafter(method, target, parts, options)
                res = Decoder(target.model, drafter, max_new_tokens=max_new_tokens, eos_token_ids=eos).generate(ids)
                t = totals[name]
                t[0] += res.summary.new_tokens
                t[1] += res.summary.wall_seconds
                t[2] += res.summary.steps
                t[3] += sum(len(e.tokens) for e in res.events[1:])
    results = {
        name: {"tau": round(t[3] / t[2], 3), "tokens_per_second": round(t[0] / t[1], 1)} for name, t in totals.items()
    }
    base = results["ar"]["tokens_per_second"]
    for r in results.values():
        r["speedup"] = round(r["tokens_per_second"] / base, 3)
    return results
