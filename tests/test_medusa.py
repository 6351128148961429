"""Medusa: lossless greedy and exact sampling with random heads, the published checkpoint layout, training."""

import json

import pytest
import torch

from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.base import DecodeState
from engine.drafters.medusa import MedusaDrafter, parse_tree
from engine.errors import GlanceError
from engine.heads.medusa import MedusaHeads, load_medusa_heads
from engine.train.recipes.medusa import medusa_loss, target_features
from tests.conftest import ARCHS, tiny_model
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import second_token_pvalue


def random_heads(target, k=4, layers=1, shared=False, seed=0, scale=0.5):
    torch.manual_seed(seed)
    heads = MedusaHeads.for_target(target, k, layers, shared_lm_head=shared)
    with torch.no_grad():
        for name, p in heads.named_parameters():
            if "linear" in name:
                p.add_(torch.randn_like(p) * scale / p.shape[-1] ** 0.5)
    return heads.eval()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["cpu_16", "chain_4", "mc_sim_7b_63"])
def test_medusa_greedy_is_lossless(arch, tree):
    target = tiny_model(arch, sharpen=4.0)
    heads = random_heads(target, shared=(arch == "gpt2"))
    for prompt in PROMPTS:
        res = Decoder(target, MedusaDrafter(heads, tree), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt)
        assert res.summary.target_forwards == res.summary.steps + 1  # one target forward per step


def test_heads_that_copy_the_lm_head_get_tokens_accepted():
    """Zero-initialised blocks make every head predict the target's next token: on a repetitive continuation
    the tree then gets accepted tokens, exercising compaction of a branching tree."""
    target = tiny_model("llama", sharpen=4.0)
    heads = MedusaHeads.for_target(target, 4, 1).eval()
    res = Decoder(target, MedusaDrafter(heads, "cpu_16"), max_new_tokens=40).generate([5, 5, 5, 5])
    ref = target.generate(
        torch.tensor([[5, 5, 5, 5]]), do_sample=False, max_new_tokens=40, min_new_tokens=40, pad_token_id=0
    )[0, 4:].tolist()
    assert res.tokens == ref
    assert res.summary.mean_accepted_length > 1.0


def test_shared_lm_head_is_read_once_per_proposal():
    """Heads that share the target's LM head project all their states in one call: the projection's weights are
    the largest read of a proposal, and reading them once per head cost three times as much on a CPU."""
    target = tiny_model("llama")
    heads = random_heads(target, k=4, shared=True)
    calls = []
    hook = heads.shared_lm_head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    try:
        hidden = torch.randn(3, target.config.hidden_size)  # [rows, H]
        logits = heads(hidden)
    finally:
        hook.remove()
    assert logits.shape == (4, 3, target.config.vocab_size)
    assert calls == [torch.Size([4, 3, target.config.hidden_size])]
    expected = torch.stack([heads.shared_lm_head(head(hidden)) for head in heads])
    torch.testing.assert_close(logits, expected)


def test_a_draft_one_token_deep_reads_head_0_alone():
    """A budget that caps the draft at one token needs head 0's candidates only: the proposal must not run the other
    heads (three quarters of the read-out), must draft what reading every head would, and stay lossless."""
    from engine.budget.draft_budget import FullBudget

    class OneDeep(FullBudget):
        name = "one-deep"

        def choose(self, left=None):
            return 1

    target = tiny_model("llama", sharpen=4.0)
    heads = random_heads(target, shared=True)
    drafter = MedusaDrafter(heads, "cpu_16")
    every_head = heads.logits
    heads.logits = lambda hidden: pytest.fail("a one-deep draft read every head")
    try:
        res = Decoder(target, drafter, max_new_tokens=NEW, budget=OneDeep()).generate(PROMPTS[1])
        assert res.tokens == reference(target, PROMPTS[1])
        assert res.summary.steps < NEW - 1  # drafts were made and accepted, one token deep
        drafter.unchecked[0] = []
        state = DecodeState([1], 1, SamplingConfig(), torch.Generator())
        (one,) = drafter.propose([state], [1])
    finally:
        heads.logits = every_head
    full = drafter.tree_from(heads(drafter.hidden[0][None])[:, 0].topk(drafter.topk, dim=-1).indices.tolist(), 1)
    assert one.tokens == full.tokens and one.parents == full.parents == [-1] * len(drafter.first_ranks)


