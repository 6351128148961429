"""Serving configs: every method maps to vLLM, SGLang and transformers with documented names only, transformers'
arguments run in the installed transformers, and the CLI and the app write them."""

import json

import pytest
import torch

from engine import DrafterOptions, Session
from engine.cli import main
from engine.drafters.serving import render, serving_for
from engine.registry import BASELINE, METHODS, spec

# vLLM's SpeculativeConfig fields and methods, and SGLang's server flags, as their documentation lists them (neither
# engine installs on this machine: the names are checked against their docs instead of their classes).
VLLM_FIELDS = {
    "method",
    "model",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "suffix_decoding_max_cached_requests",
}
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "dflash", "mtp"}
SGLANG_FLAGS = {
    "speculative-algorithm",
    "speculative-draft-model-path",
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
}
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"}


def recipes(target: str | None):
    source, parts = Session.resolve(target)
    options = DrafterOptions()
    for method in METHODS:
        part = spec(method).part
        path = parts.get(part.key) if part else None
        if part is not None and path is None:
            continue
        yield method, source, serving_for(method, options.for_method(method), path)


@pytest.mark.parametrize("target", [None, "SmolLM2-135M-Instruct"])
def test_every_method_maps_to_documented_names(target):
    if target and not Session.resolve(target)[1]:
        pytest.skip("SmolLM2 is not installed: python main.py models install smollm2")
    seen = set()
    for method, source, s in recipes(target):
        seen.add(method)
        if s.vllm is not None:
            assert set(s.vllm) <= VLLM_FIELDS and s.vllm["method"] in VLLM_METHODS, method
            assert s.vllm["num_speculative_tokens"] >= 1
        if s.sglang is not None:
            assert set(s.sglang) <= SGLANG_FLAGS and s.sglang["speculative-algorithm"] in SGLANG_ALGORITHMS, method
        page = render(method, source, s)
        assert page.startswith(f"# Serving `{method}`") and source in page
        if s.vllm is None and s.sglang is None and s.transformers is None:
            assert s.notes, f"{method}: says nothing about why no engine runs it"
    assert seen >= {"ar", "lookahead", "prompt_lookup", "suffix"}
    assert serving_for(BASELINE, None, None).notes


def test_the_exported_values_follow_the_race_settings():
    options = DrafterOptions(vanilla_gamma=5, eagle3_top_k=8, eagle3_depth=3, eagle3_total_tokens=25)
    _, parts = Session.resolve(None)
    vanilla = serving_for("vanilla", options.for_method("vanilla"), parts["draft"])
    assert vanilla.vllm["num_speculative_tokens"] == 5 and vanilla.sglang["speculative-num-steps"] == 5
    assert vanilla.transformers["num_assistant_tokens"] == 5 and vanilla.vllm["model"] == parts["draft"]
    eagle3 = serving_for("eagle3", options.for_method("eagle3"), parts["eagle3"])
    assert eagle3.sglang["speculative-eagle-topk"] == 8 and eagle3.sglang["speculative-num-draft-tokens"] == 25
    assert eagle3.sglang["speculative-num-steps"] == 4  # the tree's levels: the root's children and 3 expansions
    with pytest.raises(Exception, match="give --draft"):
        serving_for("vanilla", options.for_method("vanilla"), None)


def test_transformers_arguments_run_in_the_installed_transformers(model_folders):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(model_folders["target"])
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    for method in ("vanilla", "prompt_lookup"):
        kw = dict(serving_for(method, DrafterOptions().for_method(method), str(model_folders["copy"])).transformers)
        if "assistant_model" in kw:
            kw["assistant_model"] = AutoModelForCausalLM.from_pretrained(kw["assistant_model"])
        out = target.generate(ids, max_new_tokens=4, do_sample=False, **kw)
        plain = target.generate(ids, max_new_tokens=4, do_sample=False)
        assert torch.equal(out, plain), method


def test_the_cli_writes_a_serving_config(tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["serve-config", "--method", "eagle", "--eagle-top-k", "6", "--json", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["method"] == "eagle" and data["sglang"]["speculative-eagle-topk"] == 6
    assert main(["serve-config", "--method", "lookahead"]) == 0
    assert "vLLM has no such method" in capsys.readouterr().out
    assert main(["serve-config", "--method", "vanilla", "--out", str(tmp_path / "missing" / "x.md")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_a_drafts_own_vocabulary_is_named_in_the_export(tmp_path):
    """Other engines read a draft's full LM head: the export says so where the draft has a draft vocabulary."""
    from engine.heads.draft_vocab import save_draft_vocab

    options = DrafterOptions().for_method("vanilla")
    assert not any("draft vocabulary" in n for n in serving_for("vanilla", options, str(tmp_path)).notes)
    save_draft_vocab(tmp_path, torch.tensor([1, 2, 3]))
    assert any("draft vocabulary" in n for n in serving_for("vanilla", options, str(tmp_path)).notes)
