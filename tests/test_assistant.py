"""Gemma 4's assistant: lossless on tiny Gemma 4 targets (KV-shared like E2B, unshared like the larger ones; greedy
against the target's own uncached forward, one row and a batch), each step's chain is what transformers' assistant
drafts from the same target outputs, sampling is exact (chi-square), transformers' assisted generation with the same
folder emits the same tokens, and folders that do not fit end in one line."""

import json

import pytest
import torch
import transformers as tf

from engine.cli import main
from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.assistant import AssistantDrafter
from engine.errors import GlanceError
from engine.heads.assistant import load_assistant_head, stored_layers
from tests.conftest import VOCAB
from tests.test_dflash import recomputed

PROMPTS = [[1, 2, 3], [17, 5, 60, 33, 8, 8, 41], [90]]
NEW = 20
KINDS = ["sliding_attention", "sliding_attention", "full_attention"]


def text_config(layers: int = 6, shared: int = 2, vocab: int = VOCAB, **kw) -> tf.Gemma4TextConfig:
    base = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=16,
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=vocab,
        sliding_window=512,
        layer_types=(KINDS * layers)[:layers],
        max_position_embeddings=1024,
        eos_token_id=None,
    )
    return tf.Gemma4TextConfig(**(base | kw))


def gemma4_target(shared: int = 2, seed: int = 0, flat: bool = False, vocab: int = VOCAB):
    """A tiny Gemma 4 target (Per-Layer Embeddings, KV-shared layers when `shared`); `flat`: its last norm zeroed,
    so it always says token 0 (every draft of an assistant that does too is accepted)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(
        text_config(shared=shared, vocab=vocab), attn_implementation="sdpa"
    ).eval()
    if flat:
        with torch.no_grad():
            model.model.norm.weight.zero_()
    return model


def save_assistant(folder, seed: int = 1, ordered: bool = True, flat: bool = False, vocab: int = VOCAB, **kw) -> None:
    """A random Gemma4AssistantForCausalLM for the tiny targets (width 64), in transformers' layout."""
    text = text_config(
        layers=2,
        shared=2,
        vocab=vocab,
        hidden_size=32,
        intermediate_size=64,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention"],
    )
    cfg = tf.Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=64,
        use_ordered_embeddings=ordered,
        num_centroids=8,
        centroid_intermediate_top_k=2,
        **kw,
    )
    torch.manual_seed(seed)
    model = tf.Gemma4AssistantForCausalLM(cfg).eval()
    with torch.no_grad():
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(vocab))
        if flat:
            model.model.norm.weight.zero_()
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant")
    save_assistant(root / "ordered")
    save_assistant(root / "plain", ordered=False, flat=True)
    return root


@pytest.mark.parametrize("shared", [2, 0])
def test_the_assistant_lane_is_lossless_alone_and_in_a_batch(parts, shared):
    target = gemma4_target(shared)
    head = load_assistant_head(parts / "ordered", target)
    assert head.context_layers == tuple(stored_layers(target.config)[k] for k in head.kinds)
    refs = [recomputed(target, p, NEW) for p in PROMPTS]
    for prompt, ref in zip(PROMPTS, refs):
        res = Decoder(target, AssistantDrafter(head, 3), max_new_tokens=NEW, eos_token_ids=[]).generate(prompt)
        assert res.tokens == ref
    batch = Decoder(target, AssistantDrafter(head, 3), max_new_tokens=NEW, eos_token_ids=[]).generate_batch(PROMPTS)
    assert batch.tokens == refs


def transformers_chain(target, assistant, tokens: list[int], k: int) -> list[int]:
    """What transformers' assistant drafts after the committed `tokens` (the last one pending): the target's uncached
    forward over the others gives the stored keys and the hidden state; the assistant's own forward chains k."""
    with torch.no_grad():
        out = target(torch.tensor([tokens[:-1]]), output_hidden_states=True, return_shared_kv_states=True)
        hidden, last, chain = out.hidden_states[-1][:, -1:], torch.tensor([[tokens[-1]]]), []
        for _ in range(k):
            x = torch.cat([target.get_input_embeddings()(last), hidden], dim=-1)
            a = assistant(
                inputs_embeds=x,
                position_ids=torch.tensor([[len(tokens) - 1]]),
                shared_kv_states=out.shared_kv_states,
                attention_mask=torch.ones(1, len(tokens) - 1),
            )
            last, hidden = a.logits.argmax(-1), a.last_hidden_state
            chain.append(int(last))
    return chain


