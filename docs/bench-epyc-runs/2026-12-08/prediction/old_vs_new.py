import json, sys, importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("old_sweep", "old_sweep.py"); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
from engine.bench.sweep import predict
for path in sys.argv[1:]:
    r = json.load(open(path))["sweep"]
    sw = dict(r); sw["rows"] = {int(b): row for b, row in r["rows"].items()}; sw["batch_sizes"] = [int(b) for b in r["batch_sizes"]]
    grid = {int(b): {int(k): v / 1e3 for k, v in row.items()} for b, row in r["forward_ms"].items()}
    for name, fn in (("old", old.predict), ("new", predict)):
        p = fn(sw, grid); errs = []; cross = 0
        for m, q in p.items():
            for b in sw["batch_sizes"][1:]:
                errs.append(q["predicted_speedup"][b] / sw["rows"][b][m]["speedup"] - 1)
            cross += q["predicted_crossover"] == q["measured_crossover"]
        print(path.split("/")[-2], name, "mean |err| %.3f max %.3f crossovers %d/%d" % (np.mean(np.abs(errs)), np.max(np.abs(errs)), cross, len(p)))
