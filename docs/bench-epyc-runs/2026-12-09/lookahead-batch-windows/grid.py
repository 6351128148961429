"""Compiled target forward cost: rows x tokens vs one row with the same token count; profile (2,4)."""
import sys, time
import torch
from engine.session import Session
from engine.forward import forward_for
from engine.forward_timing import batch_forward_costs
torch.set_grad_enabled(False)
s = Session.load(compile=True, dtype="bfloat16", methods=["ar"])
t = s.target.model
f = forward_for(t)
print(type(f).__name__)
f.warm_up(2); f.warm_up(4)
for rnd in range(2):
    for rows in (1, 2, 4):
        c = batch_forward_costs(t, rows, [1, 2, 4, 8, 16])
        print(rnd, rows, {k: round(v * 1e3, 2) for k, v in c.items()}, flush=True)
if len(sys.argv) > 1:
    from torch.profiler import profile, ProfilerActivity
    from engine.forward_timing import time_width
    for rows, k in [(1, 8), (2, 4), (2, 1)]:
        cache = f.new_cache(200)
        f(torch.randint(0, 1000, (rows, 128)), cache)
        for _ in range(5):
            time_width(f, cache, rows, k, 128, 1000, t.dtype, torch.device("cpu"))
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(10):
                time_width(f, cache, rows, k, 128, 1000, t.dtype, torch.device("cpu"))
        print(rows, k)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
