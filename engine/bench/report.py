"""Benchmark output: Markdown tables, results.json (every number plus versions, device, models, settings) and PNG
charts."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from engine.bench.reference import REFERENCE_LABELS
from engine.registry import BASELINE, DRAFTERS

LABELS = {s.name: s.label for s in DRAFTERS} | {BASELINE: "plain decoding (Glance)"} | REFERENCE_LABELS
METHOD_ORDER = tuple(LABELS)


def _fmt(v, digits: int = 2, suffix: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}{suffix}"
    return f"{v}{suffix}"


def _ordered(methods: dict) -> list[str]:
    return sorted(methods, key=lambda m: METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER))


def suite_table(methods: dict, temperature: float = 0.0) -> str:
    head = (
        "| method | tau | acceptance | per depth | tok/s | speedup | drafted steps | draft ms/step | verify ms/step | "
        "overhead ms/step | same output as plain |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for m in _ordered(methods):
        r = methods[m]
        depth = " ".join(f"{a:.2f}" for a in r.get("acceptance_by_depth", [])[:5]) or "–"
        rows.append(
            f"| {LABELS.get(m, m)} | {_fmt(r.get('tau'))} | {_fmt(r.get('acceptance'))} | {depth} | "
            f"{_fmt(r['tokens_per_second'], 1)} | {r.get('verdict') or _fmt(r.get('speedup'), 2, 'x')} | "
            f"{_fmt(r.get('drafted_share'), 2)} | {_fmt(r.get('draft_ms_per_step'))} | "
            f"{_fmt(r.get('verify_ms_per_step'))} | "
            f"{_fmt(r.get('overhead_ms_per_step'))} | {r.get('matched_runs', 0)}/{r['runs']} |"
        )
    text = head + "\n".join(rows) + "\n"
    text += (
        '\n*speedup*: "a tie" when it is within two standard errors of the per-prompt speedups of 1.00x; "no '
        'drafts: plain steps" when the method drafted on no step (its speed then says nothing of drafting). '
        "*drafted steps*: the share of steps that verified a draft.\n"
    )
    if temperature > 0:
        text += (
            "\n*same output as plain*: sampled runs draw different random numbers per method, so their texts are not "
            "expected to match; exactness under sampling is a property of the output distribution, which the tests "
            "check (chi-square).\n"
        )
    else:
        text += (
            "\n*same output as plain*: runs whose tokens equal plain decoding's on the same prompt. Every method is "
            "exact in float32 (the tests prove it); in bfloat16 a forward over several tokens rounds differently from "
            "one over a single token, so near-tied greedy choices can flip and the texts drift apart. transformers' "
            "own assisted and prompt-lookup rows show the same.\n"
        )
    spreads = [
        f"{LABELS.get(m, m)} " + "-".join(f"{v:.2f}" for v in methods[m]["speedup_per_prompt"]) + "x"
        for m in _ordered(methods)
        if methods[m].get("speedup_per_prompt")
    ]
    if spreads:
        text += (
            "\n*speedup per prompt* (each run against the plain runs of its prompt and repeat, lowest-median-highest: "
            "the prompts' differences and the host's drift between runs together): " + ", ".join(spreads) + "\n"
        )
    for spec in DRAFTERS:  # each method against transformers' row that does the same
        versus = methods.get(spec.name, {}).get(f"vs_{spec.reference}")
        if versus is not None:
            text += f"\nGlance {spec.label} vs {LABELS.get(spec.reference, spec.reference)}: {versus:.2f}x\n"
    return text


def category_table(categories: dict) -> str:
    methods = _ordered({m for cat in categories.values() for m in cat})
    methods = [m for m in methods if m != "ar"]
    head = "| category | " + " | ".join(LABELS.get(m, m) for m in methods) + " |\n"
    head += "|---" * (len(methods) + 1) + "|\n"
    rows = []
    for cat, ms in categories.items():
        cells = []
        for m in methods:
            r = ms.get(m, {})
            tau = f" (τ {r['tau']:.2f})" if r.get("tau") is not None else ""
            cells.append(f"{_fmt(r.get('speedup'), 2, 'x')}{tau}")
        rows.append(f"| {cat} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def cost_table(cost: dict) -> str:
    from engine.bench.cost import SHOWN_SIZES

    forward = {int(k): v for k, v in cost["forward_ms"].items()}
    shown = [k for k in SHOWN_SIZES if k in forward] or list(forward)
    text = "Target forward (ms) by new tokens: " + ", ".join(f"{k}: {forward[k]:.2f}" for k in shown) + "\n"
    if "fit_ms" in cost:
        a, b = cost["fit_ms"]["a"], cost["fit_ms"]["b"]
        text += (
            f"\nLeast-squares fit over k = 1..{max(forward)}: {a:.2f} + {b:.3f} k ms; predictions use its shape, "
            "levelled to plain decoding's measured step in the same run.\n"
        )
    text += "\n"
    text += (
        "| method | tokens/step used | predicted speedup | measured | measured / predicted |\n|---|---|---|---|---|\n"
    )
    for m in _ordered(cost["predictions"]):
        p = cost["predictions"][m]
        text += (
            f"| {LABELS.get(m, m)} | {p['expected_tokens_per_step']:.2f} | {p['predicted_speedup']:.2f}x | "
            f"{_fmt(p['measured_speedup'], 2, 'x')} | {_fmt(p['measured_over_predicted'])} |\n"
        )
    return text


SWEEP_LESSON = (
    "Speedup = tokens per row-step x rows in use / (draft + verify time), the times counted in plain decoding steps "
    "at the same batch size. As the batch grows the target stops being memory bound, so verifying k tokens per row "
    "costs more plain steps, and in a static batch the rows that ended early sit idle (rows in use under 1) until "
    "the slowest row ends: a method stops paying where its tokens no longer cover its draft and verify costs."
)


def _cell(sweep: dict, b) -> dict:
    return sweep["rows"][b] if b in sweep["rows"] else sweep["rows"][str(b)]


BATCHING = {
    True: "Rows decode continuously, as a server batches: once half the rows have ended, waiting prompts take them, "
    "so the batch stays nearly full until the queue runs dry.",
    False: "Static batches: each batch decodes until its slowest row ends, and rows that ended sit idle meanwhile "
    "(speculative rows end at different steps, plain rows of one length together; `--continuous`, or batching "
    '"continuous" in the app: finished rows take waiting prompts).',
}


def sweep_table(sweep: dict) -> str:
    methods = sweep["methods"]
    head = BATCHING[bool(sweep.get("continuous"))] + "\n\n"
    head += "| batch | " + " | ".join(f"{LABELS.get(m, m)} tok/s (speedup, τ)" for m in methods) + " |\n"
    head += "|---" * (len(methods) + 1) + "|\n"
    rows = []
    for b in sweep["batch_sizes"]:
        r = _cell(sweep, b)
        cells = [
            f"{_f(r[m]['tokens_per_second'], '.1f')} ({_f(r[m]['speedup'])}x, τ {_f(r[m]['tau'])})" for m in methods
        ]
        rows.append(f"| {b} | " + " | ".join(cells) + " |")
    text = head + "\n".join(rows) + "\n"
    spec = [m for m in methods if m != "ar"]
    if spec and "draft_steps" in _cell(sweep, sweep["batch_sizes"][0])[spec[0]]:
        text += "\n" + SWEEP_LESSON + "\n\n"
        text += (
            "| batch | " + " | ".join(f"{LABELS.get(m, m)}: τ x rows in use / (draft + verify)" for m in spec) + " |\n"
        )
        text += "|---" * (len(spec) + 1) + "|\n"
        for b in sweep["batch_sizes"]:
            r = _cell(sweep, b)
            cells = [
                f"{_f(r[m]['tau'])} x {_f(r[m].get('rows_in_use', 1.0))} / "
                f"({_f(r[m]['draft_steps'])} + {_f(r[m]['verify_steps'])})"
                for m in spec
            ]
            text += f"| {b} | " + " | ".join(cells) + " |\n"
    preds = sweep.get("predictions")
    if preds:
        text += (
            "\nPredicted by replaying the smallest batch's run at each batch size (every row drafting as it did "
            "there), priced by the measured forward cost over (batch, tokens); crossover: the smallest batch size at "
            "or under 1x (– : none in the sweep)."
        )
        if sweep.get("draft_budget", "full") != "full":
            text += (
                " The budget sizes each step's drafts at that batch size's prices, down to plain steps where drafting "
                "does not pay, so a measured cell can sit above what drafting as at the smallest batch would give."
            )
        text += "\n\n"
        text += "| method | " + " | ".join(f"B={b}" for b in sweep["batch_sizes"]) + " | crossover |\n"
        text += "|---" * (len(sweep["batch_sizes"]) + 2) + "|\n"
        for m, p in preds.items():
            per = p["predicted_speedup"]
            cells = []
            for b in sweep["batch_sizes"]:
                pred = per.get(b, per.get(str(b)))
                cells.append(f"{_cell(sweep, b)[m]['speedup']:.2f}x (pred. {_fmt(pred, 2, 'x')})")
            cross = f"{_fmt(p['measured_crossover'], 0)} (pred. {_fmt(p['predicted_crossover'], 0)})"
            text += f"| {LABELS.get(m, m)} | " + " | ".join(cells) + f" | {cross} |\n"
    return text


def environment(target, device: str, dtype: str) -> dict:
    import torch
    import transformers

    from engine.runtime.machine import cpu_features, cpu_name

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else cpu_name(),
        "cpu_features": "" if device.startswith("cuda") else cpu_features(),
        "threads": torch.get_num_threads(),
        "dtype": dtype,
        "platform": platform.platform(),
    }


def markdown(results: dict) -> str:
    env = results["environment"]
    text = (
        f"Glance benchmark · {env['device_name']}{f' [{f}]' if (f := env.get('cpu_features')) else ''} "
        f"({env['device']}, {env['threads']} threads) · {env['dtype']} · "
        f"torch {env['torch']} · transformers {env['transformers']}\n\n"
    )
    s = results["settings"]
    if "suite" in results:
        text += (
            f"{s['prompts']} prompts × {s['repeats']} repeat(s), {s['max_new_tokens']} new tokens, "
            f"temperature {s['temperature']}, draft budget {s.get('draft_budget', 'full')}\n\n"
        )
        text += suite_table(results["suite"]["methods"], s["temperature"]) + "\n"
        text += category_table(results["suite"]["categories"])
    if "cost_model" in results:
        text += "\n" + cost_table(results["cost_model"])
    if "sweep" in results:
        text += "\n" + sweep_table(results["sweep"])
    return text


def charts(results: dict, out: Path) -> list[Path]:
    """speedup.png (suite), batch_sweep.png (speedup against batch size), forward_cost.png; the ones that apply."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "suite" in results:
        methods = results["suite"]["methods"]
        names = [m for m in _ordered(methods) if methods[m].get("speedup") is not None]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.barh([LABELS.get(m, m) for m in names], [methods[m]["speedup"] for m in names], color="#4fc3f7")
        ax.axvline(1.0, color="#888", lw=1)
        ax.set_xlabel("speedup over plain decoding")
        ax.invert_yaxis()
        fig.tight_layout()
        written.append(out / "speedup.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if "sweep" in results:
        sw = results["sweep"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for m in sw["methods"]:
            if m == "ar":
                continue
            ys = [_cell(sw, b)[m]["speedup"] for b in sw["batch_sizes"]]
            line = ax.plot(sw["batch_sizes"], ys, marker="o", label=LABELS.get(m, m))[0]
            pred = sw.get("predictions", {}).get(m, {}).get("predicted_speedup")
            if pred:  # the cost model's forecast, dashed in the same colour
                xs = [b for b in sw["batch_sizes"] if pred.get(b, pred.get(str(b))) is not None]
                ax.plot(xs, [pred.get(b, pred.get(str(b))) for b in xs], ls="--", color=line.get_color(), lw=1)
        ax.axhline(1.0, color="#888", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over batched plain decoding")
        ax.set_title("solid: measured · dashed: predicted", fontsize=8)
        if ax.get_legend_handles_labels()[0]:  # a sweep of plain decoding alone has no method line to name
            ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out / "batch_sweep.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if "cost_model" in results:
        fw = results["cost_model"]["forward_ms"]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([int(k) for k in fw], list(fw.values()), marker="o")
        ax.set_xlabel("tokens in one target forward")
        ax.set_ylabel("ms")
        fig.tight_layout()
        written.append(out / "forward_cost.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def write(results: dict, out: Path) -> list[Path]:
    """results.json, results.md and the charts into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown(results))
    return [out / "results.json", out / "results.md", *charts(results, out)]


def _f(value, spec: str = ".2f") -> str:
    """A number for a table; "–" where a run had nothing to measure (one new token: no step after the prefill)."""
    return "–" if value is None else format(value, spec)
