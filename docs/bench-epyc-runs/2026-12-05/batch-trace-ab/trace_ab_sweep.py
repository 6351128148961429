"""In one process: batched sweep cells with the batches' symbolic graph traced at 8 (new) and at 3 (old), alternating."""
import sys, statistics
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.bench.sweep import run_sweep
import engine.forward as F
B = int(sys.argv[2]); methods = sys.argv[3].split(",")
s = load(methods)
st = setup_for(s, budget="auto", max_new=32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
model = st.target.model
new = F.forward_for(model)
F.BATCH_TRACE_TOKENS = 3
old = F.CompiledForward(model)
old.warm_up(rows=B)
F.BATCH_TRACE_TOKENS = 8
variants = {"t8": new, "t3": old}
res = {k: [] for k in variants}
for r in range(int(sys.argv[1])):
    for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
        F.register(model, variants[name])
        row = run_sweep(st, prompts, methods, [B])["rows"][B]
        res[name].append({m: row[m]["speedup"] for m in methods} | {"ar": row["ar"]["tokens_per_second"]})
        print(r, name, res[name][-1], flush=True)
for name, v in res.items():
    print(name, {k: round(statistics.mean(x[k] for x in v[1:]), 3) for k in v[0]}, "(rounds after the first)")
