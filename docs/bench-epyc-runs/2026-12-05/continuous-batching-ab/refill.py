"""Where continuous batching spends: prefill / draft / verify seconds per mode, interleaved (B = 2 and 4)."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.forward import forward_for
import engine.batch as EB
methods = ["lookahead", "prompt_lookup", "eagle"]
s = load(methods)
st = setup_for(s, budget="auto", max_new=32)
torch.set_grad_enabled(False)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [st.encode(p["prompt"]) for p in prompts]
fw = forward_for(st.target.model); fw.warm_up(2, "t")
def dec(m):
    make = None if m == "ar" else (lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling))
    return BatchDecoder(st.target.model, make, st.sampling, 32, st.eos, budget=make_budget("auto"))
for m in ["ar"] + methods:
    dec(m).generate(enc[:4], rows=2)
for r in range(3):
    for b in (2, 4):
        for mode in (("cont", "static") if r % 2 == 0 else ("static", "cont")):
            for m in ["ar"] + methods:
                tot = [0.0, 0.0, 0.0, 0, 0]
                halves = [enc[:8], enc[8:]]
                for h in halves:
                    chunks = [h] if mode == "cont" else [h[i:i + b] for i in range(0, 8, b)]
                    for c in chunks:
                        res = dec(m).generate(c, rows=b)
                        tot[0] += res.wall_seconds - res.draft_seconds - res.verify_seconds
                        tot[1] += res.draft_seconds; tot[2] += res.verify_seconds; tot[3] += res.new_tokens; tot[4] += res.prefills
                wall = sum(tot[:3])
                print(r, b, mode, m, f"tok/s {tot[3]/wall:.1f} prefill {tot[0]*1e3:.0f} ms ({tot[4]}) draft {tot[1]*1e3:.0f} verify {tot[2]*1e3:.0f}", flush=True)
