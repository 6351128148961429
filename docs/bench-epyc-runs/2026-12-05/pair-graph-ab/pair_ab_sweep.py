"""In one process: B = 4 sweep cells with the pair graph on and off, alternating (ABAB...)."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.bench.sweep import run_sweep
import engine.forward as F
methods = ["eagle", "lookahead", "prompt_lookup"]
s = load(methods)
st = setup_for(s, budget="auto", max_new=32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
fwd = F.forward_for(st.target.model)
pair = fwd.pair_graph
res = {"on": [], "off": []}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
        fwd.pair_graph = pair if name == "on" else None
        out = run_sweep(st, prompts, methods, [4])
        row = out["rows"][4]
        res[name].append({m: row[m]["speedup"] for m in methods} | {"ar": row["ar"]["tokens_per_second"]})
        print(r, name, res[name][-1], flush=True)
import statistics
for name, v in res.items():
    print(name, {k: round(statistics.mean(x[k] for x in v), 3) for k in v[0]})
