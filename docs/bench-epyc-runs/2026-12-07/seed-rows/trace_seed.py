"""The sweep's order for one method (B = 1 then 2 then 4, 16 prompts, 32 tokens, auto budget), caps per chunk."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))  # common.py beside it
from common import *
import engine.budget as eb
from engine.batch import BatchDecoder
from engine.budget import CostAwareBudget
from engine.variants import build_drafter

m = sys.argv[1]; eb.SEED_ROWS = sys.argv[2] == "on"
s = load([m]); st = setup_for(s)
enc = [st.encode(p["prompt"]) for p in prompts(16)]
T = st.target.model

class Rec(CostAwareBudget):
    def choose(self, left=None):
        c = CostAwareBudget.choose(self, left)
        self.caps.append("N" if c is None else (f"{c}n" if self.narrow else str(c)))
        return c
    def reset(self, memory=None):
        CostAwareBudget.reset(self, memory); self.caps = []
        self.info = (memory.get("seed") is not None, round(self.plain_floor * 1e3, 2), [round(x*1e3,1) for x in self.entry_costs], self.plain_best) if memory else None

for b in (1, 2, 4):
    for who in ("ar", m):
        make = None if who == "ar" else (lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling))
        bud = Rec(); dec = BatchDecoder(T, make, st.sampling, 32, st.eos, budget=bud)
        tok = wall = 0
        for i in range(0, 16, b):
            res = dec.generate(enc[i:i+b], rows=b); tok += res.new_tokens; wall += res.wall_seconds
            if who != "ar" and i < 4 * b:
                print(b, i, bud.info, "".join(f"{c:>3}" for c in bud.caps), flush=True)
        print(b, who, round(tok / wall, 1), flush=True)
