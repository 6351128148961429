"""B = 2 / 4 as the sweep runs it (16 suite prompts, static batches, 32 tokens, auto budget), each cell's memory
prepared: cold (nothing at this batch size, seeding off), seeded (the B = 1 or 2 run's snapshot, seeding on), warm
(a previous run at this batch size). One process, interleaved, alternating order."""
import sys, statistics, copy, weakref
sys.path.insert(0, __import__("os").path.dirname(__file__))  # common.py beside it
from common import *
import engine.budget as eb
from engine.batch import BatchDecoder
from engine.budget import make_budget
from engine.variants import build_drafter

methods = sys.argv[3].split(",") if len(sys.argv) > 3 else ["vanilla", "medusa", "eagle", "eagle3"]
s = load(methods)
B = int(sys.argv[1]); SRC = B // 2
st = setup_for(s, budget="auto", max_new=32)
enc = [st.encode(p["prompt"]) for p in prompts(16)]
T = st.target.model

def run(m, rows, mem, seed_on=True):
    eb._MEMORY = mem
    eb.SEED_ROWS = seed_on
    make = None if m == "ar" else (lambda: build_drafter(m, st.target, st.parts, st.options, st.sampling))
    dec = BatchDecoder(T, make, st.sampling, st.max_new_tokens, st.eos, budget=make_budget("auto"))
    tok = wall = 0.0; caps = []
    for i in range(0, len(enc), rows):
        res = dec.generate(enc[i:i+rows], rows=rows)
        tok += res.new_tokens; wall += res.wall_seconds
    return tok / wall

shared = weakref.WeakKeyDictionary()
# plain decoding at both sizes fills the shared plain lists (as the sweep's ar cells do before a method's)
for r in (SRC, B):
    run("ar", r, shared)
src_mem = {}
for m in methods:  # a run at the smaller size: its snapshot seeds; then one at B: the warm memory
    mem = weakref.WeakKeyDictionary(); mem[T] = {}
    eb._PLAIN = weakref.WeakKeyDictionary({T: copy.deepcopy(dict(eb._PLAIN[T]))})
    run(m, SRC, mem, False)
    src_mem[m] = {k: v for k, v in mem[T].items()}
    print(m, "src keys", [(k[2], "recent" in v, v.get("plain")) for k, v in mem[T].items()], flush=True)

def prepared(m, kind):
    mem = weakref.WeakKeyDictionary(); mem[T] = {}
    if kind in ("seeded", "warm"):
        mem[T].update(copy.deepcopy(src_mem[m]))
    if kind == "warm":
        run(m, B, mem, True)
    return mem

plain_lists = copy.deepcopy(dict(eb._PLAIN[T]))
cells = [("ar", "-")] + [(m, k) for m in methods for k in ("cold", "seeded", "warm")]
acc = {c: [] for c in cells}
for r in range(int(sys.argv[2])):
    order = cells if r % 2 == 0 else cells[::-1]
    out = {}
    for m, k in order:
        eb._PLAIN = weakref.WeakKeyDictionary({T: copy.deepcopy(plain_lists)})
        mem = prepared(m, k) if m != "ar" else weakref.WeakKeyDictionary()
        out[(m, k)] = run(m, B, mem, k != "cold")
    base = out[("ar", "-")]
    for c in cells:
        acc[c].append(out[c] / base)
    print(r, f"plain {base:.1f}", " ".join(f"{m}/{k} {out[(m,k)]/base:.3f}" for m, k in cells[1:]), flush=True)
print("mean", {f"{m}/{k}": round(statistics.mean(v), 3) for (m, k), v in acc.items()})
