"""In one process: sweep cells at B = 2 and 4: static batches against continuous ones joining at 1, half, all rows."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.bench.sweep import run_sweep
import engine.batch as EB
import statistics
methods = ["vanilla", "medusa", "eagle", "eagle3", "lookahead", "prompt_lookup"]
s = load(methods)
st = setup_for(s, budget="auto", max_new=32)
prompts = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
torch.set_grad_enabled(False)
JOIN = {"v": None}
init = EB.BatchDecoder.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    self.join_rows = JOIN["v"]
EB.BatchDecoder.__init__ = patched
modes = {"static": (False, None), "join1": (True, 1), "half": (True, None), "all": (True, 4)}
res = {m: [] for m in modes}
names = list(modes)
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for name in (names if r % 2 == 0 else names[::-1]):
        cont, JOIN["v"] = modes[name]
        out = run_sweep(st, prompts, methods, [2, 4], continuous=cont)
        cell = {}
        for b in (2, 4):
            row = out["rows"][b]
            cell |= {f"{m}@{b}": row[m]["speedup"] for m in methods} | {f"ar@{b}": row["ar"]["tokens_per_second"]}
        res[name].append(cell)
        print(r, name, cell, flush=True)
for name, v in res.items():
    print(name, {k: round(statistics.mean(x[k] for x in v[1:] or v), 3) for k in v[0]})
