"""The benchmark: the suite end to end on tiny models, the sweep, and the cost model's formula."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine.bench.cost import chain_expected_length, cost_model, fit_line, predict_speedup, predictions
from engine.bench.report import markdown, suite_table, write
from engine.bench.run import run_benchmark
from engine.bench.suite import BenchSetup, aggregate, run_suite
from engine.cli import main
from engine.heads.eagle import EagleHead
from engine.heads.medusa import MedusaHeads
from engine.models.loading import load_model

PROMPTS = [
    {"id": "a", "category": "defs", "prompt": "def add(a, b):"},
    {"id": "b", "category": "classes", "prompt": "class Point:\n    x: int"},
]
ALL = ["ar", "vanilla", "medusa", "eagle", "lookahead", "hf_generate", "hf_assisted", "hf_prompt_lookup"]


@pytest.fixture(scope="module")
def setup(model_folders):
    target = load_model(str(model_folders["target"]), device="cpu", dtype="float32")
    torch.manual_seed(0)
    parts = {
        "draft": load_model(str(model_folders["copy"]), device="cpu", dtype="float32"),
        "medusa": MedusaHeads.for_target(target.model, 4, 1, shared_lm_head=True).eval(),
        "eagle": EagleHead.for_target(target.model).eval(),
    }
    return BenchSetup(target, parts, max_new_tokens=12)


def test_plain_decoding_runs_on_both_sides_of_the_others_whose_order_turns_round(setup):
    """Drift hits every method alike: per prompt and repeat, plain decoding first and last, the others between in
    an order that reverses every other time; a speedup is against both plain runs."""
    seen = []
    suite = run_suite(
        setup, PROMPTS[:2], ["vanilla", "ar", "lookahead"], repeats=2, progress=lambda d, t, what: seen.append(what)
    )
    runs = [what.split()[-1] for what in seen if not what.startswith("warm-up")]
    forward, backward = ["ar", "vanilla", "lookahead", "ar"], ["ar", "lookahead", "vanilla", "ar"]
    assert runs == forward + backward + backward + forward
    records = suite["records"]
    plain = [r for r in records if r["method"] == "ar"]
    assert len(plain) == 8 and all(r["matched"] for r in records)
    rate = sum(r["new_tokens"] for r in plain) / sum(r["wall_seconds"] for r in plain)
    assert suite["methods"]["ar"]["tokens_per_second"] == pytest.approx(rate, rel=1e-3)


def test_each_runs_speedup_is_against_the_plain_runs_of_its_prompt_and_the_table_shows_their_spread():
    """Pooled, a slow stretch of the host moves every method's speedup; per prompt and repeat each run is set against
    the plain runs beside it, and the table prints lowest, median and highest."""

    def rec(method, prompt, repeat, tokens, seconds):
        return {"method": method, "prompt_id": prompt, "repeat": repeat, "category": "", "new_tokens": tokens,
                "wall_seconds": seconds, "model_seconds": seconds, "matched": True, "steps": 0}  # fmt: skip

    records = [
        rec("ar", "a", 0, 10, 1.0), rec("m", "a", 0, 10, 0.5), rec("ar", "a", 0, 10, 3.0),  # plain 5 tok/s: 4x
        rec("ar", "b", 0, 10, 0.5), rec("m", "b", 0, 10, 1.0), rec("ar", "b", 0, 10, 0.5),  # plain 20: 0.5x
        rec("ar", "b", 1, 10, 1.0), rec("m", "b", 1, 10, 1.0), rec("ar", "b", 1, 10, 1.0),  # 1x
    ]  # fmt: skip
    methods = aggregate(records)
    assert methods["m"]["speedup_per_prompt"] == [0.5, 1.0, 4.0]
    assert "speedup_per_prompt" not in methods["ar"]
    assert "m 0.50-1.00-4.00x" in suite_table(methods)


def test_a_row_that_never_drafted_or_is_within_its_spread_is_not_shown_as_a_win():
    def rec(method, prompt, seconds, drafted):
        return {"method": method, "prompt_id": prompt, "repeat": 0, "category": "", "new_tokens": 20, "steps": 19,
                "emitted": 19, "drafted_steps": drafted, "accepted": 0, "proposed_depth": 0, "wall_seconds": seconds,
                "model_seconds": seconds, "matched": True}  # fmt: skip

    records = []
    for p in range(6):
        jitter = 1 + 0.2 * (-1) ** p
        records += [rec("ar", p, 1.0, 0), rec("lucky", p, 0.7 * jitter, 0), rec("close", p, 0.98 * jitter, 19)]
        records += [rec("fast", p, 0.5, 19)]
    methods = aggregate(records)
    assert methods["lucky"]["verdict"] == "no drafts: plain steps" and methods["lucky"]["speedup"] > 1.3
    assert methods["close"]["verdict"].endswith("a tie") and methods["fast"]["verdict"] == "2.00x"
    table = suite_table(methods)
    assert "| no drafts: plain steps | 0.00 |" in table and "a tie" in table


def test_suite_runs_end_to_end_and_writes_valid_results(setup, tmp_path):
    results = run_benchmark(setup, PROMPTS, ALL)
    paths = write(results, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    methods = saved["suite"]["methods"]
    assert set(methods) == set(ALL)
    assert all(m["lossless"] for m in methods.values())  # every output equals plain decoding's
    assert methods["ar"]["speedup"] == 1.0 and methods["ar"]["tau"] == 1.0
    # the draft is a copy of the target: drafting in full, every draft is accepted (the auto budget may go plain,
    # a copy costs what the target does)
    full = run_suite(dataclasses.replace(setup, draft_budget="full"), PROMPTS, ["ar", "vanilla"])
    assert full["methods"]["vanilla"]["tau"] > 1.5
    assert methods["vanilla"]["vs_hf_assisted"] > 0
    assert set(saved["suite"]["categories"]) == {"defs", "classes"}
    assert len(saved["suite"]["records"]) == len(PROMPTS) * (len(ALL) + 1)  # plain decoding twice a prompt
    assert {"torch", "transformers", "device", "dtype"} <= saved["environment"].keys()
    assert saved["models"]["target"] and saved["settings"]["max_new_tokens"] == 12
    assert saved["settings"]["draft_budget"] == "auto"  # the suite's default
    assert set(saved["cost_model"]["predictions"]) == {"vanilla", "medusa", "eagle", "lookahead"}
    assert "| vanilla speculative |" in markdown(saved)
    features = saved["environment"]["cpu_features"]  # which bfloat16 instructions ran: AMX hosts differ by half
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert ("amx_bf16" in features) == (" amx_bf16" in flags)
    assert not features or f"[{features}]" in markdown(saved).splitlines()[0]
    assert {p.name for p in paths} >= {"results.json", "results.md", "speedup.png", "forward_cost.png"}
    assert all(p.stat().st_size > 0 for p in paths)


def test_the_clock_times_model_calls_and_heads_read_outs_only(setup):
    """Overhead is what runs outside model calls: the target, the draft, the heads and their top-k read-out are
    timed; the loop around them is not."""
    import time

    from engine.bench.clock import ModelClock
    from engine.heads.readout import candidates

    eagle = setup.parts["eagle"]
    assert candidates(eagle) in setup.timed_modules() and candidates(eagle) is candidates(eagle)
    with ModelClock(setup.timed_modules()) as clock:
        with torch.no_grad():
            candidates(eagle)(torch.zeros(2, eagle.cfg["hidden_size"]), 3)
        inside = clock.seconds
        time.sleep(0.05)  # host work: not model time
    assert 0 < inside == clock.seconds < 0.05


def test_sweep_reports_every_batch_size(setup, tmp_path):
    seen = []
    results = run_benchmark(setup, PROMPTS, ["ar", "vanilla", "lookahead"], batch_sizes=[1, 3],
                            progress=lambda done, total, what: seen.append(what))  # fmt: skip
    sweep = results["sweep"]
    # each batch size's forward costs are timed right after its cells, not after the whole sweep (the host drifts)
    grid_1, grid_3 = (seen.index(f"cost grid: timing batched target forwards at batch {b}") for b in (1, 3))
    assert seen.index("batch 1 lookahead") < grid_1 < seen.index("batch 3 ar") < grid_3
    assert sweep["batch_sizes"] == [1, 3] and sweep["methods"] == ["ar", "vanilla", "lookahead"]
    assert results["settings"]["draft_budget"] == "full"  # the sweep's default: the physics, undamped
    for b in (1, 3):
        assert all(r["matched_rows"] == r["rows"] == 3 for r in sweep["rows"][b].values())  # float32: exact
        assert sweep["rows"][b]["ar"]["speedup"] == 1.0
        for m, r in sweep["rows"][b].items():
            # the parts explain the cell: speedup ~ tau x rows in use / (draft + verify), in plain steps at this B
            assert r["width"] >= 1 and r["draft_steps"] >= 0 and r["verify_steps"] > 0 and 0 < r["active_rows"] <= b
            parts = r["tau"] * r["rows_in_use"] / (r["draft_steps"] + r["verify_steps"])
            assert parts == pytest.approx(r["speedup"], rel=0.35), (b, m, r)
            replays_its_own_run(r, b, continuous=False)
    assert sweep["rows"][1]["lookahead"]["width"] > 1  # the window rides in the verification forward
    assert set(sweep["forward_ms"]) == {1, 3} and set(sweep["forward_ms"][3]) >= {1, 8}
    for m in ("vanilla", "lookahead"):
        pred = sweep["predictions"][m]
        assert set(pred["predicted_speedup"]) == {1, 3} and all(v > 0 for v in pred["predicted_speedup"].values())
    text = markdown(results)
    assert "Speedup = tokens per row-step x rows in use / (draft + verify time)" in text and "crossover" in text
    assert results["settings"]["batching"] == "static" and "Static batches" in text
    assert "Predicted by replaying" in text and "The budget sizes each step's drafts" not in text  # full budget
    assert "The budget sizes each step's drafts" in markdown(dict(results, sweep=dict(sweep, draft_budget="auto")))
    assert {p.name for p in write(results, tmp_path)} >= {"batch_sweep.png", "results.json"}
    continuous = run_benchmark(setup, PROMPTS * 2, ["ar", "lookahead"], batch_sizes=[2], continuous=True)
    assert continuous["settings"]["batching"] == "continuous" and "Rows decode continuously" in markdown(continuous)
    cells = continuous["sweep"]["rows"][2].values()
    assert all(r["matched_rows"] == r["rows"] == 2 * len(PROMPTS) for r in cells)  # float32: exact
    for r in cells:
        replays_its_own_run(r, 2, continuous=True)


def replays_its_own_run(cell: dict, b: int, continuous: bool) -> None:
    """The prediction's replay of a cell's own rows gives the batches the decoder ran: its forwards, prefills,
    row-steps and mean width."""
    from engine.bench.sweep import replay

    steps, prefills = replay(cell["row_widths"], b, continuous)
    assert (len(steps), prefills) == (cell["verify_forwards"], cell["prefills"])
    assert sum(a for a, _ in steps) == sum(len(w) for w in cell["row_widths"])
    assert sum(w for _, w in steps) / len(steps) == pytest.approx(cell["width"], abs=0.006)


def test_replay_batches_prompts_as_the_decoder_does():
    """Static: each batch of b prompts runs until its slowest row ends, narrower rows padded to the widest. Continuous
    (half of the prompts per call): a finished row's slot takes a waiting prompt once half the rows are free."""
    from engine.bench.sweep import replay

    widths = [[2, 3], [1], [4, 4, 4]]
    assert replay(widths, 1) == ([(1, 2), (1, 3), (1, 1), (1, 4), (1, 4), (1, 4)], 3)
    assert replay(widths, 2) == ([(2, 2), (1, 3), (1, 4), (1, 4), (1, 4)], 2)
    # continuous, 2 rows, 6 prompts: two calls of 3; in each the third prompt joins the row the 1-step one left
    steps, prefills = replay(widths * 2, 2, continuous=True)
    assert prefills == 4 and steps == [(2, 2), (2, 4), (1, 4), (1, 4)] * 2
    assert replay([[], [1, 1]], 2) == ([(1, 1), (1, 1)], 1)  # a prompt that ended at its first token never steps


