"""Issue 75's hostile and damaged files, as a user would hand them over: head folders, chat templates, GGUF headers,
model folders with missing weights, prompt files, small position tables and unwritable outputs. Each ends in a
result or one GlanceError naming what is wrong, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.errors import GlanceError
from engine.heads.eagle import load_eagle_head
from engine.heads.eagle3 import Eagle3Head, load_eagle3_head
from engine.heads.medusa import load_medusa_heads
from engine.models.chat import encode_prompt
from engine.models.gguf_check import check_gguf_header
from tests.test_eagle import random_head
from tests.test_eagle3 import deep_target
from tests.test_medusa import random_heads

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def target():
    return deep_target("llama")


@pytest.fixture(scope="module")
def plain(target):
    return list(Decoder(target, None, max_new_tokens=8).run(PROMPT))[-1].token_ids


def _config(**changes):
    def edit(folder):
        path = folder / "config.json"
        cfg = json.loads(path.read_text())
        for key, value in changes.items():
            cfg[key] = value
        path.write_text(json.dumps(cfg))

    return edit


def _raw(data: bytes):
    def edit(folder):
        (folder / "config.json").write_bytes(data)

    return edit


def _aux(ids):
    return _config(eagle_config={"eagle_aux_hidden_state_layer_ids": ids})


def _nan(folder):
    for f in folder.glob("*.safetensors"):
        state = load_file(str(f))
        save_file({k: v * float("nan") if v.is_floating_point() else v for k, v in state.items()}, str(f))


def _two_id_vocab(folder):
    save_file({"draft_ids": torch.tensor([3, 7])}, str(folder / "draft_vocab.safetensors"))


def _flat_medusa_block(folder):
    path = folder / "medusa_lm_head.safetensors"
    state = load_file(str(path))
    state["0.0.linear.weight"] = state["0.0.linear.weight"][0].contiguous()
    save_file(state, str(path))


COMMON = {
    "config a list": _raw(b"[1, 2]"),
    "config a number": _raw(b"7"),
    "config null": _raw(b"null"),
    "config not UTF-8": _raw(b"\xff\xfe{}"),
    "config nested 100k deep": _raw(b"[" * 100_000 + b"]" * 100_000),
    "config truncated": _raw(b'{"hidden_size": 6'),
    "NaN weights": _nan,
    "zero attention heads": _config(num_attention_heads=0),
}
CASES = {
    "eagle3": {
        **COMMON,
        "draft_vocab_size 0": _config(draft_vocab_size=0),
        "draft_vocab_size 1": _config(draft_vocab_size=1),
        "draft_vocab_size a string": _config(draft_vocab_size="x"),
        "feature layers floats": _aux([0.5, 1.5, 2.5]),
        "feature layers strings": _aux(["a", "b", "c"]),
        "two feature layers": _aux([0, 1]),
        "a feature layer past the target": _aux([0, 1, 99]),
        "eagle_config a list": _config(eagle_config=[1]),
        "rms_norm_eps a string": _config(rms_norm_eps="x"),
        "hidden_size a string": _config(hidden_size="x"),
        "a draft vocabulary of one id": lambda f: Eagle3Head.for_target(deep_target("llama"), torch.tensor([5])).save(
            f
        ),
    },
    "eagle": {**COMMON, "a draft vocabulary of two ids (under top-k)": _two_id_vocab},
    "medusa": {**COMMON, "a 1-D block": _flat_medusa_block, "a draft vocabulary of two ids": _two_id_vocab},
}
LOADERS = {"eagle3": load_eagle3_head, "eagle": load_eagle_head, "medusa": load_medusa_heads}


def _drafter(kind, head):
    from engine.drafters.eagle import EagleDrafter
    from engine.drafters.eagle3 import Eagle3Drafter
    from engine.drafters.medusa import MedusaDrafter

    return {"eagle3": Eagle3Drafter, "eagle": EagleDrafter, "medusa": MedusaDrafter}[kind](head)


def _save(kind, target, folder):
    if kind == "eagle3":
        Eagle3Head.for_target(target, torch.arange(0, 96, 2)).save(folder)
    elif kind == "eagle":
        random_head(target).save(folder)
    else:
        random_heads(target, k=2).save(folder)


@pytest.mark.parametrize("kind,case", [(k, c) for k, cases in CASES.items() for c in cases])
def test_a_damaged_head_folder_runs_exactly_or_fails_in_one_line(tmp_path, target, plain, kind, case):
    _save(kind, target, tmp_path)
    CASES[kind][case](tmp_path)
    try:
        head = LOADERS[kind](tmp_path, target)
    except GlanceError as exc:
        assert str(tmp_path) in str(exc) and "\n" not in str(exc)
        return
    greedy = list(Decoder(target, _drafter(kind, head), max_new_tokens=8).run(PROMPT))[-1].token_ids
    assert greedy == plain  # whatever the head drafts, the output is the target's
    sampled = list(Decoder(target, _drafter(kind, head), SamplingConfig(1.0, 1.0, 0), max_new_tokens=8).run(PROMPT))
    assert len(sampled[-1].token_ids) == 8


def test_a_nan_draft_model_under_sampling_drafts_nothing_and_stays_exact():
    from engine.drafters.vanilla import VanillaDrafter
    from tests.conftest import tiny_model

    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    with torch.no_grad():
        for p in draft.parameters():
            p.fill_(float("nan"))
    sampling = SamplingConfig(1.0, 1.0, 3)
    ref = list(Decoder(target, None, sampling, max_new_tokens=8).run(PROMPT))[-1].token_ids
    assert list(Decoder(target, VanillaDrafter(draft), sampling, max_new_tokens=8).run(PROMPT))[-1].token_ids == ref


# ---- chat templates -------------------------------------------------------------------------------------------
TEMPLATES = {
    "raises": "{{ raise_exception('no system role') }}",
    "a syntax error": "{% if %}",
    "an undefined call": "{{ foo() }}",
    "a sandbox refusal": "{{ ''.__class__.__mro__ }}",
    "division by zero": "{{ 1 / 0 }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "an int": 5,
    "a list without a default": [{"name": "tool_use", "template": "hi"}],
    "an endless loop": "{% for i in range(99999) %}{% for j in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
    "a range too big": "{% for i in range(10**12) %}{% endfor %}",
    "megabytes of output": "{{ 'a' * 3000000 }}",
    "renders nothing": "{{ '' }}",
}


@pytest.fixture(scope="module")
def tokenizer(model_folders):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_folders["target"]))


@pytest.mark.parametrize("case", TEMPLATES)
def test_a_hostile_chat_template_is_refused_in_one_line_within_its_second(tokenizer, case):
    tokenizer.chat_template = TEMPLATES[case]
    start = time.monotonic()
    with pytest.raises(GlanceError, match=r"chat template .*--no-chat"):
        encode_prompt(tokenizer, "hello", True)
    assert time.monotonic() - start < 5
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    assert tokenizer.decode(encode_prompt(tokenizer, "hello", True)).replace(" ", "").startswith("<user>")


# ---- GGUF headers ---------------------------------------------------------------------------------------------
def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(meta: dict, tensors: list[str], counts: tuple[int, int] | None = None) -> bytes:
    """A GGUF header (version 3): string and uint32 metadata, and tensor infos of one float32 dimension."""
    out = b"GGUF" + struct.pack("<I", 3)
    out += struct.pack("<QQ", *(counts or (len(tensors), len(meta))))
    for key, value in meta.items():
        out += _string(key)
        out += struct.pack("<I", 8) + _string(value) if isinstance(value, str) else struct.pack("<II", 4, value)
    for name in tensors:
        out += _string(name) + struct.pack("<IQIQ", 1, 4, 0, 0)
    return out + b"\0" * 32


GOOD_META = {"general.architecture": "llama", "llama.block_count": 2}
GOOD_TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight"]


@pytest.mark.parametrize(
    "data,match",
    [
        (b"GGML" + b"\0" * 40, "magic"),
        (gguf_bytes(GOOD_META, GOOD_TENSORS, counts=(3, 2**60)), "claims 1,152,921,504,606,846,976 metadata"),
        (gguf_bytes(GOOD_META, GOOD_TENSORS, counts=(2**40, 2)), "tensors, more than the file"),
        (gguf_bytes(GOOD_META, GOOD_TENSORS)[:60], "past the end|bytes can hold"),
        (gguf_bytes({**GOOD_META, "llama.block_count": 5}, GOOD_TENSORS), "claims 5 layers .* holds tensors for 2"),
        (gguf_bytes({**GOOD_META, "llama.block_count": 10**9}, GOOD_TENSORS), "claims 1000000000 layers"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string("k") + struct.pack("<IIQ", 9, 8, 2**50), "array items"),
    ],
    ids=["magic", "entries", "tensors", "cut", "layers", "a billion layers", "array"],
)
def test_a_damaged_gguf_header_is_refused_before_transformers_reads_it(tmp_path, data, match):
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    start = time.monotonic()
    with pytest.raises(GlanceError, match=match):
        check_gguf_header(path)
    assert time.monotonic() - start < 2


def test_a_whole_gguf_header_passes(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes(GOOD_META, GOOD_TENSORS))
    assert check_gguf_header(path)["llama.block_count"] == 2


# ---- model folders, prompt files, positions, writes ------------------------------------------------------------
def test_a_model_folder_missing_a_tensor_is_refused_by_name_unless_accepted(model_folders, tmp_path):
    from engine.models.loading import load_model

    folder = tmp_path / "m"
    shutil.copytree(model_folders["target"], folder)
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(GlanceError, match=r"1 missing \(model.layers.1.mlp.up_proj.weight\).*--accept-missing-weights"):
        load_model(folder)
    assert load_model(folder, accept_missing_weights=True).parameters > 0


@pytest.mark.parametrize(
    "data,match",
    [
        (b'{"prompt": ' * 5000 + b'"x"' + b"}" * 5000 + b"\n", "nested too deeply"),
        (b'{"prompt": "x"}\n' + b"[" * 100_000 + b"\n", ":2: not JSON"),
        (b"\xff\xfe\n", "not UTF-8"),
    ],
    ids=["nested", "a deep line", "not UTF-8"],
)
def test_a_hostile_prompt_file_names_its_line(tmp_path, data, match):
    from engine.train.data.prompts import load_prompt_suite

    path = tmp_path / "p.jsonl"
    path.write_bytes(data)
    with pytest.raises(GlanceError, match=match):
        load_prompt_suite(path)


def test_an_absolute_position_model_runs_within_its_table_and_refuses_past_it():
    """GPT-2 with 64 positions: the budget's forward timing fits the table, and a run past it is refused first."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from engine.budget.draft_budget import make_budget
    from engine.drafters.lookahead import LookaheadDrafter

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96, bos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    for drafter in (None, LookaheadDrafter()):
        out = list(Decoder(model, drafter, max_new_tokens=30, budget=make_budget("auto")).run(PROMPT))
        assert len(out[-1].token_ids) == 30
    with pytest.raises(GlanceError, match="takes at most 64 positions"):
        list(Decoder(model, None, max_new_tokens=70).run(PROMPT))