def test_medusa_exact_sampling_matches_target():
    V = 12
    prompt = [5, 6, 5, 6]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    heads = random_heads(target, k=3, scale=2.0)
    drafter = MedusaDrafter(heads, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
    assert second_token_pvalue(target, drafter, prompt, new=3, drafted=3) > 1e-3  # three depth-1 candidates


def test_typical_acceptance_is_labelled_approximate():
    target = tiny_model("llama", sharpen=4.0)
    heads = random_heads(target)
    sampled = Decoder(
        target, MedusaDrafter(heads, acceptance="typical"), SamplingConfig(temperature=0.7), max_new_tokens=12
    ).generate(PROMPTS[0])
    assert sampled.summary.approximate and len(sampled.tokens) == 12
    greedy = Decoder(target, MedusaDrafter(heads, acceptance="typical"), max_new_tokens=NEW).generate(PROMPTS[0])
    assert not greedy.summary.approximate  # at temperature 0 typical acceptance is greedy, hence exact
    assert greedy.tokens == reference(target, PROMPTS[0])


@pytest.mark.parametrize("shared", [False, True])
def test_checkpoint_round_trip(tmp_path, shared):
    target = tiny_model("llama")
    heads = random_heads(target, k=3, layers=2, shared=shared)
    heads.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 2
    loaded = load_medusa_heads(tmp_path, target)
    h = torch.randn(5, target.config.hidden_size)
    torch.testing.assert_close(loaded(h), heads(h), rtol=2e-2, atol=2e-2)  # saved in bfloat16


def test_published_pt_layout_loads(tmp_path):
    target = tiny_model("llama")
    heads = random_heads(target, k=2, layers=1)
    state = heads.state_dict()
    assert set(state) == {
        "0.0.linear.weight",
        "0.0.linear.bias",
        "0.1.weight",
        "1.0.linear.weight",
        "1.0.linear.bias",
        "1.1.weight",
    }
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(
        json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"})
    )
    loaded = load_medusa_heads(tmp_path, target)
    h = torch.randn(3, target.config.hidden_size)
    torch.testing.assert_close(loaded(h), heads(h))


def test_mismatched_heads_fail_clearly(tmp_path):
    small = tiny_model("llama")
    random_heads(small, k=2).save(tmp_path)
    other = tiny_model("llama", vocab=120)
    with pytest.raises(GlanceError, match="vocabulary has 120"):
        load_medusa_heads(tmp_path, other)
    from transformers import LlamaConfig, LlamaForCausalLM

    wide = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    with pytest.raises(GlanceError, match="hidden size 64, the target has 32"):
        load_medusa_heads(tmp_path, wide)
    with pytest.raises(GlanceError, match="not found"):
        load_medusa_heads(tmp_path / "nope", small)
    with pytest.raises(GlanceError, match="2 heads"):  # a tree the user spelled out: 4 deep, 2 heads
        MedusaDrafter(load_medusa_heads(tmp_path, small), "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]")
    trimmed = MedusaDrafter(load_medusa_heads(tmp_path, small), "chain_4")  # a named preset adapts instead
    assert trimmed.paths == [(0,), (0, 0)] and "trimmed to 2 heads" in trimmed.settings()["tree"]


def test_tree_parsing():
    assert parse_tree("[[0], [0, 0], [1]]") == [(0,), (1,), (0, 0)]
    with pytest.raises(GlanceError, match="no parent"):
        parse_tree("[[0, 0]]")
    with pytest.raises(GlanceError, match="unknown Medusa tree"):
        parse_tree("nonsense")


def test_training_lowers_the_loss_on_a_fixed_batch():
    target = tiny_model("llama", sharpen=4.0)
    for p in target.parameters():
        p.requires_grad_(False)
    heads = MedusaHeads.for_target(target, 3, 1)
    batch = torch.randint(0, 96, (4, 32))
    hidden, greedy = target_features(target, batch)
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    first, _ = medusa_loss(heads, hidden, greedy)
    for _ in range(30):
        loss, _ = medusa_loss(heads, hidden, greedy)
        opt.zero_grad()
        loss.backward()
        opt.step()
    last, _ = medusa_loss(heads, hidden, greedy)
    assert last.item() < 0.8 * first.item()


def test_eager_attention_reads_the_tree_mask():
    """Eager attention adds the mask to the scores: the float mask must work there too."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import tiny_config

    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="eager").eval()
    heads = random_heads(target)
    for prompt in PROMPTS:
        res = Decoder(target, MedusaDrafter(heads, "mc_sim_7b_63"), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt)


def test_plain_steps_tell_the_budget_what_head_0_would_have_guessed(monkeypatch):
    """Under a draft budget, the plain steps since the last draft are checked when a step drafts again: head 0 on each
    one's hidden state against the token that followed (depth 1 only), as the heads would have drafted there."""
    from engine.budget.draft_budget import FullBudget

    told = []

    class PlainThenDraft(FullBudget):
        name = "plain-then-draft"

        def __init__(self):
            self.steps = 0

        def choose(self, left=None):
            self.steps += 1
            return 0 if self.steps <= 12 else None  # twelve plain steps, then full drafts

        def hindsight(self, matches, first=None, depth=None):
            if matches:
                told.append((list(matches), depth, first))

    target = tiny_model("llama", sharpen=4.0)
    heads = random_heads(target, scale=0.5)  # near copies of the LM head: right where the text repeats
    drafter = MedusaDrafter(heads, "cpu_16")
    prompt = [5, 6, 5, 6]
    res = Decoder(target, drafter, max_new_tokens=NEW, budget=PlainThenDraft()).generate(prompt)
    assert res.tokens == reference(target, prompt)
    assert len(told) == 1 and told[0][1] == 1
    # the same guesses from one forward over the whole text: the hidden state after each plain step's token
    tokens = prompt + res.tokens
    with torch.no_grad():
        hidden = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]  # [T, H]
        top = heads.first_logits(hidden).topk(3, dim=-1).indices.tolist()  # cpu_16's depth 1: head 0's top 3
    first = len(prompt)  # the first plain step read the first new token: its hidden state guesses two ahead
    expected = [tokens[i + 2] in top[i] for i in range(first, first + 11)]  # the twelfth's guess was not known yet
    assert told[0][0] == expected
    assert 0 < sum(expected) < len(expected)  # the test tells hits from misses
    firsts = [tokens[i + 2] == top[i][0] for i in range(first, first + 11)]  # the greedy spine's: head 0's top 1
    assert told[0][2] == firsts and sum(firsts) < sum(expected)  # fewer than the tree's: the ranks below tell apart
    told.clear()  # reading the latest three plain steps only: the same guesses, cut to the last three
    monkeypatch.setattr("engine.drafters.medusa.HINDSIGHT_ROWS", 3)
    assert Decoder(target, drafter, max_new_tokens=NEW, budget=PlainThenDraft()).generate(prompt).tokens == res.tokens
    assert told == [(expected[-3:], 1, firsts[-3:])]


