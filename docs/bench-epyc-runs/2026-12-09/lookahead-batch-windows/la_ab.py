"""Lookahead in static batches of B rows (argv[1], default 4): the window the auto budget fits against fixed ones, and
"+skip": a step in which no row's full window has a pooled n-gram for its pending token runs plain (S = 1) for all
rows, the windows waiting. Bundled target, bf16, compiled, the sweep's 16 suite prompts, 32 new tokens; arms
interleaved per batch of prompts (alternating order), 3 rounds; cumulative speedup over batched plain decoding."""
import sys, time
import torch
from engine.session import Session
from engine.forward import forward_for
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter, DrafterOptions
from engine.sampling import SamplingConfig
from engine.train.prompts import load_prompt_suite
from engine.models import RESOURCES
from engine.bench.suite import BenchSetup
from engine.drafters.lookahead import LookaheadDrafter
torch.set_grad_enabled(False)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 4
s = Session.load(compile=True, dtype="bfloat16", methods=["ar", "lookahead"])
setup = BenchSetup(s.target, s.parts, DrafterOptions(), SamplingConfig(), 32, draft_budget="auto")
prompts = load_prompt_suite(RESOURCES / "prompts" / "suite.jsonl")
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [setup.encode(p["prompt"]) for p in prompts]
f = forward_for(s.target.model); f.warm_up(2); f.warm_up(B)
arms = {"ar": None, "fit": "fit", "fit+skip": "fit", "1/2/1": (1, 2, 1), "1/2/1+skip": (1, 2, 1), "1/3/1": (1, 3, 1),
        "1/3/2": (1, 3, 2), "2/3/1": (2, 3, 1), "1/4/1": (1, 4, 1)}
chosen = {}
from engine.drafters.base import RowByRow
from engine.tree import Draft
SKIP = [False]
orig_propose = RowByRow.propose
stats = {"skipped": 0, "steps": 0}
def propose(self, states, max_tokens, active):
    drafts = orig_propose(self, states, max_tokens, active)
    if not SKIP[0]:
        return drafts
    live = [b for b, a in enumerate(active) if a]
    stats["steps"] += 1
    if live and all(self.drafters[b].full and not drafts[b].tokens and drafts[b].side_tokens for b in live):
        stats["skipped"] += 1
        return [Draft() for _ in drafts]
    return drafts
RowByRow.propose = propose
def dec(arm):
    SKIP[0] = arm.endswith("+skip")
    if arm == "ar":
        return BatchDecoder(s.target.model, None, setup.sampling, 32, setup.eos, budget=make_budget("auto"))
    if arms[arm] == "fit":
        make = lambda: build_drafter("lookahead", setup.target, setup.parts, setup.options, setup.sampling)
        return BatchDecoder(s.target.model, make, setup.sampling, 32, setup.eos, budget=make_budget("auto"))
    w, n, g = arms[arm]
    return BatchDecoder(s.target.model, lambda: LookaheadDrafter(w, n, g), setup.sampling, 32, setup.eos)
for a in arms:
    dec(a).generate(enc[:B], rows=B)
tot = {a: [0, 0.0, 0, 0] for a in arms}
names = list(arms)
for rnd in range(3):
    for i in range(0, 16, B):
        order = names if (rnd * 16 + i) // B % 2 == 0 else names[::-1]
        for a in order:
            r = dec(a).generate(enc[i:i + B], rows=B)
            t = tot[a]; t[0] += r.new_tokens; t[1] += r.wall_seconds; t[2] += sum(r.steps); t[3] += r.new_tokens - len(r.tokens)
    base = tot["ar"][0] / tot["ar"][1]
    print(stats, end=" "); print(f"round {rnd}: " + "  ".join(f"{a} {t[0]/t[1]/base:.3f}x (tau {t[3]/max(t[2],1):.2f})" for a, t in tot.items()), flush=True)
