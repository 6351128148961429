import sys; sys.path.insert(0, "/work/main")
import torch
torch.set_grad_enabled(False)
from engine.session import Session
from engine.forward import forward_for
from engine.forward_timing import batch_forward_costs
s = Session.load(None, {}, ["ar", "lookahead"], device="cpu", dtype="bfloat16", compile=True, progress=lambda *a: None)
m = s.target.model
forward_for(m).warm_up(4, "t", None)
for r in range(2):
    for B in (1, 2, 3, 4):
        c = batch_forward_costs(m, B, (1, 2, 3, 4, 5, 6, 8))
        print(B, {k: round(v * 1e3, 2) for k, v in c.items()}, flush=True)