def test_sweep_prediction_replays_the_smallest_batch():
    """B0's rows, batched: a static batch of two rows runs as long as its slowest row, each step as wide as its
    widest row. A step costs the grid's forward plus plain decoding's measured step beyond the grid's one-token
    forward at its rows, times B0's measured / modelled verify; drafting grows with the rows drafting."""
    from engine.bench.sweep import predict

    plain = {"row_widths": [[1] * 4, [1] * 4], "tokens": 10, "draft_ms_per_step": 0.0, "verify_ms_per_step": 10.0,
             "verify_forwards": 8, "prefills": 2, "prefill_ms": 0.0}  # fmt: skip
    cell = {"row_widths": [[4, 4], [4]], "tokens": 10, "draft_ms_per_step": 2.0, "verify_ms_per_step": 15.0,
            "verify_forwards": 3, "batched_drafting": False}  # fmt: skip
    sweep = {
        "batch_sizes": [1, 2],
        "methods": ["ar", "m"],
        "rows": {
            1: {"ar": plain, "m": dict(cell, speedup=1.5)},
            2: {"ar": dict(plain, verify_ms_per_step=14.0), "m": {"speedup": 1.1}},  # 2 ms over the grid's 12
        },
    }
    grid = {1: {1: 0.010, 8: 0.010}, 2: {1: 0.012, 8: 0.020}}
    pred = predict(sweep, grid)["m"]
    # B=1: 3 steps of 2 ms + 1.5 x 10 ms against 8 plain steps of 10 ms (the grid, as measured)
    assert pred["predicted_speedup"][1] == pytest.approx(0.08 / (3 * 0.017), rel=1e-3)
    # B=2: steps (2 rows, 4 wide) and (1 row, 4 wide) against 4 plain steps of 2 rows at their measured 14 ms
    wide = 0.012 + 3 / 7 * 0.008 + 0.002  # grid at B=2, 4 tokens a row, and B=2's 2 ms beyond the grid
    mine = 2 * 0.002 + 1.5 * wide + 0.002 + 1.5 * 0.010
    assert pred["predicted_speedup"][2] == pytest.approx(4 * 0.014 / mine, rel=1e-3)
    assert pred["predicted_crossover"] is None and pred["measured_crossover"] is None
    # batched drafting grows as plain decoding's step (14 / 10); B=2's prefill (plain's, measured) is paid by both
    sweep["rows"][1]["m"]["batched_drafting"] = True
    sweep["rows"][2]["ar"].update(prefill_ms=10.0, prefills=1)
    mine = 0.010 + 0.002 * 1.4 + 1.5 * wide + 0.002 + 1.5 * 0.010
    assert predict(sweep, grid)["m"]["predicted_speedup"][2] == pytest.approx((0.010 + 4 * 0.014) / mine, rel=1e-3)
    # where 4 tokens a row cost twice a plain step at B=2, the method crosses 1x there
    grid[2][8] = 0.040
    pred = predict(sweep, grid)["m"]
    assert pred["predicted_speedup"][2] < 1.0 and pred["predicted_crossover"] == 2
    assert predict(dict(sweep, rows={b: {"ar": {}} for b in (1, 2)}), grid) == {}  # a results file from before


