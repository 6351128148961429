"""A batch's per-row cache moves done eager after each step (as before) against done in the next forward's compiled
graph (StaticKVCache.move_row_entries now), interleaved in one process. Bundled target, bf16, compiled, the sweep's
16 suite prompts, 32 new tokens, static batches of B (argv[1], default 4), auto budget; arms alternate order per
batch of prompts, 3 rounds. Prints each arm's tokens per second and the methods' speedups under each."""
import sys
import torch
from engine.session import Session
from engine.forward import forward_for
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter, DrafterOptions
from engine.sampling import SamplingConfig
from engine.train.prompts import load_prompt_suite
from engine.models import RESOURCES
from engine.bench.suite import BenchSetup
from engine.static_cache import StaticKVCache, apply_moves
torch.set_grad_enabled(False)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 4
METHODS = ["ar", "lookahead", "eagle", "medusa"]
s = Session.load(compile=True, dtype="bfloat16", methods=METHODS)
setup = BenchSetup(s.target, s.parts, DrafterOptions(), SamplingConfig(), 32, draft_budget="auto")
prompts = load_prompt_suite(RESOURCES / "prompts" / "suite.jsonl")
prompts = prompts[:: max(1, len(prompts) // 16)][:16]
enc = [setup.encode(p["prompt"]) for p in prompts]
f = forward_for(s.target.model)
f.warm_up(2)
f.warm_up(B)
in_graph = StaticKVCache.move_row_entries


def eager_moves(self, rows, src, dst, length):
    """The moves as they were done before: at once, eager."""
    self.settle()
    live = self._live()
    if rows and live:
        t = [torch.tensor(x) for x in (src, dst, rows)]
        apply_moves(live, *t)
    self.set_length(length)


def dec(m):
    make = None if m == "ar" else (lambda: build_drafter(m, setup.target, setup.parts, setup.options, setup.sampling))
    return BatchDecoder(s.target.model, make, setup.sampling, 32, setup.eos, budget=make_budget("auto"))


arms = [(m, k) for m in METHODS for k in ("eager", "graph")]
for m, k in arms:  # warm every method and both kinds (the graphs take a batch's rows either way)
    StaticKVCache.move_row_entries = eager_moves if k == "eager" else in_graph
    dec(m).generate(enc[:B], rows=B)
tot = {a: [0, 0.0] for a in arms}
for rnd in range(3):
    for i in range(0, 16, B):
        for m, k in arms if (rnd * 16 + i) // B % 2 == 0 else arms[::-1]:
            StaticKVCache.move_row_entries = eager_moves if k == "eager" else in_graph
            r = dec(m).generate(enc[i : i + B], rows=B)
            tot[(m, k)][0] += r.new_tokens
            tot[(m, k)][1] += r.wall_seconds
    rate = {a: t[0] / t[1] for a, t in tot.items()}
    line = [f"round {rnd} B={B}:"]
    for k in ("eager", "graph"):
        line.append(f"[{k}] ar {rate[('ar', k)]:.1f} tok/s, " + ", ".join(
            f"{m} {rate[(m, k)] / rate[('ar', k)]:.3f}x" for m in METHODS[1:]))
    print("  ".join(line), flush=True)
