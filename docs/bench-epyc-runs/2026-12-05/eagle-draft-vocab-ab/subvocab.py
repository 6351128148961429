"""EAGLE-2 drafting over a reduced vocabulary (the EAGLE-3 head's 2048 frequent training tokens) against the full
vocabulary: same head weights, both compiled, interleaved in one process. B = 1 off-suite (128 tokens) and the
suite's B = 2 / 4 static batches (32 tokens, 16 prompts)."""
import sys, time
sys.path.insert(0, "/tmp/tr")
from common import *
from pathlib import Path
from safetensors import safe_open
from engine.train.prompts import load_prompt_suite
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter
from engine.forward import forward_for
from engine.heads.eagle import EagleHead, load_eagle_head
from engine.heads.compiled_step import compile_head, compiled_step_of
from torch import nn

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
class SubVocab(EagleHead):
    def logits(self, f):
        return self.readout(f)
    def to_target(self, ids):
        return self.draft_ids[ids]

s = load(["eagle"])
torch.set_grad_enabled(False)
full = s.parts["eagle"]
target = s.target.model
f = safe_open("/work/main/resources/models/eagle3/model.safetensors", "pt")
d2t = f.get_tensor("d2t")
ids = (torch.arange(len(d2t)) + d2t).sort().values
if N < len(ids):
    ids = ids[:N]
if N > len(ids):  # the rest by id order
    rest = torch.tensor([i for i in range(8192) if i not in set(ids.tolist())])
    ids = torch.cat([ids, rest[: N - len(ids)]]).sort().values
W = safe_open("/work/main/resources/models/target/model.safetensors", "pt").get_tensor("model.embed_tokens.weight")
sub = SubVocab(full.cfg, target)
sub.load_state_dict(full.state_dict())
sub.readout = nn.Linear(W.shape[1], len(ids), bias=False)
sub.readout.weight.data = W[ids].clone()
sub.register_buffer("draft_ids", ids.clone())
sub = sub.to(dtype=torch.bfloat16)
print(compile_head(sub, "sub").line(), flush=True)
from engine.heads.compiled_step import compiled_step_of
for h in (full, sub):
    compiled_step_of(h).warm_up(2); compiled_step_of(h).warm_up(4)
parts = {"full": dict(s.parts), "sub": dict(s.parts, eagle=sub)}
st = setup_for(s, budget="auto", max_new=128)
off = [st.encode(p["prompt"]) for p in prompts()]
suite = load_prompt_suite(Path("/work/main/resources/prompts/suite.jsonl"))
suite = [st.encode(p["prompt"]) for p in suite[:: max(1, len(suite) // 16)][:16]]
fw = forward_for(target); fw.warm_up(2, "t"); fw.warm_up(4, "t")
def dec(kind, max_new):
    make = None if kind == "ar" else (lambda: build_drafter("eagle", st.target, parts[kind], st.options, st.sampling))
    return BatchDecoder(target, make, st.sampling, max_new, st.eos, budget=make_budget("auto"))
def run(kind, B):
    if B == 1:
        res = [dec(kind, 128).generate([p], rows=1) for p in off]
    else:
        res = [dec(kind, 32).generate(suite[i:i + B], rows=B) for i in range(0, 16, B)]
    wall = sum(r.wall_seconds for r in res); tok = sum(r.new_tokens for r in res)
    steps = sum(sum(r.steps) for r in res) if isinstance(res[0].steps, list) else 0
    return tok / wall, sum(r.draft_seconds for r in res), tok, [r.tokens for r in res]
for k in ("ar", "full", "sub"):
    run(k, 2)
for r in range(3):
    for B in (1, 2, 4):
        order = ("ar", "full", "sub") if r % 2 == 0 else ("sub", "full", "ar")
        out = {k: run(k, B) for k in order}
        same = out["full"][3] == out["sub"][3] == out["ar"][3]
        print(r, B, " ".join(f"{k} {out[k][0]:.1f} tok/s draft {out[k][1]*1e3:.0f} ms" for k in ("ar", "full", "sub")),
              f"speedup full {out['full'][0]/out['ar'][0]:.3f} sub {out['sub'][0]/out['ar'][0]:.3f} same {same}", flush=True)
