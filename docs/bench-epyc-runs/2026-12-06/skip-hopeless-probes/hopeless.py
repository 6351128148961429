"""The cost-aware budget with and without SKIP_HOPELESS, one process, interleaved, each its own memory: off-suite
prompts (128 tokens, B = 1) and 8 suite prompts (64 tokens); vanilla, Medusa, EAGLE-2, EAGLE-3."""
import sys, weakref, collections
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.decoder import Decoder
from engine.budget import CostAwareBudget
import engine.budget as EBU
from engine.bench.suite import build_drafter, decode_once
torch.set_grad_enabled(False)
methods = ["vanilla", "medusa", "eagle", "eagle3"]
s = load(methods)
st = setup_for(s, budget="auto", max_new=128)
off = [st.encode(p["prompt"]) for p in prompts()]
suite = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
suite = [st.encode(p["prompt"]) for p in suite[3::max(1, len(suite) // 8)][:8]]
mem = {True: weakref.WeakKeyDictionary(), False: weakref.WeakKeyDictionary()}
def run(m, ids, new, skip):
    if m == "ar":
        r = decode_once(st, "ar", ids, new)
        return r["new_tokens"], r["wall_seconds"]
    EBU._MEMORY = mem[skip]
    d = build_drafter(m, st.target, st.parts, st.options, st.sampling)
    res = Decoder(st.target.model, d, st.sampling, new, st.eos, variant=m, details=False,
                  budget=CostAwareBudget(skip_hopeless=skip)).generate(ids)
    return res.summary.new_tokens, res.summary.wall_seconds
for m in methods:
    for skip in (True, False):
        run(m, off[0][:60], 16, skip)
acc = collections.defaultdict(list)
for rnd in range(int(sys.argv[1])):
    for label, group, new in (("off", off, 128), ("suite", suite, 64)):
        tot = collections.defaultdict(lambda: [0, 0.0]); per = collections.defaultdict(list)
        for pi, ids in enumerate(group):
            cells = [("ar", None)] + [(m, k) for m in methods for k in (True, False)]
            if (rnd + pi) % 2: cells = cells[::-1]
            got = {}
            for m, k in cells:
                got[(m, k)] = run(m, ids, new, k)
                tot[(m, k)][0] += got[(m, k)][0]; tot[(m, k)][1] += got[(m, k)][1]
            a = got[("ar", None)][0] / got[("ar", None)][1]
            for c, (n, w) in got.items():
                per[c].append(n / w / a)
        a = tot[("ar", None)][0] / tot[("ar", None)][1]
        line = []
        for m in methods:
            sp = {k: tot[(m, k)][0] / tot[(m, k)][1] / a for k in (True, False)}
            acc[(label, m, True)].append(sp[True]); acc[(label, m, False)].append(sp[False])
            line.append(f"{m} skip {sp[True]:.3f} [{min(per[(m, True)]):.2f}] / old {sp[False]:.3f} [{min(per[(m, False)]):.2f}]")
        print(rnd, label, f"plain {a:.0f}", " | ".join(line), flush=True)
for (label, m, k), v in sorted(acc.items()):
    print("mean", label, m, "skip" if k else "old", round(sum(v) / len(v), 3))
