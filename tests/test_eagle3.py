"""EAGLE-3: feature capture, the published checkpoint layout (reduced and full draft vocabularies), lossless greedy on
Llama, Qwen2 and Qwen3 targets, exact sampling, clear refusals, and training-time test."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.decoding.loop import Decoder
from engine.drafters.eagle3 import Eagle3Drafter
from engine.errors import GlanceError
from engine.heads.eagle3 import Eagle3Head, load_eagle3_head
from engine.heads.readout import draft_step
from engine.runtime.layer_features import default_feature_layers, layer_inputs
from engine.train.recipes.eagle3 import frequent_tokens, target_view, ttt_loss, ttt_visibility
from tests.conftest import SMALL, VOCAB, batch_decoder
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import second_token_pvalue


def deep_target(arch: str, seed: int = 0, vocab: int = VOCAB, sharpen: float = 4.0):
    """A random 4-layer target, so the low/middle/high feature layers are distinct."""
    import transformers as tf

    shape = dict(SMALL, num_hidden_layers=4, vocab_size=vocab, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = {
        "llama": lambda: tf.LlamaConfig(**shape),
        "qwen2": lambda: tf.Qwen2Config(use_sliding_window=False, **shape),
        "qwen3": lambda: tf.Qwen3Config(head_dim=16, **shape),
    }[arch]()
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def trained_head(target, draft_vocab: int, steps: int = 60) -> Eagle3Head:
    """A head fitted with training-time test on the target's own greedy continuations, so deep paths get accepted."""
    torch.manual_seed(1)
    vocab = target.config.vocab_size
    with torch.no_grad():
        seqs = target.generate(
            torch.randint(0, vocab, (8, 4)), do_sample=False, max_new_tokens=44, min_new_tokens=44, pad_token_id=0
        )
    draft_ids = frequent_tokens(seqs.flatten(), vocab, draft_vocab)
    head = Eagle3Head.for_target(target, draft_ids)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    feats, logits = target_view(target, head.layer_ids, seqs)
    for _ in range(steps):
        loss = ttt_loss(head, seqs, feats, logits, draft_ids, steps=3)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


def test_layer_inputs_are_the_hidden_states_of_those_layers():
    target = deep_target("llama")
    ids = torch.tensor([[1, 2, 3, 4]])
    with layer_inputs(target, (3, 0, 2)) as feats:
        out = target(input_ids=ids, output_hidden_states=True)
    for got, i in zip(feats, (3, 0, 2)):
        torch.testing.assert_close(got, out.hidden_states[i])
    assert not any(layer._forward_pre_hooks for layer in target.model.layers)  # nothing left behind
    assert default_feature_layers(32) == (2, 16, 29)


