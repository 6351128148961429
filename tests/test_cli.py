"""CLI: the JSON fields of `generate`, and one clear line with exit code 2 for each kind of bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {
    "method",
    "token_ids",
    "text",
    "new_tokens",
    "target_forwards",
    "mean_accepted_length",
    "tokens_per_second",
    "wall_seconds",
}


def run_json(capsys, *argv):
    assert main(["generate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_fields(model_folders, capsys, tmp_path):
    log = tmp_path / "run.jsonl"
    out = run_json(
        capsys,
        "--method",
        "vanilla",
        "--target",
        str(model_folders["target"]),
        "--draft",
        str(model_folders["copy"]),
        "--prompt",
        "def add(a, b):",
        "--max-new-tokens",
        "12",
        "--dtype",
        "float32",
        "--log",
        str(log),
    )
    assert FIELDS <= out.keys()
    assert out["method"] == "vanilla" and out["new_tokens"] == len(out["token_ids"]) <= 12
    assert out["mean_accepted_length"] > 1  # the draft is a copy of the target
    assert out["target_forwards"] < out["new_tokens"]
    lines = log.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "header" and json.loads(lines[-1])["type"] == "summary"

    ar = run_json(
        capsys,
        "--method",
        "ar",
        "--target",
        str(model_folders["target"]),
        "--prompt",
        "def add(a, b):",
        "--max-new-tokens",
        "12",
        "--dtype",
        "float32",
    )
    assert ar["token_ids"] == out["token_ids"]  # lossless
    assert ar["mean_accepted_length"] == 1.0


def _bad(capsys, argv, match):
    code = main(["generate", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("glance: error:"), err
    assert match in err, err


def test_bad_inputs(model_folders, capsys, tmp_path):
    t = ["--target", str(model_folders["target"])]
    _bad(capsys, ["--target", str(tmp_path / "missing"), "--prompt", "x"], "model folder not found")
    (tmp_path / "empty").mkdir()
    _bad(capsys, ["--target", str(tmp_path / "empty"), "--prompt", "x"], "no config.json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    _bad(capsys, ["--target", str(broken), "--prompt", "x"], "not valid JSON")
    _bad(capsys, ["--target", "some-org/some-model", "--prompt", "x"], "--allow-download")
    _bad(
        capsys,
        [*t, "--method", "vanilla", "--draft", str(model_folders["other_vocab"]), "--prompt", "x"],
        "does not share the target's vocabulary",
    )
    _bad(capsys, [*t, "--prompt", "   "], "prompt is empty")
    _bad(capsys, [*t, "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens")
    _bad(capsys, [*t, "--prompt", "x", "--temperature", "-1"], "--temperature")
    _bad(capsys, [*t, "--prompt", "x", "--top-p", "0"], "--top-p")
    _bad(capsys, [*t, "--prompt", "x", "--device", "\r\n"], "unknown device '\\r\\n'")  # one line, escaped


def test_bad_input_never_writes_a_log(model_folders, capsys, tmp_path):
    log = tmp_path / "run.jsonl"
    _bad(capsys, ["--target", str(tmp_path / "missing"), "--prompt", "x", "--log", str(log)], "not found")
    assert not log.exists()


@pytest.mark.slow
def test_exit_code_in_a_real_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "main.py", "generate", "--prompt", "", "--target", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_lookahead_knobs(model_folders, capsys):
    common = ["--target", str(model_folders["target"]), "--prompt", "def add(a, b):", "--max-new-tokens", "12"]
    common += ["--dtype", "float32"]
    ar = run_json(capsys, "--method", "ar", *common)
    knobs = ["--lookahead-window", "3", "--lookahead-ngram", "3", "--lookahead-guesses", "2"]
    knobs += ["--draft-budget", "full"]  # auto fits the window to this machine's measured forward costs (<= the knob)
    out = run_json(capsys, "--method", "lookahead", *knobs, *common)
    assert out["token_ids"] == ar["token_ids"]
    assert {"window": 3, "ngram": 3, "guesses": 2, "context_ngrams": True}.items() <= out["settings"].items()
    with pytest.raises(SystemExit) as bad:  # argparse refuses a choice it does not offer, in one line
        main(["generate", "--method", "medusa", "--acceptance", "paper", *common])
    err = capsys.readouterr().err.strip()
    assert bad.value.code == 2 and len(err.splitlines()) == 1 and "--acceptance" in err, err
    _bad(capsys, ["--method", "lookahead", "--lookahead-ngram", "1", *common], "--lookahead-ngram must be between 2")


@pytest.mark.parametrize(
    "argv",
    [["generate", "--max-new-tokens", "x"], ["bench", "--nope"], ["train", "eagle3"], ["frobnicate"]],
)
def test_argument_errors_are_one_line_with_the_help_hint(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "--help" in err and "usage" not in err, err
