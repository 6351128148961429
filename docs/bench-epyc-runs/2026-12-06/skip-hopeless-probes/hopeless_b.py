"""SKIP_HOPELESS at B = 2 and 4: 16 suite prompts, 32 tokens, static batches, one process, each budget its own memory."""
import sys, weakref, collections
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import CostAwareBudget
import engine.budget as EBU
from engine.bench.suite import build_drafter
torch.set_grad_enabled(False)
methods = ["vanilla", "medusa", "eagle", "eagle3"]
s = load(methods)
st = setup_for(s, budget="auto", max_new=32)
suite = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
enc = [st.encode(p["prompt"]) for p in suite[:: max(1, len(suite) // 16)][:16]]
mem = {True: weakref.WeakKeyDictionary(), False: weakref.WeakKeyDictionary()}
def run(m, B, skip):
    EBU._MEMORY = mem[bool(skip)]
    make = None if m == "ar" else (lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling))
    dec = BatchDecoder(st.target.model, make, st.sampling, 32, st.eos, budget=CostAwareBudget(skip_hopeless=bool(skip)))
    tok = wall = 0.0
    for i in range(0, 16, B):
        r = dec.generate(enc[i:i + B], rows=B)
        tok += r.new_tokens; wall += r.wall_seconds
    return tok / wall
cells = [("ar", None)] + [(m, k) for m in methods for k in (True, False)]
for B in (2, 4):
    for c in cells:
        run(c[0], B, c[1])
acc = collections.defaultdict(list)
for rnd in range(int(sys.argv[1])):
    for B in (2, 4):
        order = cells if rnd % 2 == 0 else cells[::-1]
        got = {c: run(c[0], B, c[1]) for c in order}
        a = got[("ar", None)]
        for m in methods:
            for k in (True, False):
                acc[(B, m, k)].append(got[(m, k)] / a)
        print(rnd, B, f"plain {a:.0f}", " | ".join(f"{m} skip {got[(m, True)]/a:.3f} old {got[(m, False)]/a:.3f}" for m in methods), flush=True)
for (B, m, k), v in sorted(acc.items()):
    print("mean", B, m, "skip" if k else "old", round(sum(v) / len(v), 3))
