"""DFlash: the block drafter in z-lab's layout is lossless (greedy against the target's own uncached forward, on
Llama, Qwen3 and GPT-2 targets, one row and two), samples exactly (chi-square), trains (a few steps make it accept
on a tiny target), saves and loads, refuses hostile folders in one line, and serves."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.cli import main
from engine.decoding.loop import Decoder
from engine.drafters.dflash import DFlashDrafter
from engine.errors import GlanceError
from engine.heads.dflash import DFlashHead, load_dflash_head, spread_layers
from tests.conftest import SMALL, VOCAB
from tests.test_sampling_exact import second_token_pvalue

NEW = 24
PROMPTS = [[1, 2, 3], [17, 5, 60, 33, 8, 8, 41], [90]]


def target_of(arch: str, layers: int = 4, vocab: int = VOCAB, seed: int = 0) -> torch.nn.Module:
    """A tiny random target with `layers` layers, its read-out scaled so greedy text is not one repeated token."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen3Config

    common = dict(vocab_size=vocab, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    shape = {**SMALL, "num_hidden_layers": layers}
    cfg = {
        "llama": lambda: LlamaConfig(**shape, **common),
        "qwen3": lambda: Qwen3Config(**shape, head_dim=16, **common),
        "gpt2": lambda: GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_positions=256, **common),
    }[arch]()
    cfg.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


