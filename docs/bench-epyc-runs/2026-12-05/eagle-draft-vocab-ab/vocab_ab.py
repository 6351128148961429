"""EAGLE-2 with the head's draft vocabulary against the same head over the whole vocabulary, both compiled,
interleaved in one process. argv: target (bundled|smollm2)."""
import sys, json, copy
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.forward import forward_for
from engine.heads.eagle import EagleHead
from engine.heads.compiled_step import compile_head, compiled_step_of

which = sys.argv[1]
tname = None if which == "bundled" else "SmolLM2-135M-Instruct"
s = load(["eagle"], target=tname)
torch.set_grad_enabled(False)
sub = s.parts["eagle"]
target = s.target.model
full = EagleHead(sub.cfg, target)
full.load_state_dict({k: v for k, v in sub.state_dict().items() if not k.startswith("readout.")}, strict=False)
full = full.to(dtype=next(sub.parameters()).dtype).eval()
print("vocab", len(sub.draft_ids), compile_head(full, "full").line(), flush=True)
parts = {"full": dict(s.parts, eagle=full), "sub": dict(s.parts)}
if which == "bundled":
    st = setup_for(s, budget="auto", max_new=128)
    one = [st.encode(p["prompt"]) for p in prompts()]
    suite = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
    suite = [st.encode(p["prompt"]) for p in suite[:: max(1, len(suite) // 16)][:16]]
    sizes, new1 = (1, 2), 128
    for h in (full, sub):
        compiled_step_of(h).warm_up(2)
    forward_for(target).warm_up(2, "t")
else:
    st = setup_for(s, budget="auto", max_new=64)
    chat = [json.loads(l) for l in open("/work/main/resources/prompts/chat.jsonl")][:6]
    one = [st.encode(p["prompt"]) for p in chat]
    sizes, new1 = (1,), 64
def dec(kind, max_new):
    make = None if kind == "ar" else (lambda: build_drafter("eagle", st.target, parts[kind], st.options, st.sampling))
    return BatchDecoder(target, make, st.sampling, max_new, st.eos, budget=make_budget("auto"))
def run(kind, B):
    if B == 1:
        res = [dec(kind, new1).generate([p], rows=1) for p in one]
    else:
        res = [dec(kind, 32).generate(suite[i:i + B], rows=B) for i in range(0, 16, B)]
    wall = sum(r.wall_seconds for r in res); tok = sum(r.new_tokens for r in res)
    return tok / wall, sum(r.draft_seconds for r in res), tok, [r.mean_accepted_length for r in res]
for k in ("ar", "full", "sub"):
    run(k, 1)
for r in range(3):
    for B in sizes:
        order = ("ar", "full", "sub") if r % 2 == 0 else ("sub", "full", "ar")
        out = {k: run(k, B) for k in order}
        print(r, B, " ".join(f"{k} {out[k][0]:.1f} tok/s draft {out[k][1]*1e3:.0f} ms tau {sum(out[k][3])/len(out[k][3]):.2f}" for k in ("ar", "full", "sub")),
              f"speedup full {out['full'][0]/out['ar'][0]:.3f} sub {out['sub'][0]/out['ar'][0]:.3f}", flush=True)
