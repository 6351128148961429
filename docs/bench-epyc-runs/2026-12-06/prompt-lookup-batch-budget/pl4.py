"""B=4 prompt lookup in one process: full drafts (today) against the cost-aware depth cap (budgeted)."""
import sys, statistics
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
import torch
torch.set_grad_enabled(False)
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.bench.suite import build_drafter
from engine.drafters.prompt_lookup import PromptLookupDrafter

s = load(["prompt_lookup"])
B = int(sys.argv[1]); st = setup_for(s, budget="auto", max_new=int(sys.argv[2]))
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [st.encode(p["prompt"]) for p in prompts]
make = lambda: build_drafter("prompt_lookup", st.target, st.parts, st.options, st.sampling)

def run(kind):
    PromptLookupDrafter.budgeted = kind == "auto"
    dec = BatchDecoder(st.target.model, None if kind == "ar" else make, st.sampling, st.max_new_tokens, st.eos, budget=make_budget("auto"))
    tok = wall = 0.0; steps = 0; taus = []
    for i in range(0, len(enc), B):
        res = dec.generate(enc[i:i+B], rows=B)
        tok += res.new_tokens; wall += res.wall_seconds; steps += res.forwards; taus.append(res.mean_accepted_length)
    PromptLookupDrafter.budgeted = False
    return tok / wall, steps, round(statistics.mean(taus), 2)

for k in ("ar", "full", "auto"):
    run(k)
res = {k: [] for k in ("ar", "full", "auto")}
for r in range(int(sys.argv[3])):
    order = list(res) if r % 2 == 0 else list(res)[::-1]
    cell = {k: run(k) for k in order}
    for k in res:
        res[k].append(cell[k][0] / cell["ar"][0])
    print(r, {k: (round(v[0], 1), v[1], v[2]) for k, v in cell.items()}, {k: round(cell[k][0] / cell["ar"][0], 3) for k in cell}, flush=True)
print("mean", {k: round(statistics.mean(v), 3) for k, v in res.items()})