@torch.no_grad()
def recomputed(model, prompt: list[int], new: int = NEW) -> list[int]:
    """The oracle: the target's argmax over its whole text, recomputed without a cache at every step."""
    ids = list(prompt)
    for _ in range(new):
        ids.append(int(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def random_head(target, layers: int = 2, block: int = 8, seed: int = 1, scale: float = 1.0) -> DFlashHead:
    torch.manual_seed(seed)
    n = target.config.num_hidden_layers
    head = DFlashHead.for_target(target, layers, block, target_layer_ids=spread_layers(n, 3)).eval()
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02 * scale)
    return head


@pytest.fixture(scope="module", params=["llama", "qwen3", "gpt2"])
def pair(request):
    target = target_of(request.param)
    return target, random_head(target), [recomputed(target, p) for p in PROMPTS]


def test_greedy_is_lossless_one_row(pair):
    target, head, refs = pair
    for prompt, ref in zip(PROMPTS, refs):
        res = Decoder(target, DFlashDrafter(head), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == ref, (prompt, res.tokens, ref)
        assert len(res.events[1].draft_tokens) == 7  # block 8: the pending token + 7 drafts
        assert res.events[1].notes.block_size == 8


def test_greedy_is_lossless_in_a_batch_and_with_a_shorter_block(pair):
    target, head, refs = pair
    dec = Decoder(target, DFlashDrafter(head, block_size=4), max_new_tokens=NEW)
    result = dec.generate_batch(PROMPTS, rows=2)
    assert result.tokens == refs
    assert max(max(w) for w in result.row_widths) == 4  # the pending token + 3 drafts


def test_sampling_follows_the_target():
    target = target_of("llama", vocab=12)
    head = random_head(target, block=4, scale=20.0)  # a confident, mostly wrong draft: rejections get exercised
    assert second_token_pvalue(target, DFlashDrafter(head), [3, 7, 1, 0, 5], 3, drafted=1) > 1e-3


def _greedy_stream(target, length: int = 3000) -> torch.Tensor:
    """The target's own greedy text from many short random prompts: what drafting will see."""
    g = torch.Generator().manual_seed(0)
    out = []
    while sum(map(len, out)) < length:
        prompt = torch.randint(0, VOCAB, (3,), generator=g).tolist()
        out.append(torch.tensor(prompt + recomputed(target, prompt, 45)))
    return torch.cat(out)


def test_a_few_training_steps_make_it_accept_and_it_stays_lossless(tmp_path):
    from engine.train.recipes.dflash import anchors_for, block_acceptance, dflash_loss, target_view

    target = target_of("llama")
    head = DFlashHead.for_target(target, layers=1, block_size=6, target_layer_ids=[0, 2]).train()
    stream = _greedy_stream(target)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    before = block_acceptance(head.eval(), target, stream, seq_len=48, windows=8)
    head.train()
    for _ in range(80):
        starts = torch.randint(0, len(stream) - 49, (8,), generator=g)
        batch = torch.stack([stream[s : s + 48] for s in starts])
        feats, logits = target_view(target, head, batch)
        loss, _ = dflash_loss(head, batch, feats, logits, None, anchors_for(48, 6, 6, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()
    after = block_acceptance(head, target, stream, seq_len=48, windows=8)
    assert after[0]["accepted"] > before[0]["accepted"] + 0.2, (before[0], after[0])
    head.save(tmp_path / "dflash")
    loaded = load_dflash_head(tmp_path / "dflash", target)
    taus = []
    for prompt in PROMPTS:
        res = Decoder(target, DFlashDrafter(loaded), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == recomputed(target, prompt)
        taus.append(res.summary.mean_accepted_length)
    assert max(taus) > 1.5  # the trained blocks get drafts accepted: the speculative path ran


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    target = target_of("llama")
    folder = tmp_path_factory.mktemp("dflash") / "draft"
    random_head(target).save(folder)
    return target, folder


def _edit_config(folder, tmp_path, **nested):
    out = tmp_path / "edited"
    out.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in nested.items():
        if key in ("block_size", "hidden_size"):
            cfg[key] = value
        else:
            cfg["dflash_config"][key] = value
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize(
    "edit,match",
    [
        ({"target_layer_ids": [0, 99]}, "do not fit a 4-layer target"),
        ({"target_layer_ids": [3]}, "ids run from 0 to 2"),
        ({"target_layer_ids": "abc"}, "not a list"),
        ({"block_size": 0}, "block_size is 0"),
        ({"block_size": 10_000}, "block_size is 10000"),
        ({"mask_token_id": VOCAB}, "outside the target's 96-token embedding"),
        ({"mask_token_id": -1}, "mask_token_id is -1"),
        ({"hidden_size": 32}, "hidden size 32 differs"),
    ],
)
def test_a_hostile_config_is_one_clear_error(saved, tmp_path, edit, match):
    target, folder = saved
    with pytest.raises(GlanceError, match=match):
        load_dflash_head(_edit_config(folder, tmp_path, **edit), target)


@pytest.mark.parametrize("damage", ["missing", "nan", "shape", "foreign"])
def test_damaged_weights_are_one_clear_error(saved, tmp_path, damage):
    target, folder = saved
    out = tmp_path / "damaged"
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    if damage == "missing":
        del state["layers.1.mlp.down_proj.weight"]
        match = "missing \\['layers.1.mlp.down_proj.weight'\\]"
    elif damage == "nan":
        state["layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
        match = "NaN or infinite"
    elif damage == "shape":
        state["fc.weight"] = torch.zeros(64, 64)
        match = "fc.weight is \\[64, 64\\]"
    else:
        state = {"midlayer.self_attn.q_proj.weight": torch.zeros(2, 2)}
        match = "not the DFlash layout .an EAGLE-3 head"
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(GlanceError, match=match):
        load_dflash_head(out, target)


def test_the_cli_races_it_and_refuses_a_bad_folder_in_one_line(model_folders, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(model_folders["target"])
    random_head(target).save(tmp_path / "draft")
    common = ["--target", str(model_folders["target"]), "--prompt", "def add(a, b):", "--max-new-tokens", "12"]
    assert main(["generate", "--method", "ar", *common, "--dtype", "float32", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    argv = ["generate", "--method", "dflash", "--dflash", str(tmp_path / "draft"), "--dflash-block", "5"]
    assert main([*argv, *common, "--dtype", "float32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"]
    assert out["settings"]["block_size"] == 5
    bad = _edit_config(tmp_path / "draft", tmp_path, block_size=10_000)
    assert main(["generate", "--method", "dflash", "--dflash", str(bad), *common]) == 2
    err = capsys.readouterr().err.strip()
    assert "block_size is 10000" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert main([*argv[:5], "--dflash-block", "100", *common]) == 2
    assert "--dflash-block must be between 0 and 64" in capsys.readouterr().err


def test_serving_config_names_each_engines_method(saved):
    from engine.drafters.dflash import DFlashOptions
    from engine.drafters.serving import serving_for

    _, folder = saved
    s = serving_for("dflash", DFlashOptions(), str(folder))
    assert s.vllm == {"method": "dflash", "model": str(folder), "num_speculative_tokens": 7}
    assert s.sglang["speculative-algorithm"] == "DFLASH" and s.sglang["speculative-num-draft-tokens"] == 8
    assert s.transformers["speculation_type"] == "dflash"


def test_the_block_is_what_transformers_dflash_class_computes_and_its_generate_agrees():
    """The same weights in transformers' own DFlash draft class give the same block outputs, and its assisted
    generation (speculation_type="dflash") the same tokens: Glance reads the published layout as transformers does."""
    from engine.heads.dflash import transformers_assistant

    target = target_of("llama")
    head = random_head(target, scale=5.0)
    theirs = transformers_assistant(head)
    feats = torch.randn(1, 5, head.fc.in_features)
    ids = torch.tensor([[5] + [head.mask_token_id] * (head.block_size - 1)])
    with torch.no_grad():
        mine = head.block(
            ids, torch.arange(5, 5 + head.block_size)[None], head.context(feats, torch.arange(5)[None]), None
        )
        out = theirs(noise_embeds=target.get_input_embeddings()(ids), context_hidden_states=feats,
                     position_ids=torch.arange(5 + head.block_size)[None]).last_hidden_state  # fmt: skip
    assert torch.allclose(mine, out, atol=1e-5)
    prompt = PROMPTS[1]
    got = target.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, assistant_model=theirs,
                          speculation_type="dflash", pad_token_id=0)  # fmt: skip
    glance = Decoder(target, DFlashDrafter(head), max_new_tokens=NEW).generate(prompt)
    assert got[0, len(prompt) :].tolist() == glance.tokens == recomputed(target, prompt)


@pytest.mark.slow
def test_the_compiled_block_drafts_what_the_eager_one_does_and_compiles_nothing_after_its_warm_up():
    from torch._dynamo.utils import counters

    from engine.heads.compiled_block import compile_block

    target = target_of("llama")
    head = random_head(target, scale=5.0)
    eager = [Decoder(target, DFlashDrafter(head), max_new_tokens=NEW).generate(p).tokens for p in PROMPTS]
    report = compile_block(head, lambda *a: None)
    try:
        assert report.compiled, report.line()
        calls = []
        graph = head.compiled.one_row
        head.compiled.one_row = lambda *a: calls.append(1) or graph(*a)
        graphs = counters["stats"]["unique_graphs"]
        for prompt, want in zip(PROMPTS, eager):
            res = Decoder(target, DFlashDrafter(head), max_new_tokens=NEW).generate(prompt)
            assert res.tokens == want == recomputed(target, prompt)
        batch = Decoder(target, DFlashDrafter(head), max_new_tokens=NEW).generate_batch(PROMPTS, rows=2)
        assert batch.tokens == eager
        assert len(calls) > NEW and counters["stats"]["unique_graphs"] == graphs
    finally:
        head.__dict__["compiled"] = None


@pytest.mark.gui
def test_the_inspector_shows_the_block_and_what_the_target_kept(qtbot):
    from app.inspector import StepInspector

    target = target_of("llama")
    res = Decoder(target, DFlashDrafter(random_head(target)), max_new_tokens=NEW).generate(PROMPTS[0])
    ev = res.events[1]
    inspector = StepInspector()
    qtbot.addWidget(inspector)
    inspector.show_step("dflash", ev, str)
    items = [inspector.tree.topLevelItem(i) for i in range(inspector.tree.topLevelItemCount())]
    block = [i for i in items if i.text(0) == "block"]
    assert block and block[0].text(1) == "8 positions"
    assert block[0].text(3) == f"7 drafts verified, {len(ev.accepted_nodes)} kept"
