"""B=4: each method forced to plain steps (cap 0) against plain decoding, one process: the idle drafter's cost."""
import sys, statistics, time
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
import torch
torch.set_grad_enabled(False)
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import FullBudget, make_budget
from engine.bench.suite import build_drafter

class Plain(FullBudget):
    name = "plain"
    def choose(self, left=None):
        return 0

methods = ["vanilla", "medusa", "eagle", "eagle3"]
s = load(methods)
B = int(sys.argv[1]); st = setup_for(s, budget="auto", max_new=32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [st.encode(p["prompt"]) for p in prompts]

def run(m, kind):
    make = None if m == "ar" else (lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling))
    budget = Plain() if kind == "plain" else make_budget(kind)
    dec = BatchDecoder(st.target.model, make, st.sampling, st.max_new_tokens, st.eos, budget=budget)
    tok = wall = d = v = pre = 0.0; steps = 0
    for i in range(0, len(enc), B):
        res = dec.generate(enc[i:i+B], rows=B)
        tok += res.new_tokens; wall += res.wall_seconds; steps += res.forwards - res.prefills
        d += res.draft_seconds; v += res.verify_seconds
    return tok / wall, d / steps * 1e3, v / steps * 1e3, (wall - d - v) * 1e3

cells = [("ar", "full")] + [(m, "plain") for m in methods] + [(m, "auto") for m in methods]
for c in cells:
    run(*c)
acc = {c: [] for c in cells}
for r in range(int(sys.argv[2])):
    order = cells if r % 2 == 0 else cells[::-1]
    out = {c: run(*c) for c in order}
    for c in cells:
        acc[c].append(out[c][0] / out[("ar", "full")][0])
    print(r, " ".join(f"{m}/{k}: {o[0]/out[('ar','full')][0]:.3f} d{o[1]:.2f} v{o[2]:.2f} pre{o[3]:.0f}" for (m, k), o in out.items()), flush=True)
print("mean", {f"{m}/{k}": round(statistics.mean(v), 3) for (m, k), v in acc.items()})
