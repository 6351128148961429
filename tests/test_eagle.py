"""EAGLE: lossless greedy and exact sampling with random heads (EAGLE-1 and EAGLE-2), the published checkpoint
layout, and training."""

import json

import pytest
import torch

from engine.decoding.loop import Decoder
from engine.drafters.eagle import EagleDrafter, head_mask
from engine.errors import GlanceError
from engine.heads.eagle import EagleHead, load_eagle_head
from engine.registry import traits
from engine.train.recipes.eagle import depth_accuracy, eagle_loss, target_view
from tests.conftest import ARCHS, tiny_model
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import second_token_pvalue


def random_head(target, seed=0):
    torch.manual_seed(seed)
    return EagleHead.for_target(target).eval()


def trained_head(target, steps=80):
    """A head fitted for a few steps on the target's own greedy continuations: it agrees often enough that
    multi-token paths get accepted."""
    torch.manual_seed(1)
    vocab = target.config.vocab_size
    with torch.no_grad():
        seqs = target.generate(
            torch.randint(0, vocab, (8, 4)), do_sample=False, max_new_tokens=44, min_new_tokens=44, pad_token_id=0
        )
    head = EagleHead.for_target(target)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    feats, logits = target_view(target, seqs)
    for _ in range(steps):
        loss = eagle_loss(head, seqs, feats, logits)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module", params=ARCHS)
def target_and_head(request):
    target = tiny_model(request.param, sharpen=4.0)
    return target, trained_head(target)


@pytest.mark.parametrize(
    "mode", [dict(dynamic=True), dict(dynamic=True, top_k=3, depth=3, total_tokens=8), dict(dynamic=False)]
)
def test_eagle_greedy_is_lossless(target_and_head, mode):
    target, head = target_and_head
    taus = []
    for prompt in PROMPTS + [[5, 5, 5, 5]]:
        res = Decoder(target, EagleDrafter(head, **mode), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt)
        assert res.summary.target_forwards == res.summary.steps + 1
        taus.append(res.summary.mean_accepted_length)
    assert max(taus) > 1.0  # some draft tokens were accepted, so the tree compaction ran


def test_eagle_exact_sampling_matches_target():
    V = 12
    prompt = [3, 7, 1]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    drafter = EagleDrafter(random_head(target), top_k=3, depth=2, total_tokens=6)
    assert second_token_pvalue(target, drafter, prompt, new=4, drafted=2) > 1e-3  # depth 1 took the rule


def test_checkpoint_round_trip_and_published_bin(tmp_path):
    target = tiny_model("llama")
    head = random_head(target)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    head.save(tmp_path / "safe")
    keys = set(head.state_dict()) - {k for k in head.state_dict() if k.startswith("rotary.")}
    assert {
        "fc.weight",
        "fc.bias",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.post_attention_layernorm.weight",
    } <= keys
    assert not any("input_layernorm" in k for k in keys)
    tok = torch.tensor([[1, 2, 3]])
    feats = torch.randn(1, 3, target.config.hidden_size)
    pos = torch.arange(3)[None]
    loaded = load_eagle_head(tmp_path / "safe", target)
    torch.testing.assert_close(loaded(tok, feats, pos), head(tok, feats, pos), rtol=3e-2, atol=3e-2)
    # the published .bin layout, with an embed_tokens copy as some checkpoints carry
    (tmp_path / "bin").mkdir()
    state = {k: v for k, v in head.state_dict().items() if k in keys}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "config.json").write_text(json.dumps(head.cfg))
    torch.testing.assert_close(load_eagle_head(tmp_path / "bin", target)(tok, feats, pos), head(tok, feats, pos))


