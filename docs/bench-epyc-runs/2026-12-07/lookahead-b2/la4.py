"""B=4 (and 2) lookahead in one process: window every step (today), plain every step, batch WindowBudget."""
import sys, statistics
sys.path.insert(0, __import__("os").path.dirname(__file__))  # common.py beside it
from common import *
from pathlib import Path
import torch
torch.set_grad_enabled(False)
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import FullBudget, make_budget
from engine.window_budget import WindowBudget
from engine.bench.suite import build_drafter
import engine.batch as EB

class Plain(FullBudget):
    name = "plain"
    def choose(self, left=None):
        return 0

s = load(["lookahead"])
st = setup_for(s, budget="auto", max_new=int(sys.argv[2]) if len(sys.argv) > 2 else 32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [st.encode(p["prompt"]) for p in prompts]
make = lambda: build_drafter("lookahead", st.target, st.parts, st.options, st.sampling)
from engine.variants import DrafterOptions
small_opts = DrafterOptions(lookahead_window=1, lookahead_ngram=3, lookahead_guesses=1)
make_small = lambda: build_drafter("lookahead", st.target, st.parts, small_opts, st.sampling)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 4

def run(kind):
    if kind == "ar":
        dec = BatchDecoder(st.target.model, None, st.sampling, st.max_new_tokens, st.eos)
    elif kind == "small":
        dec = BatchDecoder(st.target.model, make_small, st.sampling, st.max_new_tokens, st.eos, budget=make_budget("auto"))
    else:
        dec = BatchDecoder(st.target.model, make, st.sampling, st.max_new_tokens, st.eos, budget=make_budget("auto"))
    from engine.drafters.ngram_pool import NgramDrafter
    if kind == "plain":
        NgramDrafter.budgeted = True
        dec.budget = Plain()
    elif kind == "wbudget":
        NgramDrafter.budgeted = True
        dec.budget = WindowBudget()  # replaced per stream below
    else:
        NgramDrafter.budgeted = False
    tok = wall = 0.0
    steps = 0
    for i in range(0, len(enc), B):
        chunk = enc[i:i+B]
        if kind == "wbudget":
            # per-stream: width/guessed from the stream's drafters
            orig = dec.make_drafter
            made = []
            def mk():
                d = orig(); made.append(d); return d
            dec.make_drafter = mk
            wb = WindowBudget(width=lambda: made[0].row_tokens(), guessed=lambda: [g for d in made for g in d.take_guessed()])
            dec.budget = wb
            res = dec.generate(chunk, rows=B)
            dec.make_drafter = orig
        else:
            res = dec.generate(chunk, rows=B)
        tok += res.new_tokens; wall += res.wall_seconds; steps += res.forwards
    NgramDrafter.budgeted = False
    return tok / wall, steps

# warm
for k in ("ar", "window", "small", "plain", "wbudget"):
    run(k)
res = {k: [] for k in ("ar", "window", "small", "plain", "wbudget")}
for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    order = list(res) if r % 2 == 0 else list(res)[::-1]
    cell = {}
    for k in order:
        cell[k] = run(k)
    for k in res:
        res[k].append(cell[k][0] / cell["ar"][0])
    print(r, {k: (round(v[0], 1), v[1]) for k, v in cell.items()}, {k: round(cell[k][0] / cell["ar"][0], 3) for k in cell}, flush=True)
print("mean", {k: round(statistics.mean(v), 3) for k, v in res.items()})
