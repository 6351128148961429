"""Old torch-op input building vs the numpy builder, interleaved (B = 4, ar and lookahead)."""
import sys, torch
sys.argv = ["x", "4"]
exec(open("docs/bench-epyc-runs/2026-12-09/lookahead-batch-windows/loop.py").read().split("for rnd in range(3):")[0])
import engine.batch as eb
from engine.tree import additive_mask, draft_visibility, node_depths
CompiledForward.forward = orig
new_build = eb.BatchDecoder._step_inputs
def old_build(self, drafts, pending, live, cached, S, cache):
    past, L = cache.get_seq_length(), len(live)
    ids = torch.full((L, S), self.pad, dtype=torch.long)
    visible = torch.zeros(L, S, past + S, dtype=torch.bool)
    positions = torch.zeros(L, S, dtype=torch.long)
    for i, b in enumerate(live):
        d = drafts[b]; n = 1 + len(d) + len(d.side_tokens)
        ids[i, :n] = torch.tensor([pending[i]] + d.tokens + d.side_tokens)
        visible[i, :, : cached[b]] = True
        visible[i, :n, past : past + n] = draft_visibility(d.parents, d.side_visible)
        visible[i, n:, past + n :] = torch.eye(S - n, dtype=torch.bool)
        offsets = [0] + node_depths(d.parents) + list(d.side_offsets)
        positions[i, :n] = cached[b] + torch.tensor(offsets)
        positions[i, n:] = cached[b]
    return ids, additive_mask(visible, self.dtype, self.device), positions
arms = [(m, k) for m in ("ar", "lookahead") for k in ("old", "new")]
tot = {a: [0, 0.0] for a in arms}
for rnd in range(4):
    for i in range(0, 16, B):
        for m, k in arms if (rnd * 16 + i) // B % 2 == 0 else arms[::-1]:
            eb.BatchDecoder._step_inputs = old_build if k == "old" else new_build
            r = dec(m).generate(enc[i:i + B], rows=B)
            tot[(m, k)][0] += r.new_tokens; tot[(m, k)][1] += r.wall_seconds
    if rnd == 0:
        tot = {a: [0, 0.0] for a in arms}
        continue
    print(rnd, {f"{m}/{k}": round(t[0] / t[1], 1) for (m, k), t in tot.items()}, flush=True)