def test_chain_prediction_matches_the_formula():
    a_, gamma = 0.6, 4
    expected = (1 - a_**5) / (1 - a_)
    assert chain_expected_length(a_, gamma) == pytest.approx(expected)
    assert chain_expected_length(1.0, gamma) == 5.0 and chain_expected_length(0.0, gamma) == 1.0
    costs = {1: 0.010, 8: 0.0121, 64: 0.0289}  # a straight line: 9.7 ms + 0.3 ms per token
    assert fit_line(costs) == pytest.approx((0.0097, 0.0003))
    cost = cost_model(costs)
    # a step: 3 ms drafting + a 5-token forward; plain decoding: one 1-token forward per token
    assert predict_speedup(expected, 5, 0.003, cost) == pytest.approx(expected * cost(1) / (0.003 + cost(5)))
    levelled = cost_model(costs, plain_step=0.020)  # the same shape, levelled to a plain step measured at 20 ms
    assert levelled(1) == pytest.approx(0.020) and levelled(5) / levelled(1) == pytest.approx(cost(5) / cost(1))
    row = {"steps": 10, "tau": 9.9, "token_acceptance": a_, "chain_length": gamma, "speedup": 1.5}
    row |= {"verify_tokens_per_step": 5, "draft_ms_per_step": 3.0}
    pred = predictions({"vanilla": row}, costs)["vanilla"]
    assert pred["expected_tokens_per_step"] == pytest.approx(expected, abs=1e-3)  # the formula, not the measured tau


