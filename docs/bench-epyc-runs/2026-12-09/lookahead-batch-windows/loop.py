"""Where a batched step's time goes at B = 4: the target's forward against the loop around it (ar vs lookahead)."""
import cProfile, pstats, sys, time
import torch
from engine.session import Session
from engine.forward import forward_for, CompiledForward
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.variants import DrafterOptions
from engine.sampling import SamplingConfig
from engine.train.prompts import load_prompt_suite
from engine.models import RESOURCES
from engine.bench.suite import BenchSetup
torch.set_grad_enabled(False)
s = Session.load(compile=True, dtype="bfloat16", methods=["ar", "lookahead"])
setup = BenchSetup(s.target, s.parts, DrafterOptions(), SamplingConfig(), 32, draft_budget="auto")
prompts = load_prompt_suite(RESOURCES / "prompts" / "suite.jsonl")
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [setup.encode(p["prompt"]) for p in prompts]
f = forward_for(s.target.model)
f.warm_up(2); f.warm_up(4)
spent = [0.0, 0]
orig = CompiledForward.forward
def timed(self, *a, **k):
    t = time.perf_counter(); out = orig(self, *a, **k); spent[0] += time.perf_counter() - t; spent[1] += 1; return out
CompiledForward.forward = timed
def dec(m):
    make = None if m == "ar" else (lambda: build_drafter(m, setup.target, setup.parts, setup.options, setup.sampling))
    return BatchDecoder(s.target.model, make, setup.sampling, 32, setup.eos, budget=make_budget("auto"))
B = int(sys.argv[1]) if len(sys.argv) > 1 else 4
for m in ("ar", "lookahead"):
    dec(m).generate(enc[:B], rows=B)
for rnd in range(3):
    for m in ("ar", "lookahead") if rnd % 2 == 0 else ("lookahead", "ar"):
        spent[:] = [0.0, 0]
        tot = dict(wall=0, draft=0, verify=0, steps=0, tokens=0)
        prof = cProfile.Profile() if rnd == 2 else None
        for i in range(0, 16, B):
            if prof: prof.enable()
            r = dec(m).generate(enc[i:i + B], rows=B)
            if prof: prof.disable()
            tot["wall"] += r.wall_seconds; tot["draft"] += r.draft_seconds; tot["verify"] += r.verify_seconds
            tot["steps"] += r.forwards - r.prefills; tot["tokens"] += r.new_tokens
        n = tot["steps"]
        print(f"{rnd} {m:10s} tok/s {tot['tokens']/tot['wall']:6.1f} steps {n} draft {tot['draft']/n*1e3:.2f} verify {tot['verify']/n*1e3:.2f} "
              f"in forward {spent[0]/spent[1]*1e3:.2f} ms x {spent[1]} calls (prefill incl.) wall {tot['wall']*1e3:.0f} ms", flush=True)
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