def test_convert_into_an_unwritable_place_fails_in_one_line_and_leaves_nothing(tmp_path, monkeypatch, model_folders):
    from safetensors import SafetensorError

    from engine.models import convert, loading

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(GlanceError, match="cannot write the converted model"):
        convert.convert_gguf(tmp_path / "x.gguf", blocker / "out")
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: real(model_folders["target"]))  # no GGUF needed

    def full(*a, **k):
        raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
    with pytest.raises(GlanceError, match="No space left on device"):
        convert.convert_gguf(tmp_path / "x.gguf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no half folder, no temporary one


def test_a_killed_conversions_leftovers_are_removed_by_the_next(tmp_path):
    from engine.models.convert import TMP_PREFIX, _remove_stale

    dead = tmp_path / f"{TMP_PREFIX}999999999-abc"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"0" * 100)
    alive = tmp_path / f"{TMP_PREFIX}1-abc"  # pid 1 is alive: its conversion is still running
    alive.mkdir()
    _remove_stale(tmp_path)
    assert not dead.exists() and alive.exists()


# ---- session logs -----------------------------------------------------------------------------------------------
def _step_line(lines: list[dict], edit) -> list[dict]:
    """The log with its second step edited by `edit(record)` (a step that drafted: the first is the prefill)."""
    out = json.loads(json.dumps(lines))  # a deep copy: the fixture's lines stay whole
    steps = [i for i, r in enumerate(out) if r.get("type") == "step" and r.get("draft_tokens")]
    edit(out[steps[0]])
    return out


