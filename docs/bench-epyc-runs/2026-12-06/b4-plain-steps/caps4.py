"""B=4, cold memory: the caps the cost-aware budget chooses per chunk, and step costs by cap."""
import sys, statistics, collections
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
import torch
torch.set_grad_enabled(False)
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import CostAwareBudget, FullBudget
import engine.budget as EBU
from engine.bench.suite import build_drafter

class Rec(CostAwareBudget):
    def reset(self, memory=None):
        super().reset(memory); self.log = []
    def choose(self, left=None):
        c = super().choose(left); self.log.append([c, self.narrow]); return c
    def observe_rows(self, cap, drafts, accepted, d, v, paths=None, timed=True):
        super().observe_rows(cap, drafts, accepted, d, v, paths, timed)
        self.log[-1] += [round((d + v) * 1e3, 1), round(sum(accepted) / len(accepted), 2)]

methods = sys.argv[2].split(",")
s = load(methods)
B = int(sys.argv[1]); st = setup_for(s, budget="auto", max_new=32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [st.encode(p["prompt"]) for p in prompts]
ar = BatchDecoder(st.target.model, None, st.sampling, 32, st.eos)
for m in methods:
    make = lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling)
    BatchDecoder(st.target.model, make, st.sampling, 8, st.eos).generate(enc[:2])
    EBU._MEMORY.clear()
    for i in range(0, 16, B):
        ra = ar.generate(enc[i:i+B], rows=B)
        b = Rec()
        res = BatchDecoder(st.target.model, make, st.sampling, 32, st.eos, budget=b).generate(enc[i:i+B], rows=B)
        print(m, i // B, f"speed {ra.wall_seconds / res.wall_seconds:.3f} plain step {ra.verify_seconds / (ra.forwards - 1) * 1e3:.2f}ms", flush=True)
        print("   ", " ".join(f"{'n' if n else ''}{c if c is not None else 'F'}:{t}/{a}" for c, n, t, a in b.log), flush=True)