@pytest.mark.parametrize("flat", [False, True])  # every draft rejected, then every draft accepted
def test_every_chain_is_what_transformers_assistant_drafts_from_the_same_text(parts, flat):
    target = gemma4_target(flat=flat)
    folder = parts / ("plain" if flat else "ordered")
    drafter = AssistantDrafter(load_assistant_head(folder, target), 3)
    assistant = tf.Gemma4AssistantForCausalLM.from_pretrained(folder).eval()
    seen = []
    propose = drafter.propose

    def recorded(states, max_tokens):
        drafts = propose(states, max_tokens)
        seen.extend((list(s.tokens), d.tokens) for s, d in zip(states, drafts) if s is not None and len(d))
        return drafts

    drafter.propose = recorded
    res = Decoder(target, drafter, max_new_tokens=NEW, eos_token_ids=[]).generate_batch(PROMPTS[:2])
    assert len(seen) >= 10
    for tokens, chain in seen:
        assert chain == transformers_chain(target, assistant, tokens, len(chain))
    assert res.tokens == [recomputed(target, p, NEW) for p in PROMPTS[:2]]
    if flat:
        assert max(res.steps) < NEW // 2  # whole chains accepted


def test_sampling_follows_the_target(tmp_path):
    """Leviathan's rule over the assistant's q: the second token follows the target's distribution (chi-square)."""
    from tests.test_sampling_exact import second_token_pvalue

    target = gemma4_target(vocab=16)
    save_assistant(tmp_path, vocab=16, ordered=False)
    drafter = AssistantDrafter(load_assistant_head(tmp_path, target), 2)
    assert second_token_pvalue(target, drafter, [3, 7, 1, 0, 5], 3, drafted=1) > 1e-3


def test_transformers_assisted_generation_with_the_same_folder_emits_the_same_tokens(parts):
    from engine.bench.reference import hf_generate, reference_assistant, reference_available
    from engine.session import DrafterOptions

    target = gemma4_target()
    head = load_assistant_head(parts / "ordered", target)
    loaded = {"assistant": head}
    assert reference_available("hf_assistant", target, loaded) and not reference_available("hf_assistant", target, {})
    model = reference_assistant("hf_assistant", loaded, DrafterOptions())
    assert model.generation_config.num_assistant_tokens == DrafterOptions().for_method("assistant").tokens
    ref = recomputed(target, PROMPTS[1], NEW)
    out = hf_generate("hf_assistant", target, PROMPTS[1], NEW, SamplingConfig(), [], model)
    assert out["tokens"] == ref


def test_folders_that_do_not_fit_end_in_one_line(parts, tmp_path):
    target = gemma4_target()
    wide = tmp_path / "wide"
    save_assistant(wide)
    cfg = json.loads((wide / "config.json").read_text())
    cases = {
        "backbone": ({"backbone_hidden_size": 96}, "width 96"),
        "type": ({"model_type": "llama"}, "not a Gemma 4 assistant"),
    }
    for name, (change, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.safetensors").write_bytes((wide / "model.safetensors").read_bytes())
        (folder / "config.json").write_text(json.dumps(cfg | change))
        with pytest.raises(GlanceError, match=message):
            load_assistant_head(folder, target)
    from safetensors.torch import load_file, save_file

    state = load_file(wide / "model.safetensors")
    for name, edit, message in [
        ("nan", lambda s: s["pre_projection.weight"].fill_(float("nan")), "NaN"),
        ("missing", lambda s: s.pop("post_projection.weight"), "incomplete"),
        ("order", lambda s: s["masked_embedding.token_ordering"].zero_(), "token_ordering"),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        damaged = {k: v.clone() for k, v in state.items()}
        edit(damaged)
        save_file(damaged, folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(GlanceError, match=message):
            load_assistant_head(folder, target)
    from tests.conftest import tiny_model

    with pytest.raises(GlanceError, match="stores none"):
        load_assistant_head(parts / "ordered", tiny_model("llama", seed=0))
    with pytest.raises(GlanceError, match="not found"):
        load_assistant_head(tmp_path / "nowhere", target)


def test_the_cli_refuses_an_assistant_for_another_target_in_one_line(parts, capsys):
    code = main(
        [
            "generate",
            "--prompt",
            "hi",
            "--method",
            "assistant",
            "--assistant",
            str(parts / "ordered"),
            "--max-new-tokens",
            "4",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "stores none" in err and len(err.strip().splitlines()) == 1
