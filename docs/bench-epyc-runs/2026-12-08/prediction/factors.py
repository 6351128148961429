import json, sys
import numpy as np
from engine.bench.sweep import replay
r = json.load(open(sys.argv[1]))["sweep"]
grid = {int(b): {int(k): v / 1e3 for k, v in row.items()} for b, row in r["forward_ms"].items()}
sizes = sorted(grid)
def cost(a, k):
    at = [float(np.interp(k, sorted(grid[b]), [grid[b][x] for x in sorted(grid[b])])) for b in sizes]
    return float(np.interp(a, sizes, at))
print("grid ms", {b: {k: round(v*1e3,2) for k, v in grid[b].items()} for b in sizes})
for m in r["methods"]:
    out = []
    for b in r["batch_sizes"]:
        c = r["rows"][str(b)][m]
        steps, _ = replay(c["row_widths"], b, r.get("continuous", False))
        g = sum(cost(a, w) for a, w in steps)
        meas = c["verify_ms_per_step"] * c["verify_forwards"] / 1e3
        d = c["draft_ms_per_step"]
        out.append(f"B{b}: verify/grid {meas/g:.2f} width {c['width']:.2f} draft {d:.2f}ms prefill {c['prefill_ms']/c['prefills']:.1f}ms")
    print(m, " | ".join(out))
