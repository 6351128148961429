"""SmolLM2-135M-Instruct, 6 chat prompts of 64 tokens: Medusa with the heads' draft vocabulary (the committed draft_vocab.safetensors) against the same heads over the
whole vocabulary, both compiled, interleaved in one process; off-suite prompts, 128 tokens, budget auto, B = 1."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
import copy
from engine.heads.compiled_readout import compile_readout
from engine.heads.medusa import MedusaHeads
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.drafters.medusa import MedusaDrafter

s = load(["medusa"], target="SmolLM2-135M-Instruct")
torch.set_grad_enabled(False)
sub = s.parts["medusa"]
target = s.target.model
full = MedusaHeads(sub.hidden, sub.vocab, sub.num_heads, sub.num_layers, target, sub.base_model)
full.load_state_dict(sub.state_dict())
full = full.to(dtype=next(sub.parameters()).dtype).eval()
print("vocab", len(sub.draft_ids), compile_readout(full, MedusaDrafter(full).topk, "full").line(), flush=True)
parts = {"full": dict(s.parts, medusa=full), "sub": dict(s.parts)}
st = setup_for(s, budget="auto", max_new=64)
import json
off = [st.encode(json.loads(l)["prompt"]) for l in open("/work/main/resources/prompts/chat.jsonl")][:6]
def dec(kind):
    make = None if kind == "ar" else (lambda: build_drafter("medusa", st.target, parts[kind], st.options, st.sampling))
    return BatchDecoder(target, make, st.sampling, 64, st.eos, budget=make_budget("auto"))
def run(kind):
    res = [dec(kind).generate([p], rows=1) for p in off]
    return [r.new_tokens / r.wall_seconds for r in res], sum(r.draft_seconds for r in res), sum(r.new_tokens for r in res) / sum(r.wall_seconds for r in res)
for k in ("ar", "full", "sub"):
    run(k)
for r in range(3):
    order = ("ar", "full", "sub") if r % 2 == 0 else ("sub", "full", "ar")
    out = {k: run(k) for k in order}
    per = {k: [round(a / b, 3) for a, b in zip(out[k][0], out["ar"][0])] for k in ("full", "sub")}
    print(r, f"ar {out['ar'][2]:.1f} full {out['full'][2]:.1f} ({out['full'][2]/out['ar'][2]:.3f}x, draft {out['full'][1]*1e3:.0f} ms) "
          f"sub {out['sub'][2]:.1f} ({out['sub'][2]/out['ar'][2]:.3f}x, draft {out['sub'][1]*1e3:.0f} ms) per prompt full {per['full']} sub {per['sub']}", flush=True)