def test_mismatched_head_fails_clearly(tmp_path):
    random_head(tiny_model("llama")).save(tmp_path)
    from transformers import LlamaConfig, LlamaForCausalLM

    narrow = LlamaForCausalLM(
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
        load_eagle_head(tmp_path, narrow)
    with pytest.raises(GlanceError, match="not found"):
        load_eagle_head(tmp_path / "nope", narrow)


def test_training_lowers_the_loss_on_a_fixed_batch():
    target = tiny_model("llama", sharpen=4.0)
    for p in target.parameters():
        p.requires_grad_(False)
    head = EagleHead.for_target(target)
    batch = torch.randint(0, 96, (4, 32))
    feats, logits = target_view(target, batch)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    _, reg0, cls0 = eagle_loss(head, batch, feats, logits, noise=0.0)
    for _ in range(40):
        loss = eagle_loss(head, batch, feats, logits)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, reg1, cls1 = eagle_loss(head, batch, feats, logits, noise=0.0)
    assert reg1 < 0.8 * reg0 and cls1 < cls0  # both the feature regression and the token loss fall
    acc = depth_accuracy(head.eval(), target, torch.randint(0, 96, (200,)), depths=3, seq_len=64, windows=2)
    assert [a["depth"] for a in acc] == [1, 2, 3] and all(0 <= a["top1"] <= 1 for a in acc)


def test_dynamic_tree_shape_and_head_mask(target_and_head):
    """The knobs mean SafeAILab/EAGLE's: `depth` expansions after the root's top-k (depth + 1 levels), and
    `total_tokens` verified tokens, the pending one included (total - 1 drafted nodes); parents come first; the
    head's draft mask equals brute force."""
    from engine.decoding.tree import node_depths

    target, head = target_and_head
    for top_k, depth, total in [(4, 4, 10), (6, 5, 20), (2, 6, 5), (3, 2, 40)]:
        drafter = EagleDrafter(head, top_k=top_k, depth=depth, total_tokens=total)
        assert drafter.settings() | {"levels": depth + 1, "draft_nodes": total - 1} == drafter.settings()
        sizes, deepest = [], 0
        for ev in Decoder(target, drafter, max_new_tokens=40).run([5, 6, 7]):
            if not hasattr(ev, "draft_parents") or ev.step == 0:
                continue
            sizes.append(len(ev.draft_tokens))
            deepest = max(deepest, max(node_depths(ev.draft_parents), default=0))
            assert all(-1 <= p < i for i, p in enumerate(ev.draft_parents))
        assert max(sizes) == min(total - 1, top_k + depth * top_k * top_k)  # every node the budget allows
        assert deepest <= depth + 1
        if total - 1 >= top_k * (depth + 1):  # room for a full chain of levels: the last level is reached
            assert deepest == depth + 1
    # the head's mask: rows see committed pairs, the listed ancestor slots and themselves, nothing else
    ancestors = [[], [0], [0, 1], [2]]
    expect = torch.zeros(4, 3 + 3 + 4, dtype=torch.bool)
    for r, anc in enumerate(ancestors):
        expect[r, :3] = True
        for a in anc:
            expect[r, 3 + a] = True
        expect[r, 6 + r] = True
    causal = torch.ones(3, 5 + 3, dtype=torch.bool).tril(5)  # a catch-up of 3 pairs after 5 committed ones
    columns = [[3 + a for a in anc] for anc in ancestors]  # the draft entries' slots sit after the 3 committed pairs
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # built in numpy, viewed as the dtype
        mask = head_mask({0: ([0, 1, 2], 4, columns)}, 1, 6, 4, dtype)[0, 0]
        assert mask.dtype == dtype and torch.equal(mask == 0, expect)
        assert torch.all(mask[~expect] == torch.finfo(dtype).min)
        run = head_mask({0: (list(range(5)), 3, None)}, 1, 5, 3, dtype)[0, 0]
        assert run.dtype == dtype and torch.equal(run == 0, causal)
        assert torch.all(run[~causal] == torch.finfo(dtype).min)


@pytest.mark.parametrize("mode", [dict(dynamic=True, top_k=3), dict(dynamic=False)])
def test_eagle_hindsight_is_what_depth_one_of_a_tree_would_have_had_accepted(target_and_head, mode, monkeypatch):
    """After plain steps the head catches up on the target's features; its candidates after each pair are depth 1 of
    a tree drafted there. Hindsight must say whether the target's next token was among them: checked against the
    head run teacher-forced over the whole sequence."""
    from tests.test_lossless import Hindsight

    target, head = target_and_head
    hits, spine_hits = [], []
    for prompt in PROMPTS + [[5, 5, 5, 5]]:
        budget = Hindsight([0] * 5 + [2] + [0] * 6 + [1] + [0] * 3 + [3])
        drafter = EagleDrafter(head, **mode)
        assert traits(drafter.name).hindsight_depth == 1
        res = Decoder(target, drafter, max_new_tokens=NEW, budget=budget).generate(prompt)
        seq = prompt + res.tokens
        assert res.tokens == reference(target, prompt)
        with torch.no_grad():
            feats = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]  # [1, L, H]
            out = head(torch.tensor([seq[1:]]), feats[:, :-1], torch.arange(len(seq) - 1)[None])  # (x_i+1, f_i)
            ranks = list(range(drafter.top_k)) if drafter.dynamic else drafter.first_ranks
            cands = head.logits(out)[0].topk(max(ranks) + 1, dim=-1).indices[:, ranks].tolist()  # [L - 1, kids]
        assert len(budget.seen) == 3  # the first drafted step too: over the tokens generated before it
        new, matches = budget.seen[0]  # every token so far (the prefill's, five plain steps') a pair came before
        assert new == 6 and len(matches) == min(new, len(prompt) + new - 2)
        for (new, matches), first in zip(budget.seen, budget.firsts):
            end = len(prompt) + new  # one past the pending token, the last one a caught-up pair predicted
            want = [seq[q] in cands[q - 2] for q in range(end - len(matches), end)]
            assert matches == want, (new, matches, want)
            assert first == [seq[q] == cands[q - 2][0] for q in range(end - len(matches), end)]  # the spine's
            spine_hits += first
            assert end - len(matches) >= len(prompt)  # generated tokens only
            hits += matches
    assert any(hits) and not all(hits)
    assert any(spine_hits) and sum(spine_hits) < sum(hits)  # the first choice alone tells apart from the others
    # reading the latest two pairs only (the others go into the head's cache without a read-out): the same guesses,
    # cut to the last two, and the same output
    short = Hindsight([0] * 5 + [2] + [0] * 6 + [1] + [0] * 3 + [3])
    drafter = EagleDrafter(head, **mode)
    monkeypatch.setattr("engine.drafters.eagle.HINDSIGHT_ROWS", 2)
    prompt = PROMPTS[-1] + [5, 5, 5, 5]
    full = Hindsight([0] * 5 + [2] + [0] * 6 + [1] + [0] * 3 + [3])
    want = Decoder(target, EagleDrafter(head, **mode), max_new_tokens=NEW, budget=full).generate(prompt).tokens
    assert Decoder(target, drafter, max_new_tokens=NEW, budget=short).generate(prompt).tokens == want
    assert short.seen == [(new, matches[-2:]) for new, matches in full.seen]
    assert short.firsts == [first[-2:] for first in full.firsts]


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_runs_first_draft_feeds_the_head_the_latest_prompt_pairs_at_their_positions(target_and_head, dynamic):
    """With a prompt longer than `head_context`, the head's cache takes the latest pairs only, at the positions they
    have in the text: every draft's depth-1 candidates are the head's over that window, teacher-forced with those
    positions (shifted ones would move every later pair's rotary offset against the cached ones), and decoding
    stays lossless, one row or a batch."""
    from engine.budget.draft_budget import FullBudget
    from tests.conftest import batch_decoder

    class Drafts(FullBudget):
        def __init__(self):
            self.seen = []  # (committed length when drafted, the draft)

        def observe_rows(self, cap, drafts, accepted, draft_s, verify_s, paths=None, timed=True):
            self.seen.append(drafts[0])
            self.accepted = getattr(self, "accepted", []) + [accepted[0]]

    target, head = target_and_head
    prompt = [(7 * i + 3) % 50 + 4 for i in range(30)]  # 30 tokens: with the first new one, 30 pairs, 29 prefilled
    want = reference(target, prompt)
    drafter = EagleDrafter(head, dynamic=dynamic)
    drafter.head_context = 8
    budget = Drafts()
    res = Decoder(target, drafter, max_new_tokens=NEW, budget=budget).generate(prompt)
    assert res.tokens == want
    skipped = len(prompt) - 1 - 8
    assert drafter.skipped[0] == skipped
    seq = prompt + res.tokens
    with torch.no_grad():
        feats = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]  # [1, L, H]
        window = torch.arange(skipped, len(seq) - 1)[None]
        out = head(torch.tensor([seq[skipped + 1 :]]), feats[:, skipped:-1], window)  # pairs (x_i+1, f_i), i >= skipped
        ranks = list(range(drafter.top_k)) if dynamic else drafter.first_ranks
        cands = head.logits(out)[0].topk(max(ranks) + 1, dim=-1).indices[:, ranks].tolist()  # [pairs, kids]
    committed, checked, deeper = len(prompt) + 1, 0, 0  # tokens known at the first draft: the prompt and its token
    for draft, got in zip(budget.seen, budget.accepted):
        root = [draft.tokens[i] for i in draft.children(-1)]
        assert set(root) <= set(cands[committed - 2 - skipped]), committed  # the root pair: the last token, f before
        checked += bool(root)
        kids = draft.children(draft.children(-1)[0]) if root else []
        if kids:  # depth 2 under the first child: the head's own predicted feature at the root, one position on
            row = committed - 2 - skipped
            with torch.no_grad():
                toks = torch.tensor([seq[skipped + 1 : committed] + [root[0]]])
                fed = torch.cat([feats[:, skipped : committed - 1], out[:, row : row + 1]], dim=1)
                grown = head(toks, fed, torch.arange(skipped, committed)[None])
                below = head.logits(grown)[0, -1].topk(max(ranks) + 1).indices[ranks].tolist()
            assert {draft.tokens[i] for i in kids} <= set(below), committed
            deeper += 1
        committed += got + 1
    assert checked >= 3 and deeper >= 1
    rows = batch_decoder(target, lambda: _windowed(head, dynamic), max_new_tokens=NEW).generate_batch(
        [prompt, PROMPTS[0]]
    )
    assert rows.tokens == [want, reference(target, PROMPTS[0])]


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_catch_up_after_a_long_plain_stretch_feeds_its_latest_pairs_at_their_positions(target_and_head, dynamic):
    """After more plain steps than `head_context`, the head takes the stretch's latest pairs only, after a gap in its
    cache: the next draft's depth-1 candidates are the head's teacher-forced over the pairs cached before the stretch
    and the stretch's latest, each at its text position, and decoding stays lossless."""
    from engine.budget.draft_budget import FullBudget

    class Scripted(FullBudget):
        def __init__(self):
            self.caps, self.drafts, self.committed = iter([None] + [0] * 9 + [None] * 4), [], 0

        def choose(self, left=None):
            return next(self.caps, None)

        def observe_rows(self, cap, drafts, accepted, draft_s, verify_s, paths=None, timed=True):
            self.drafts.append((self.committed, drafts[0]))
            self.committed += accepted[0] + 1

    target, head = target_and_head
    prompt = PROMPTS[1]
    drafter = EagleDrafter(head, dynamic=dynamic)
    drafter.head_context = 4
    budget = Scripted()
    feeds, call = [], drafter._head_call  # every read-out call's outputs, and where each step's calls began

    def recorded(rows, readout=True):
        out = call(rows, readout)
        if readout:
            feeds.append(out[0])
        return out

    drafter._head_call = recorded
    marks = []
    choose = budget.choose
    budget.choose = lambda left=None: marks.append(len(feeds)) or choose(left)
    res = Decoder(target, drafter, max_new_tokens=NEW, budget=budget).generate(prompt)
    assert res.tokens == reference(target, prompt)
    seq = prompt + res.tokens
    window = max(0, len(prompt) - 1 - 4)  # the prompt's pairs (x_i+1, f_i) the first draft left out: i < window
    tokens = len(prompt) + 1 + budget.drafts[10][0]  # tokens committed at the draft after the stretch
    kept = list(range(window, len(prompt))) + list(range(tokens - 1 - 4, tokens - 1))  # i of the pairs the head holds
    assert drafter.skipped[0] == window + (tokens - 1 - len(prompt) - 4) > window  # the prompt's and the stretch's
    with torch.no_grad():
        feats = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]  # [1, L, H]
        out = head(torch.tensor([[seq[i + 1] for i in kept]]), feats[:, kept], torch.tensor([kept]))
        ranks = list(range(drafter.top_k)) if dynamic else drafter.first_ranks
        cands = head.logits(out)[0, -1].topk(max(ranks) + 1).indices[ranks].tolist()
    draft = budget.drafts[10][1]
    assert {draft.tokens[i] for i in draft.children(-1)} <= set(cands)
    root = feeds[marks[10]][0][-1]  # the catch-up's predicted feature after the pending token: the same numbers
    assert torch.allclose(root, out[0, -1], atol=1e-5), (root - out[0, -1]).abs().max()


def _windowed(head, dynamic):
    drafter = EagleDrafter(head, dynamic=dynamic)
    drafter.head_context = 8
    return drafter
