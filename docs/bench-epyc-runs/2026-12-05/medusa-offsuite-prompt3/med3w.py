"""Medusa on off-suite prompt 3 with depth-1 trees of 1, 2, 3, 5 candidates (full drafts) against plain decoding."""
import sys, collections
sys.path.insert(0, "/tmp/tr")
from common import *
from engine.decoder import Decoder
from engine.drafters.medusa import MedusaDrafter
torch.set_grad_enabled(False)
s = load(["medusa"])
st = setup_for(s)
enc = [st.encode(p["prompt"]) for p in prompts()]
heads = st.parts["medusa"]
def go(tree, ids):
    drafter = MedusaDrafter(heads, tree) if tree else None
    dec = Decoder(st.target.model, drafter, st.sampling, 128, st.eos, variant="x", details=False)
    res = dec.generate(ids)
    return res.summary.tokens_per_second, res.summary.mean_accepted_length
trees = {"plain": None, "k1": "[[0]]", "k2": "[[0],[1]]", "k3": "[[0],[1],[2]]", "k5": "[[0],[1],[2],[3],[4]]"}
for t in trees.values():
    go(t, enc[3][:50])
for p in (3, 0):
    for r in range(2):
        for name, t in (trees.items() if r % 2 == 0 else list(trees.items())[::-1]):
            tps, tau = go(t, enc[p])
            print(p, r, name, f"{tps:.1f} tau {tau:.2f}", flush=True)
