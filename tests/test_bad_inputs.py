"""Issue 18's hostile inputs: each ends in one GlanceError (exit 2 in the CLI) that says what is wrong, never a
traceback. Every case here ended in a traceback before."""

import json

import pytest

from engine.cli import main
from engine.decoding.sampling import SamplingConfig
from engine.drafters.medusa import parse_tree
from engine.errors import GlanceError
from engine.heads.eagle import load_eagle_head
from engine.heads.medusa import load_medusa_heads
from engine.train.data.prompts import load_prompt_suite
from tests.conftest import tiny_model
from tests.test_eagle import random_head
from tests.test_medusa import random_heads


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama")


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"intermediate_size": 100}, "does not fit the EAGLE layer its config.json describes"),
        ({"intermediate_size": None}, "lacks 'intermediate_size'"),
        ({"num_attention_heads": 7}, "does not fit"),
        ({"num_attention_heads": "four"}, "does not fit"),
    ],
)
def test_an_eagle_head_whose_config_lies_fails_in_one_line(tmp_path, target, changes, match):
    random_head(target).save(tmp_path)
    edit_config(tmp_path, **changes)
    with pytest.raises(GlanceError, match=match):
        load_eagle_head(tmp_path, target)


def test_broken_medusa_heads_fail_in_one_line(tmp_path, target):
    random_heads(target, k=2).save(tmp_path)
    edit_config(tmp_path, medusa_num_heads="four")
    with pytest.raises(GlanceError, match="must be whole numbers"):
        load_medusa_heads(tmp_path, target)
    edit_config(tmp_path, medusa_num_heads=3)  # the file holds two heads
    with pytest.raises(GlanceError, match="does not fit"):
        load_medusa_heads(tmp_path, target)
    edit_config(tmp_path, medusa_num_heads=2)
    weights = tmp_path / "medusa_lm_head.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a truncated download
    with pytest.raises(GlanceError, match="could not be read .*truncated"):
        load_medusa_heads(tmp_path, target)


def test_a_medusa_block_of_the_wrong_shape_fails_in_one_line(tmp_path, target):
    from safetensors.torch import load_file, save_file

    random_heads(target, k=2).save(tmp_path)
    weights = tmp_path / "medusa_lm_head.safetensors"
    state = load_file(str(weights))
    state["1.0.linear.weight"] = state["1.0.linear.weight"][:, :-1].contiguous()
    save_file(state, str(weights))
    with pytest.raises(GlanceError, match="does not fit the Medusa heads"):
        load_medusa_heads(tmp_path, target)


@pytest.mark.parametrize("tree", ['[["a"]]', "[0,1]", "null", "[[0.5]]", "[[true]]", "{}"])
def test_a_medusa_tree_that_is_not_a_list_of_paths_fails_in_one_line(tree):
    with pytest.raises(GlanceError, match="non-empty list of non-empty paths"):
        parse_tree(tree)


def test_a_seed_torch_cannot_take_fails_in_one_line():
    with pytest.raises(GlanceError, match="seed must be an integer from 0"):
        SamplingConfig(seed=100000000000000000000000)
    with pytest.raises(GlanceError, match="seed"):
        SamplingConfig(seed=-1)


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"prompt": "x"\n', ":1: not JSON"),
        ('{"text": "x"}\n', ':1: each line needs a non-empty string "prompt"'),
        ('{"prompt": "ok"}\n[1, 2]\n', ":2: each line needs"),
        ('{"prompt": 3}\n', "needs a non-empty string"),
        ("\n\n", "holds no prompts"),
    ],
)
def test_a_bad_prompt_file_names_its_line(tmp_path, text, match):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(GlanceError, match=match):
        load_prompt_suite(path)
    path.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(GlanceError, match="not UTF-8"):
        load_prompt_suite(path)


def test_prompt_records_get_an_id_and_a_category(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f():"}\n')
    assert load_prompt_suite(path) == [{"prompt": "def f():", "id": "line-1", "category": "custom"}]


def _one_line(capsys, argv, match):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("glance: error:"), err
    assert match in err, err


def test_the_cli_refuses_each_in_one_line(model_folders, capsys, tmp_path):
    t = ["--target", str(model_folders["target"])]
    gen = ["generate", *t, "--prompt", "x"]
    _one_line(capsys, [*gen, "--seed", "100000000000000000000000"], "seed must be an integer")
    bundled = ["generate", "--prompt", "x"]  # the bundled target, which brings Medusa and EAGLE heads
    _one_line(capsys, [*bundled, "--method", "medusa", "--medusa-tree", '[["a"]]'], "list of non-empty paths")
    _one_line(capsys, [*bundled, "--method", "eagle", "--eagle-top-k", "100000"], "--eagle-top-k")
    _one_line(capsys, [*gen, "--method", "lookahead", "--lookahead-window", "100000"], "--lookahead-window")
    _one_line(capsys, ["generate", *t, "--prompt", "caf\udcff"], "not UTF-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    _one_line(capsys, ["bench", *t, "--methods", "ar", "--prompts", str(bad)], 'needs a non-empty string "prompt"')


def test_custom_code_names_the_flag(model_folders, tmp_path, capsys):
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(model_folders["target"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    code = {"AutoConfig": "modeling_custom.CustomConfig", "AutoModelForCausalLM": "modeling_custom.CustomLM"}
    cfg |= {"model_type": "glance-custom", "auto_map": code}
    (folder / "config.json").write_text(json.dumps(cfg))
    _one_line(capsys, ["generate", "--target", str(folder), "--prompt", "x"], "--trust-remote-code")
    cfg.pop("auto_map")  # an architecture this transformers does not know, no code of its own: say what may help
    (folder / "config.json").write_text(json.dumps(cfg))
    _one_line(capsys, ["generate", "--target", str(folder), "--prompt", "x"], "newer transformers")


def test_no_network_fails_fast_in_one_line(capsys, monkeypatch):
    import time

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    t0 = time.perf_counter()
    _one_line(capsys, ["generate", "--target", "some-org/some-model", "--allow-download", "--prompt", "x"],
              "cannot reach 127.0.0.1")  # fmt: skip
    assert time.perf_counter() - t0 < 10


def test_mismatched_weights_say_so_without_an_above_report(model_folders, tmp_path, capsys):
    import shutil

    folder = tmp_path / "mixed"
    shutil.copytree(model_folders["target"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2  # the weights keep the old shapes
    (folder / "config.json").write_text(json.dumps(cfg))
    code = main(["generate", "--target", str(folder), "--prompt", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "above" not in err, err
    assert "do not have the shapes its config.json describes" in err, err


@pytest.mark.slow
def test_a_killed_json_run_prints_what_it_produced(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    log = tmp_path / "run.jsonl"
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "main.py", "generate", "--prompt", "def f(x):", "--max-new-tokens", "1500", "--json",
         "--log", str(log)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 4):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["stop_reason"] == "interrupted" and result["new_tokens"] >= 2 and result["token_ids"]
    assert "interrupted after" in err and "Traceback" not in err