def _set(key, value):
    return lambda rec: rec.__setitem__(key, value)


LOG_DAMAGE = {
    "accepted node out of range": _set("accepted_nodes", [99]),
    "a parent cycle": lambda r: r.__setitem__("draft_parents", [len(r["draft_parents"]) - 1] * len(r["draft_parents"])),
    "parents shorter than the draft": lambda r: r.__setitem__("draft_parents", r["draft_parents"][:-1]),
    "top with strings": _set("target_top", [[["a", "b"]]]),
    "top with short pairs": _set("target_top", [[[1]]]),
    "window not a list": lambda r: r["notes"].__setitem__("window", 5),
    "window of strings": lambda r: r["notes"].__setitem__("window", [["x"]]),
    "pieces not a list": _set("pieces", "abc"),
    "a negative token": lambda r: r.__setitem__("tokens", [-5] + r["tokens"][1:]),
    "from_draft shorter than tokens": _set("from_draft", []),
    "a huge token id": lambda r: r.__setitem__("tokens", [10**30] + r["tokens"][1:]),
}
HEADER_DAMAGE = {
    "settings null": lambda h: h.__setitem__("settings", None),
    "settings a list": lambda h: h.__setitem__("settings", [1]),
    "methods not strings": lambda h: h["settings"].__setitem__("methods", [1, 2]),
    "temperature a string": lambda h: h["settings"].__setitem__("temperature", "hot"),
    "models a string": lambda h: h.__setitem__("models", "x"),
}


