"""Hypothesis at every boundary where a file enters Glance (issue 75): head configs, GGUF headers, chat templates,
session log lines and prompt files drawn at random end in a result or one GlanceError, never a traceback or a hang.
GLANCE_FUZZ_FILES sets the examples per boundary (default 300)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import GlanceError
from tests.test_untrusted_files import GOOD_META, GOOD_TENSORS, cli_log, gguf_bytes  # noqa: F401 (a fixture)

EXAMPLES = int(os.environ.get("GLANCE_FUZZ_FILES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def eagle3_folder(tmp_path_factory):
    from engine.heads.eagle3 import Eagle3Head
    from tests.test_eagle3 import deep_target

    target = deep_target("llama")
    folder = tmp_path_factory.mktemp("head")
    Eagle3Head.for_target(target, torch.arange(0, 96, 3)).save(folder)
    return target, folder, json.loads((folder / "config.json").read_text())


CONFIG_KEYS = [
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rms_norm_eps",
    "max_position_embeddings",
    "draft_vocab_size",
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
    "target_hidden_size",
]


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON, max_size=4), whole=st.none() | JSON)
def test_random_head_configs_load_and_run_or_fail_in_one_line(eagle3_folder, changes, whole):
    from engine.decoding.loop import Decoder
    from engine.drafters.eagle3 import Eagle3Drafter
    from engine.heads.eagle3 import load_eagle3_head

    target, folder, good = eagle3_folder
    config = whole if whole is not None else {**good, **changes}
    (folder / "config.json").write_text(json.dumps(config))
    try:
        head = load_eagle3_head(folder, target)
    except GlanceError as exc:
        assert "\n" not in str(exc)
        return
    finally:
        (folder / "config.json").write_text(json.dumps(good))
    out = list(Decoder(target, Eagle3Drafter(head), max_new_tokens=3).run([1, 2, 3]))
    assert len(out[-1].token_ids) == 3


@FUZZ
@given(
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.integers(0, 255)), max_size=6),
)
def test_random_gguf_headers_are_read_or_refused(cut, flips):
    from engine.models.gguf_check import check_gguf_header

    data = bytearray(gguf_bytes(GOOD_META, GOOD_TENSORS))
    for at, value in flips:
        if at < len(data):
            data[at] = value
    data = data[: max(cut, 4)] if cut < len(data) else data
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(bytes(data))
        try:
            check_gguf_header(path)
        except GlanceError as exc:
            assert "\n" not in str(exc)


FRAGMENTS = [
    "{{ messages[0]['content'] }}",
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}",
    "{% endif %}",
    "{{ m['role'] }}",
    "{{ 1 / 0 }}",
    "{{ raise_exception('no') }}",
    "{% for i in range(300) %}",
    "{{ foo.bar }}",
    "{{ ''.__class__ }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}",
    "{{ f(1) }}",
    "{{",
    "}}",
    "{%",
    "%}",
    "<|user|>",
    "{{ 'x' * 50000 }}",
    "{% set x = messages | length %}{{ x }}",
]


@pytest.fixture(scope="module")
def tokenizer(model_folders):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_folders["target"]))


@FUZZ
@given(parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=8))
def test_random_chat_templates_render_or_fail_in_one_line(tokenizer, parts):
    from engine.models.chat import encode_prompt

    tokenizer.chat_template = "".join(parts)
    try:
        ids = encode_prompt(tokenizer, "hello", True)
    except GlanceError as exc:
        assert "--no-chat" in str(exc)
        return
    assert ids


@FUZZ
@given(field=st.sampled_from(
    ["draft_tokens", "draft_parents", "accepted_nodes", "tokens", "from_draft", "target_probs", "target_top",
     "notes", "budget", "pieces", "clock", "step", "new_tokens", "prefill", "type", "run_id"]
), value=JSON, header_value=st.none() | JSON)  # fmt: skip
def test_random_log_lines_are_read_or_skipped_by_name(cli_log, field, value, header_value):  # noqa: F811
    from engine.records.session_log import check_step, read_session_logs

    lines = json.loads(json.dumps(cli_log))
    step = next(r for r in lines if r["type"] == "step" and r["draft_tokens"])
    step[field] = value
    if header_value is not None:
        lines[0]["settings"] = header_value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        (run,) = read_session_logs(path)
    assert isinstance(run.header["settings"], dict)
    for ev in run.steps:
        check_step(ev)  # what the window draws from is whole


@FUZZ
@given(lines=st.lists(JSON.map(json.dumps) | st.text(max_size=20), max_size=5))
def test_random_prompt_files_load_or_name_the_line(lines):
    from engine.train.data.prompts import load_prompt_suite

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        try:
            records = load_prompt_suite(path)
        except GlanceError as exc:
            assert "\n" not in str(exc)
            return
    assert all(isinstance(r["prompt"], str) and r["prompt"].strip() for r in records)