def test_ttt_mask_sees_the_committed_prefix_and_its_own_chain():
    v = ttt_visibility(4, 2).int()  # query q, blocks [step 0 | step 1 | step 2]
    assert v[3].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert v[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    assert ttt_visibility(3, 0).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.fixture(scope="module", params=[("llama", 64), ("qwen2", VOCAB), ("qwen3", 48)], ids=str)
def saved_head(request, tmp_path_factory):
    arch, draft_vocab = request.param
    target = deep_target(arch)
    folder = tmp_path_factory.mktemp(f"eagle3_{arch}")
    trained_head(target, draft_vocab).save(folder)
    return target, folder, draft_vocab


def test_published_layout_round_trips(saved_head):
    target, folder, draft_vocab = saved_head
    keys = set(load_file(str(folder / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight"} <= keys  # fmt: skip
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["draft_vocab_size"] == draft_vocab and len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == 3
    head = load_eagle3_head(folder, target)
    assert head.midlayer.self_attn.q_proj.weight.shape[1] == 2 * target.config.hidden_size
    assert int(head.t2d.sum()) == draft_vocab and head.target_ids().tolist() == sorted(set(head.target_ids().tolist()))


def test_eagle3_greedy_is_lossless(saved_head):
    target, folder, _ = saved_head
    head = load_eagle3_head(folder, target)
    deepest = 0
    for prompt in PROMPTS + [[5, 5, 5, 5]]:
        res = Decoder(target, Eagle3Drafter(head, top_k=3, depth=4, total_tokens=10), max_new_tokens=NEW).generate(
            prompt
        )
        assert res.tokens == reference(target, prompt)
        assert res.summary.target_forwards == res.summary.steps + 1
        deepest = max([deepest] + [len(e.accepted_nodes) for e in res.events])
    assert deepest >= 2  # paths past depth 1 were accepted: the tree compaction and the d2t mapping both ran


def test_eagle3_catch_ups_after_long_plain_stretches_are_lossless(saved_head, monkeypatch):
    """Plain stretches longer than the head's context: the catch-up feeds their latest pairs after a gap in EAGLE-3's
    head cache (without read-outs before the ones hindsight reads); output stays the target's, hindsight is told."""
    from tests.test_lossless import Hindsight

    target, folder, _ = saved_head
    head = load_eagle3_head(folder, target)
    for prompt in PROMPTS:
        drafter = Eagle3Drafter(head, top_k=3, depth=4, total_tokens=10)
        drafter.head_context = 4
        monkeypatch.setattr("engine.drafters.eagle.HINDSIGHT_ROWS", 2)
        budget = Hindsight([0] * 6 + [2] + [0] * 7 + [1] + [0] * 5 + [3])
        res = Decoder(target, drafter, max_new_tokens=NEW, budget=budget).generate(prompt)
        assert res.tokens == reference(target, prompt)
        assert drafter.skipped[0] > max(0, len(prompt) - 5)  # a gap beyond the prompt's window
        assert len(budget.seen) >= 2 and all(len(matches) == 2 for _, matches in budget.seen)


def test_eagle3_batched_rows_are_lossless(saved_head):
    target, folder, _ = saved_head
    head = load_eagle3_head(folder, target)
    prompts = PROMPTS + [[5, 5, 5, 5]]
    res = batch_decoder(target, lambda: Eagle3Drafter(head, top_k=3, depth=3, total_tokens=8), max_new_tokens=16)
    for prompt, tokens in zip(prompts, res.generate_batch(prompts).tokens):
        assert tokens == reference(target, prompt)[:16]


def test_eagle3_drafts_a_batch_in_one_head_call_per_depth(saved_head):
    """Every row's tree, with its draft-vocabulary ids, is the one it drafts alone, from far fewer head calls."""
    from tests.test_batch import batched_and_alone

    target, folder, _ = saved_head
    head = load_eagle3_head(folder, target)
    make = lambda: Eagle3Drafter(head, top_k=3, depth=3, total_tokens=8)  # noqa: E731
    prompts = PROMPTS + [[5, 5, 5, 5]]
    batched, alone, batched_calls, alone_calls = batched_and_alone(target, make, prompts, draft_step(head))
    assert batched == alone and any(ids for row in batched.values() for _, _, ids in row)
    assert batched_calls * 2 < alone_calls, (batched_calls, alone_calls)


def test_eagle3_exact_sampling_matches_target():
    V = 12
    prompt = [3, 7, 1]
    target = deep_target("llama", vocab=V, sharpen=6.0)
    head = Eagle3Head.for_target(target, torch.tensor([0, 2, 3, 5, 7, 8, 11]))  # reduced vocabulary, random head
    drafter = Eagle3Drafter(head, top_k=3, depth=2, total_tokens=6)
    assert second_token_pvalue(target, drafter, prompt, new=4, drafted=2) > 1e-3


def test_broken_checkpoints_fail_with_one_clear_line(saved_head, tmp_path):
    target, folder, _ = saved_head
    state = load_file(str(folder / "model.safetensors"))
    (tmp_path / "no_d2t").mkdir()
    save_file({k: v for k, v in state.items() if k != "d2t"}, str(tmp_path / "no_d2t" / "model.safetensors"))
    (tmp_path / "no_d2t" / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(GlanceError, match="no key d2t: not the EAGLE-3 layout") as err:
        load_eagle3_head(tmp_path / "no_d2t", target)
    assert "\n" not in str(err.value)
    (tmp_path / "wide_fc").mkdir()
    h = target.config.hidden_size
    save_file(state | {"fc.weight": torch.zeros(h, 2 * h)}, str(tmp_path / "wide_fc" / "model.safetensors"))
    (tmp_path / "wide_fc" / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(GlanceError, match=rf"fc.weight is \[{h}, {2 * h}\], the target needs \[{h}, {3 * h}\]"):
        load_eagle3_head(tmp_path / "wide_fc", target)
    with pytest.raises(GlanceError, match="not found"):
        load_eagle3_head(tmp_path / "nope", target)


def test_training_time_test_lowers_every_step_loss():
    target = deep_target("llama")
    for p in target.parameters():
        p.requires_grad_(False)
    batch = torch.randint(0, VOCAB, (4, 32))
    draft_ids = torch.arange(VOCAB)
    head = Eagle3Head.for_target(target, draft_ids)
    feats, logits = target_view(target, head.layer_ids, batch)
    before = ttt_loss(head, batch, feats, logits, draft_ids, steps=3)[1]
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(40):
        loss = ttt_loss(head, batch, feats, logits, draft_ids, steps=3)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = ttt_loss(head, batch, feats, logits, draft_ids, steps=3)[1]
    p = torch.softmax(logits[:, 1:].float(), -1)
    entropy = [float(-(p[:, s:] * p[:, s:].log()).sum(-1).mean()) for s in range(3)]  # the floor of each step's loss
    kl_before = [b - e for b, e in zip(before, entropy)]
    kl_after = [a - e for a, e in zip(after, entropy)]
    assert all(a < b / 2 for a, b in zip(kl_after, kl_before)), (kl_before, kl_after)
