"""A/B of SWITCH_MARGIN (drafting must rate this share above plain steps to leave them), in one compiled session:
the four off-suite prompts, 128 new tokens, bf16, greedy, budget auto, each margin with its own budget memory,
methods and margins interleaved per prompt (order turned round every other prompt), plain decoding before and after
each prompt's runs. Prints each arm's speedup per prompt (mean over rounds) and overall, and its lowest run."""

import json
import statistics
import sys

import torch

import engine.budget as budget_mod
from engine.session import RaceSettings, Session

torch.set_grad_enabled(False)
MARGINS = [float(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0.0, 0.1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
METHODS = ["vanilla", "medusa", "eagle", "eagle3"]
prompts = [json.loads(x)["prompt"] for x in open("../../../bench-offsuite/prompts.jsonl").read().splitlines()]
session = Session.load(compile=True, time_forwards=True)
ids = [session.encode(p, chat=False) for p in prompts]
memories = {m: {} for m in MARGINS}


def run(method: str, prompt: list[int], margin: float | None) -> float:
    dec = session.decoder(method, RaceSettings([method], max_new_tokens=128))
    dec.details = False
    if margin is not None:
        dec.budget.switch_margin = margin
        budget_mod._MEMORY = memories[margin]
    return list(dec.stream(prompt))[-1].tokens_per_second


for p in ids[:2]:  # warm-up: every graph, every arm's memory
    run("ar", p, None)
    for m in METHODS:
        for g in MARGINS:
            run(m, p, g)
speed: dict = {(m, g): {i: [] for i in range(len(ids))} for m in METHODS for g in MARGINS}
for r in range(ROUNDS):
    for i, p in enumerate(ids):
        cells = [(m, g) for m in METHODS for g in MARGINS]
        if (r * len(ids) + i) % 2:
            cells = cells[::-1]
        before = run("ar", p, None)
        got = {c: run(c[0], p, c[1]) for c in cells}
        plain = (before + run("ar", p, None)) / 2
        for c, tps in got.items():
            speed[c][i].append(tps / plain)
    print(f"round {r} done", flush=True)
for m in METHODS:
    for g in MARGINS:
        per = [statistics.mean(v) for v in speed[(m, g)].values()]
        low = min(x for v in speed[(m, g)].values() for x in v)
        print(f"{m:>8} margin {g:.2f}: per prompt {' '.join(f'{x:.3f}' for x in per)}  mean {statistics.mean(per):.3f}"
              f"  lowest run {low:.3f}")