def test_bench_cli_rejects_bad_input(capsys):
    for argv, match in (
        (["--methods", "ar,warp"], "unknown method"),
        (["--batch-sizes", "1,x"], "comma-separated integers"),
        (["--prompts", "/nonexistent.jsonl"], "prompt file not found"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--repeats", "0"], "--repeats must be at least 1"),
    ):
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1


def test_bench_cli_unwritable_out_keeps_the_table(model_folders, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["bench", "--target", str(model_folders["target"]), "--methods", "ar", "--limit", "1"]
    argv += ["--max-new-tokens", "4", "--dtype", "float32", "--compile", "off", "--out", str(blocker / "out")]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    assert main([*argv, "--prompts", str(prompts)]) == 2
    out, err = capsys.readouterr()
    assert "| plain decoding (Glance) |" in out  # the numbers were printed before the write failed
    assert err.strip().splitlines()[-1].startswith("glance: error: cannot write the results")  # after the bar


def test_the_cost_model_stops_when_cancelled_and_reports_progress():
    from engine.bench.cost import forward_costs
    from tests.conftest import tiny_model

    seen = []
    assert forward_costs(tiny_model("llama"), sizes=(1, 2), context=8, repeats=3, cancel=lambda: True) == {}
    costs = forward_costs(tiny_model("llama"), sizes=(1, 2), context=8, repeats=3, progress=lambda *a: seen.append(a))
    assert set(costs) == {1, 2} and [d for d, _, _ in seen] == [0, 1, 2] and "cost model" in seen[0][2]


def test_forward_costs_time_each_shape_in_a_run_of_it(monkeypatch):
    """The first forwards of a shape right after another graph ran slower than decoding, which repeats one shape,
    ever sees (on an AMX Xeon the one-token forward took four runs to settle; timed on its second run it inflated the
    cost model's one-token cost and every prediction with it): each size runs RUNS times, the last few are timed."""
    from engine.bench import cost
    from engine.runtime.forward import ModelForward
    from engine.runtime.forward_timing import RUNS
    from tests.conftest import tiny_model

    model = tiny_model("llama", seed=0)
    widths = []

    class Counting(ModelForward):
        def __call__(self, ids, cache, *args, **kwargs):
            widths.append(ids.shape[1])
            return super().__call__(ids, cache, *args, **kwargs)

    monkeypatch.setattr(cost, "forward_for", Counting)
    costs = cost.forward_costs(model, sizes=(1, 3), context=8, repeats=2)
    assert set(costs) == {1, 3} and all(v > 0 for v in costs.values())
    assert RUNS >= 4 and widths == [8] + ([1] * RUNS + [3] * RUNS) * 2  # the prefill, then each size RUNS times
    widths.clear()
    grid = cost.forward_grid(model, [1, 2], sizes=(1, 2), context=8, repeats=1)
    assert set(grid) == {1, 2} and widths == [8, 8] + ([1] * RUNS + [2] * RUNS) * 2


def test_a_shapes_cost_is_the_least_of_its_last_runs(monkeypatch):
    """One run's time on this host varies by a tenth either way, and the budgets read ratios between widths: timed on
    one run, the bundled target's two-token forward came out at 0.86-1.25 one-token forwards in six measurements in
    a row. A shape costs the least of its last STEADY_RUNS runs (the first ones settle after another graph ran)."""
    from types import SimpleNamespace

    import torch

    from engine.runtime import forward_timing
    from engine.runtime.forward_timing import RUNS, STEADY_RUNS, steady_seconds

    durations = [9.0] * (RUNS - STEADY_RUNS) + [5.0, 3.0, 4.0][-STEADY_RUNS:]
    clock = iter([t for d in durations for t in (0.0, d)])
    monkeypatch.setattr(forward_timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # this module's
    calls = []
    monkeypatch.setattr(forward_timing, "crop", lambda cache, n: None)
    seconds = steady_seconds(lambda *a: calls.append(a), torch.zeros(1, 1), None, 8, torch.device("cpu"))
    assert len(calls) == RUNS and seconds == min(durations[-STEADY_RUNS:]) == 3.0


def test_dflash_races_beside_transformers_own_dflash_with_the_same_weights(setup):
    """The hf_dflash row runs transformers' DFlash assisted generation over the lane's own draft weights: both
    equal plain decoding, and the DFlash row is set against it."""
    from engine.heads.dflash import DFlashHead

    torch.manual_seed(0)
    head = DFlashHead.for_target(setup.target.model, layers=1, block_size=4).eval()
    with_dflash = dataclasses.replace(setup, parts={**setup.parts, "dflash": head})
    assert not with_dflash.available("hf_mtp")  # the target ships no MTP layers: transformers has no MTP row here
    methods = run_suite(with_dflash, PROMPTS, ["ar", "dflash", "hf_dflash"])["methods"]
    assert methods["dflash"]["lossless"] and methods["hf_dflash"]["lossless"]
    assert methods["dflash"]["vs_hf_dflash"] > 0