@pytest.fixture(scope="module")
def cli_log(model_folders, tmp_path_factory) -> list[dict]:
    """A real log written by `generate --log` with a draft model (its steps draft and carry their text)."""
    from engine.cli import main

    path = tmp_path_factory.mktemp("log") / "run.jsonl"
    t = str(model_folders["target"])
    argv = ["generate", "--target", t, "--draft", str(model_folders["copy"]), "--method", "vanilla", "--log", str(path)]
    assert main([*argv, "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--dtype", "float32"]) == 0
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_cli_log_carries_its_text(cli_log):
    steps = [r for r in cli_log if r["type"] == "step"]
    assert all(isinstance(r.get("pieces"), list) and len(r["pieces"]) == len(r["tokens"]) for r in steps)
    assert "".join("".join(r["pieces"]) for r in steps).strip()


@pytest.mark.parametrize("case", [*LOG_DAMAGE, *HEADER_DAMAGE])
def test_a_damaged_log_reads_with_the_damage_named_and_skipped(tmp_path, cli_log, case):
    from engine.records.session_log import read_session_logs

    if case in LOG_DAMAGE:
        lines = _step_line(cli_log, LOG_DAMAGE[case])
    else:
        lines = json.loads(json.dumps(cli_log))
        HEADER_DAMAGE[case](lines[0])
    _write(tmp_path / "log.jsonl", lines)
    (run,) = read_session_logs(tmp_path / "log.jsonl")
    assert run.skipped, case  # named
    assert isinstance(run.header["settings"], dict)
    if case in LOG_DAMAGE:
        assert len(run.steps) == sum(r["type"] == "step" for r in cli_log) - 1


# ---- the window's settings file ---------------------------------------------------------------------------------
@pytest.mark.gui
def test_a_settings_file_with_values_out_of_range_starts_the_window_with_defaults(qtbot, tmp_path):
    """Issue 76: one oversized number in the settings file aborted every launch; a 2 MB prompt hung it."""
    from PySide6.QtCore import QSettings

    from app.main_window import MainWindow

    ini = tmp_path / "settings.ini"
    ini.write_text(
        "[General]\nmax_new=99999999999999999999\nseed=99999999999999999999\ntemperature=nan\ntop_p=abc\n"
        f"prompt={'x' * 2_000_000}\ndevice=tpu\ncompile=maybe\ndraft_budget=zzz\ncompile_seconds=1e400\n"
        "[drafters]\nvanilla_gamma=99999999999999999999\n"
    )
    start = time.monotonic()
    win = MainWindow(settings=QSettings(str(ini), QSettings.Format.IniFormat), autosave_dir=tmp_path, autoload=False)
    qtbot.addWidget(win)
    assert time.monotonic() - start < 10
    gen = win.gen_panel
    assert (gen.max_new.value(), gen.seed.value(), gen.temperature.value(), gen.top_p.value()) == (64, 0, 0.0, 1.0)
    assert win.model_panel.device.currentText() == "auto" and len(win.prompt_panel.text.toPlainText()) < 1000
    assert "reset to defaults from the settings file: device: 'tpu'" in win.banner.text()
    win.save_settings()  # the file is whole again
    again = MainWindow(settings=QSettings(str(ini), QSettings.Format.IniFormat), autosave_dir=tmp_path, autoload=False)
    qtbot.addWidget(again)
    assert again.banner.text() == ""
    win.close()
    again.close()


