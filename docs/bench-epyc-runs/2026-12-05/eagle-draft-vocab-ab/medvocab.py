"""Medusa over a draft vocabulary (the bundled EAGLE-3 head's 2,048 frequent tokens) against the whole vocabulary:
same heads, both compiled, interleaved in one process; off-suite prompts, 128 tokens, budget auto, B = 1."""
import sys
sys.path.insert(0, "/tmp/tr")
from common import *
from safetensors import safe_open
from torch import nn
import engine.heads.readout as R
import engine.heads.compiled_readout as CR
from engine.heads.medusa import MedusaHeads
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.drafters.medusa import MedusaDrafter

class SubMedusa(MedusaHeads):
    def forward(self, hidden):
        return self.readout(torch.stack([head(hidden) for head in self]))
    def first_logits(self, hidden):
        return self.readout(self[0](hidden))

orig = R.top_candidates
def mapped(head, x, k, log_probs=True, first=False):
    out = orig(head, x, k, log_probs, first)
    values, ids = out
    if not isinstance(head, SubMedusa):
        return out
    if isinstance(head, SubMedusa):
        return torch.return_types.topk([values, head.draft_ids[ids]])
    return values, ids
R.top_candidates = mapped
CR.top_candidates = mapped

s = load(["medusa"])
torch.set_grad_enabled(False)
full = s.parts["medusa"]
target = s.target.model
d2t = safe_open("/work/main/resources/models/eagle3/model.safetensors", "pt").get_tensor("d2t")
ids = (torch.arange(len(d2t)) + d2t).sort().values
sub = SubMedusa(full.hidden, full.vocab, full.num_heads, full.num_layers, target, full.base_model)
sub.load_state_dict(full.state_dict())
W = target.get_output_embeddings().weight.detach()
ro = nn.Linear(W.shape[1], len(ids), bias=False)
ro.weight.data = W[ids].clone().float()
sub.__dict__["readout"] = ro.to(W.dtype).requires_grad_(False)
sub.register_buffer('draft_ids', ids, persistent=False)
sub = sub.to(dtype=W.dtype).eval()
print(CR.compile_readout(sub, MedusaDrafter(sub).topk, "sub").line(), flush=True)
parts = {"full": dict(s.parts), "sub": dict(s.parts, medusa=sub)}
st = setup_for(s, budget="auto", max_new=128)
off = [st.encode(p["prompt"]) for p in prompts()]
def dec(kind):
    make = None if kind == "ar" else (lambda: build_drafter("medusa", st.target, parts[kind], st.options, st.sampling))
    return BatchDecoder(target, make, st.sampling, 128, st.eos, budget=make_budget("auto"))
def run(kind):
    res = [dec(kind).generate([p], rows=1) for p in off]
    return [r.new_tokens / r.wall_seconds for r in res], sum(r.draft_seconds for r in res), sum(r.new_tokens for r in res) / sum(r.wall_seconds for r in res)
for k in ("ar", "full", "sub"):
    run(k)
for r in range(4):
    order = ("ar", "full", "sub") if r % 2 == 0 else ("sub", "full", "ar")
    out = {k: run(k) for k in order}
    per = {k: [round(a / b, 3) for a, b in zip(out[k][0], out["ar"][0])] for k in ("full", "sub")}
    print(r, f"ar {out['ar'][2]:.1f} full {out['full'][2]:.1f} ({out['full'][2]/out['ar'][2]:.3f}x, draft {out['full'][1]*1e3:.0f} ms) "
          f"sub {out['sub'][2]:.1f} ({out['sub'][2]/out['ar'][2]:.3f}x, draft {out['sub'][1]*1e3:.0f} ms) per prompt full {per['full']} sub {per['sub']}", flush=True)
