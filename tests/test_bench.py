"""The benchmark: the suite end to end on tiny models, the sweep, and the cost model's formula."""

import json

import pytest
import torch

from engine.bench.cost import chain_expected_length, cost_model, fit_line, predict_speedup, predictions
from engine.bench.report import markdown, write
from engine.bench.run import run_benchmark
from engine.bench.suite import BenchSetup
from engine.cli import main
from engine.heads.eagle import EagleHead
from engine.heads.medusa import MedusaHeads
from engine.models import load_model

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


def test_suite_runs_end_to_end_and_writes_valid_results(setup, tmp_path):
    results = run_benchmark(setup, PROMPTS, ALL)
    paths = write(results, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    methods = saved["suite"]["methods"]
    assert set(methods) == set(ALL)
    assert all(m["lossless"] for m in methods.values())  # every output equals plain decoding's
    assert methods["ar"]["speedup"] == 1.0 and methods["ar"]["tau"] == 1.0
    assert methods["vanilla"]["tau"] > 1.5  # the draft is a copy of the target
    assert methods["vanilla"]["vs_hf_assisted"] > 0
    assert set(saved["suite"]["categories"]) == {"defs", "classes"}
    assert len(saved["suite"]["records"]) == len(PROMPTS) * len(ALL)
    assert {"torch", "transformers", "device", "dtype"} <= saved["environment"].keys()
    assert saved["models"]["target"] and saved["settings"]["max_new_tokens"] == 12
    assert set(saved["cost_model"]["predictions"]) == {"vanilla", "medusa", "eagle", "lookahead"}
    assert "| vanilla speculative |" in markdown(saved)
    assert {p.name for p in paths} >= {"results.json", "results.md", "speedup.png", "forward_cost.png"}
    assert all(p.stat().st_size > 0 for p in paths)


def test_sweep_reports_every_batch_size(setup, tmp_path):
    results = run_benchmark(setup, PROMPTS, ["ar", "vanilla", "lookahead"], batch_sizes=[1, 3])
    sweep = results["sweep"]
    assert sweep["batch_sizes"] == [1, 3] and sweep["methods"] == ["ar", "vanilla", "lookahead"]
    for b in (1, 3):
        assert all(r["matched_rows"] == r["rows"] == 3 for r in sweep["rows"][b].values())  # float32: exact
        assert sweep["rows"][b]["ar"]["speedup"] == 1.0
    assert {p.name for p in write(results, tmp_path)} >= {"batch_sweep.png", "results.json"}


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
    argv += ["--max-new-tokens", "4", "--dtype", "float32", "--out", str(blocker / "out")]
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