# ---- bench validates before its first run ----------------------------------------------------------------------
def test_bench_refuses_a_too_long_prompt_and_an_oversized_batch_before_the_first_run(
    tmp_path, model_folders, monkeypatch, capsys
):
    """Issue 76: a too-long prompt was refused at its turn, after 27 of 31 runs; --batch-sizes 4096 tried 17 GB."""
    from engine.bench import suite
    from engine.cli import main
    from engine.runtime import memory

    ran = []
    monkeypatch.setattr(suite, "decode_once", lambda *a, **k: ran.append(a) or {})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):", "id": "short"}\n{"prompt": "' + "ab " * 400 + '", "id": "long"}\n')
    t = ["--target", str(model_folders["target"]), "--compile", "off", "--out", str(tmp_path / "out")]
    assert main(["bench", *t, "--methods", "ar,lookahead", "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert "prompt 'long'" in err and "takes at most 256 positions" in err and not ran
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1000)
    assert main(["bench", *t, "--methods", "ar", "--batch-sizes", "1,64", "--limit", "1"]) == 2
    assert "batch size 1 needs about" in capsys.readouterr().err and not ran


def test_a_sweep_of_one_new_token_reports_dashes_not_a_crash(tmp_path, model_folders, capsys):
    from engine.cli import main

    t = ["--target", str(model_folders["target"]), "--draft", str(model_folders["copy"]), "--compile", "off"]
    argv = ["bench", *t, "--methods", "ar,vanilla", "--batch-sizes", "1,2", "--max-new-tokens", "1", "--limit", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert "(– + –)" in capsys.readouterr().out


def test_an_unwritable_compile_cache_falls_back_to_a_temporary_one(tmp_path, monkeypatch, capsys):
    """Issue 76: a compile cache folder that cannot be written broke every command (torch creates it on import,
    so main.py checks it first)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("glance_main", Path(__file__).resolve().parents[1] / "main.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(blocker / "cache"))
    entry.usable_inductor_cache()
    fallback = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert fallback.is_dir() and fallback != blocker / "cache" and os.access(fallback, os.W_OK)
    assert "the compile cache" in capsys.readouterr().err
    fallback.rmdir()


def test_a_bundled_draft_without_its_installed_target_says_how_to_install(tmp_path, monkeypatch):
    """Issue 76: it said "the target folder holds no safetensors weights to share with the draft" instead."""
    from engine.models.loading import RESOURCES, load_model

    monkeypatch.setenv("GLANCE_HOME", str(tmp_path))
    with pytest.raises(GlanceError, match=r"not installed yet: run `python main.py models install smollm2`"):
        load_model(RESOURCES / "models" / "smollm2" / "draft")


def test_a_small_position_table_loads_times_and_races_in_a_session(tmp_path):
    """Issue 76: the load's forward timing ran at 128 cached positions, past GPT-2's 64, on every method."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from engine.session import RaceSettings, Session
    from engine.train.data.tokenizer import train_tokenizer

    tok = train_tokenizer(["def add(a, b):\n    return a + b\n"] * 20, 300, tmp_path / "tok")
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=len(tok), bos_token_id=None)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    session = Session.load(str(tmp_path / "gpt2"), methods=["ar", "lookahead"], dtype="float32", time_forwards=True)
    ids = session.encode("def add(a, b):", False)
    out = {lane: item for lane, item in session.race(ids, RaceSettings(["ar", "lookahead"], 40)) if item is not None}
    assert len(out["ar"].token_ids) == 40 and out["lookahead"].token_ids == out["ar"].token_ids


def test_a_run_refused_for_its_length_leaves_the_log_as_it_was(tmp_path, model_folders, capsys):
    from engine.cli import main

    log = tmp_path / "run.jsonl"
    argv = ["generate", "--target", str(model_folders["target"]), "--prompt", "def f(x):", "--log", str(log)]
    assert main([*argv, "--max-new-tokens", "4"]) == 0
    before = log.read_bytes()
    assert main([*argv, "--max-new-tokens", "400"]) == 2
    assert "takes at most 256 positions" in capsys.readouterr().err and log.read_bytes() == before