def test_heads_sharing_the_lm_head_train_over_their_draft_vocabulary():
    """With a draft vocabulary, the loss is cross-entropy over those rows only; labels outside it are skipped (they
    cannot be drafted), and training on it still lowers the loss."""
    target = tiny_model("llama", sharpen=4.0)
    for p in target.parameters():
        p.requires_grad_(False)
    heads = MedusaHeads.for_target(target, 2, 1, shared_lm_head=True)
    batch = torch.randint(0, 96, (4, 32))
    hidden, greedy = target_features(target, batch)
    ids = greedy.unique()[::2]  # half the labels fall outside
    heads.set_draft_vocab(ids)
    first, _ = medusa_loss(heads, hidden, greedy)
    logits = heads(hidden)[0, :, :-1]  # head 0 over the draft vocabulary
    label = greedy[:, 1:]
    inside = torch.isin(label, ids)
    want = torch.nn.functional.cross_entropy(logits[inside].float(), torch.searchsorted(ids, label[inside]))
    _, per_head = medusa_loss(heads, hidden, greedy)
    assert per_head[0] == pytest.approx(want.item(), rel=1e-5)
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    for _ in range(30):
        loss, _ = medusa_loss(heads, hidden, greedy)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert medusa_loss(heads, hidden, greedy)[0].item() < 0.8 * first.item()
