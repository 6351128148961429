"""Medusa on off-suite prompt 3: budget auto vs fixed caps vs plain decoding, interleaved."""
import sys, collections
sys.path.insert(0, "/tmp/tr")
from common import *
from ab import run, Fixed
from engine.decoder import Decoder
from engine.budget import CostAwareBudget
from engine.bench.suite import build_drafter
torch.set_grad_enabled(False)
s = load(["medusa"])
st = setup_for(s)
enc = [st.encode(p["prompt"]) for p in prompts()]
ids = enc[3]
auto = CostAwareBudget()
def go(method, budget):
    drafter = build_drafter(method, st.target, st.parts, st.options, st.sampling) if method != "ar" else None
    dec = Decoder(st.target.model, drafter, st.sampling, 128, st.eos, variant=method, details=False, budget=budget)
    res = dec.generate(ids)
    kinds = collections.Counter("plain" if not e.draft_tokens else f"d{len(e.draft_tokens)}" for e in res.events[1:])
    acc = collections.Counter(len(e.tokens) for e in res.events[1:] if e.draft_tokens)
    return res.summary.tokens_per_second, res.summary.mean_accepted_length, dict(kinds), dict(acc)
for _ in range(2):
    go("ar", None); go("medusa", auto)
arms = [("ar", lambda: None), ("auto", lambda: auto), ("cap1", lambda: Fixed(1, False)), ("cap0", lambda: Fixed(0, False))]
for r in range(3):
    for name, b in (arms if r % 2 == 0 else arms[::-1]):
        tps, tau, kinds, acc = go("ar" if name == "ar" else "medusa", b())
        print(r, name, f"{tps:.1f} tau {tau:.2f}", kinds, acc, flush=True)
