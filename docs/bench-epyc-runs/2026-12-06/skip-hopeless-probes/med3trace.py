"""Medusa off-suite prompt 3 under the cost-aware budget after prompts 0-2 (bench order): caps, step ms, tokens."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
from engine.decoder import Decoder
from engine.budget import CostAwareBudget
from engine.bench.suite import build_drafter, decode_once
torch.set_grad_enabled(False)
s = load(["medusa"])
st = setup_for(s, budget="auto", max_new=128)
enc = [st.encode(p["prompt"]) for p in prompts()]
class Rec(CostAwareBudget):
    def reset(self, memory=None):
        super().reset(memory); self.log = []
    def choose(self, left=None):
        c = super().choose(left); self.log.append([c, self.narrow]); return c
    def observe_rows(self, cap, drafts, accepted, d, v, paths=None, timed=True):
        super().observe_rows(cap, drafts, accepted, d, v, paths, timed)
        self.log[-1] += [round((d + v) * 1e3, 1), accepted[0]]
for rnd in range(3):
    for p in range(4):
        ar = decode_once(st, "ar", enc[p], 128)
        if p < 3:
            r = decode_once(st, "medusa", enc[p], 128)
            continue
        d = build_drafter("medusa", st.target, st.parts, st.options, st.sampling)
        b = Rec()
        dec = Decoder(st.target.model, d, st.sampling, 128, st.eos, variant="medusa", details=False, budget=b)
        res = dec.generate(enc[p])
        print(rnd, f"speed {ar['wall_seconds'] / res.summary.wall_seconds:.3f} tau {res.summary.mean_accepted_length:.2f} plain {ar['wall_seconds']/128*1e3:.2f} ms/tok")
        print("  ", " ".join(f"{'n' if n else ''}{c if c is not None else 'F'}:{t}/{a}" for c, n, t, a in b.log))
