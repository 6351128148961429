"""MTP: a multi-token-prediction layer chained K deep is lossless (greedy against the target's uncached forward, one
row, two rows, the chain and a top-k tree), samples exactly, trains (a few steps make it accept), saves and loads,
loads a target's own layers from its checkpoint through transformers (a tiny GLM-4.5-style MoE target), and refuses
what does not fit in one line."""

import glob
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.cli import main
from engine.decoding.loop import Decoder
from engine.drafters.mtp import MtpDrafter
from engine.errors import GlanceError
from engine.heads.mtp import MtpHead, declares_mtp, load_mtp_head
from tests.test_dflash import NEW, PROMPTS, _greedy_stream, recomputed, target_of
from tests.test_sampling_exact import second_token_pvalue


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request):
    target = target_of(request.param)
    torch.manual_seed(1)
    return target, MtpHead(target).eval(), [recomputed(target, p) for p in PROMPTS]


@pytest.mark.parametrize("tokens,top_k", [(3, 1), (2, 3)])
def test_greedy_is_lossless(pair, tokens, top_k):
    target, head, refs = pair
    for prompt, ref in zip(PROMPTS, refs):
        res = Decoder(target, MtpDrafter(head, tokens, top_k), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == ref, (prompt, res.tokens, ref)
        assert len(res.events[1].draft_tokens) == (tokens if top_k == 1 else tokens * top_k)


def test_greedy_is_lossless_in_a_batch(pair):
    target, head, refs = pair
    assert Decoder(target, MtpDrafter(head, 3), max_new_tokens=NEW).generate_batch(PROMPTS, rows=2).tokens == refs


def test_sampling_follows_the_target():
    target = target_of("llama", vocab=12)
    torch.manual_seed(2)
    head = MtpHead(target).eval()
    with torch.no_grad():
        head.layers[0].post_norm.weight.mul_(8.0)  # a confident, mostly wrong layer: rejections get exercised
    assert second_token_pvalue(target, MtpDrafter(head, 2), [3, 7, 1, 0, 5], 3, drafted=1) > 1e-3


def test_a_few_training_steps_make_it_accept_and_it_stays_lossless(tmp_path):
    from engine.train.recipes.mtp import layer_accuracy, mtp_loss, target_view

    target = target_of("llama")
    head = MtpHead(target)
    stream = _greedy_stream(target)
    before = layer_accuracy(head.eval(), target, stream, seq_len=48, windows=8)[0]["top1"]
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(stream) - 49, (8,), generator=g)
        batch = torch.stack([stream[s : s + 48] for s in starts])
        hidden, logits = target_view(target, batch)
        loss, _ = mtp_loss(head, batch, hidden, logits, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()
    after = layer_accuracy(head, target, stream, seq_len=48, windows=8)[0]["top1"]
    assert after > before + 0.2, (before, after)
    head.save(tmp_path / "mtp")
    loaded = load_mtp_head(tmp_path / "mtp", target)
    taus = []
    for prompt in PROMPTS:
        res = Decoder(target, MtpDrafter(loaded, 3), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == recomputed(target, prompt)
        taus.append(res.summary.mean_accepted_length)
    assert max(taus) > 1.5


@pytest.fixture(scope="module")
def native_folder(tmp_path_factory, model_folders):
    """A tiny GLM-4.5-style MoE target whose checkpoint ships one MTP layer under its published key names (the next
    layer index: enorm, hnorm, eh_proj, shared_head.norm, the decoder layer), which transformers' own mapping reads.
    46 layers: transformers knows GLM-4.5's MTP layer by that index."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    n = 46
    cfg = AutoConfig.for_model(
        "glm4_moe", vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_mtp_layers=1,
        n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=1, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    folder = tmp_path_factory.mktemp("glm") / "target"
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_folders["target"]).save_pretrained(folder)
    path = glob.glob(str(folder / "*.safetensors"))[0]
    state = load_file(path)
    g = torch.Generator().manual_seed(5)
    for key, value in list(state.items()):
        if key.startswith(f"model.layers.{n - 1}."):
            state[key.replace(f"layers.{n - 1}.", f"layers.{n}.")] = value + 0.01 * torch.randn(
                value.shape, generator=g
            )
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        state[f"model.layers.{n}.{norm}.weight"] = torch.ones(32)
    state[f"model.layers.{n}.eh_proj.weight"] = torch.randn(32, 64, generator=g) * 0.1
    save_file(state, path, metadata={"format": "pt"})
    return folder


def test_a_targets_own_layers_load_by_themselves_and_race_exactly(native_folder, capsys):
    assert declares_mtp(str(native_folder))
    common = ["--target", str(native_folder), "--prompt", "def add(a, b):", "--max-new-tokens", "12"]
    assert main(["generate", "--method", "ar", *common, "--dtype", "float32", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["generate", "--method", "mtp", *common, "--dtype", "float32", "--json"]) == 0  # no --mtp: native
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"] and len(set(plain["token_ids"])) > 1
    assert out["settings"]["mtp_layers"] == 1


def test_what_does_not_fit_is_one_line(tmp_path, model_folders, capsys):
    target = target_of("llama")
    with pytest.raises(GlanceError, match="neither MTP layers trained here"):
        load_mtp_head(model_folders["target"], target)  # a plain model folder: no MTP layers anywhere
    head = MtpHead(target)
    head.save(tmp_path / "mtp")
    with pytest.raises(GlanceError, match="MTP layers of width 64, the target's is 32"):
        load_mtp_head(tmp_path / "mtp", _narrow_llama())
    state = load_file(str(tmp_path / "mtp" / "model.safetensors"))
    state["layers.0.eh_proj.weight"][0, 0] = float("nan")
    save_file(state, str(tmp_path / "mtp" / "model.safetensors"))
    with pytest.raises(GlanceError, match="NaN or infinite"):
        load_mtp_head(tmp_path / "mtp", target)
    del state["layers.0.enorm.weight"]
    save_file(state, str(tmp_path / "mtp" / "model.safetensors"))
    with pytest.raises(GlanceError, match="missing \\['layers.0.enorm.weight'\\]"):
        load_mtp_head(tmp_path / "mtp", target)
    with pytest.raises(GlanceError, match="GPT2LMHeadModel's layers are not"):
        MtpHead(target_of("gpt2"))
    argv = ["generate", "--method", "mtp", "--mtp", str(tmp_path / "nowhere"), "--target", str(model_folders["target"])]
    assert main([*argv, "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "MTP folder not found" in err and len(err.splitlines()) == 1


def _narrow_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()  # fmt: skip


def test_serving_config_names_mtp_and_nextn():
    from engine.drafters.mtp import MtpOptions
    from engine.drafters.serving import serving_for

    s = serving_for("mtp", MtpOptions(tokens=3), "/some/folder")
    assert s.vllm == {"method": "mtp", "num_speculative_tokens": 3}
    assert s.sglang["speculative-algorithm"] == "NEXTN" and s.sglang["speculative-num-draft-tokens"] == 4


def test_the_bench_sets_the_lane_against_transformers_own_mtp(native_folder):
    from engine.bench.suite import BenchSetup, run_suite
    from engine.models.loading import load_model

    target = load_model(str(native_folder), device="cpu", dtype="float32")
    setup = BenchSetup(target, {"mtp": load_mtp_head(native_folder, target.model)}, max_new_tokens=10)
    prompts = [{"id": "a", "category": "defs", "prompt": "def add(a, b):"}]
    methods = run_suite(setup, prompts, ["ar", "mtp", "hf_mtp"])["methods"]
    assert methods["mtp"]["lossless"] and methods["hf_mtp"]["lossless"] and methods["mtp"]["vs_hf_mtp"] > 0
