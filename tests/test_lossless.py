"""Greedy output of every method equals transformers' greedy generate, token for token, in float32."""

import threading

import pytest
import torch

from engine.budget.draft_budget import FullBudget
from engine.decoding.loop import Decoder
from engine.drafters.vanilla import VanillaDrafter
from tests.conftest import ARCHS, perturbed_copy, tiny_model

PROMPTS = [[1, 2, 3], [17, 5, 60, 33, 8, 8, 41], [90]]
NEW = 24


def reference(model, prompt):
    out = model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    arch = request.param
    target = tiny_model(arch, seed=0, sharpen=4.0)
    drafts = {
        "perturbed": perturbed_copy(target, 0.3),  # agrees often, not always
        "unrelated": tiny_model(arch, seed=7, sharpen=4.0),  # rarely agrees
    }
    refs = [reference(target, p) for p in PROMPTS]
    return arch, target, drafts, refs


def test_autoregressive_is_plain_greedy(setup):
    _, target, _, refs = setup
    for prompt, ref in zip(PROMPTS, refs):
        res = Decoder(target, max_new_tokens=NEW).generate(prompt)
        assert res.tokens == ref
        assert res.summary.mean_accepted_length == 1.0
        assert res.summary.target_forwards == NEW  # prefill emits one, each step one more


@pytest.mark.parametrize("draft_kind", ["perturbed", "unrelated"])
@pytest.mark.parametrize("gamma,adaptive", [(1, False), (4, False), (2, True)])
def test_vanilla_is_lossless(setup, draft_kind, gamma, adaptive):
    _, target, drafts, refs = setup
    taus = []
    for prompt, ref in zip(PROMPTS, refs):
        drafter = VanillaDrafter(drafts[draft_kind], gamma=gamma, adaptive=adaptive)
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(prompt)
        assert res.tokens == ref, (prompt, res.tokens, ref)
        assert sum(len(e.tokens) for e in res.events) == NEW
        taus.append(res.summary.mean_accepted_length)
    if draft_kind == "perturbed":
        assert max(taus) > 1.0  # the draft did get tokens accepted, so the speculative path was exercised


def test_identical_draft_accepts_everything(setup):
    _, target, _, refs = setup
    res = Decoder(target, VanillaDrafter(target, gamma=4), max_new_tokens=NEW).generate(PROMPTS[0])
    assert res.tokens == refs[0]
    assert res.summary.acceptance_rate == 1.0
    # 23 tokens after prefill, 5 per step: steps of 5,5,5,5,3
    assert [len(e.tokens) for e in res.events[1:]] == [5, 5, 5, 5, 3]


class Hindsight(FullBudget):
    """Plain steps with a drafted one now and then; records each hindsight with the committed length it came at."""

    name = "scripted"

    def __init__(self, caps: list[int]) -> None:
        self.caps, self.length, self.seen, self.firsts = iter(caps), 0, [], []

    def choose(self, left: int | None = None) -> int | None:
        self.length = NEW - 1 - left  # new tokens so far (the loop passes what is left after the pending one)
        return next(self.caps, 0)

    def hindsight(self, matches: list[bool], first: list[bool] | None = None, depth: int | None = None) -> None:
        if matches:
            self.seen.append((self.length, matches))
            self.firsts.append(first)


def test_vanilla_hindsight_is_what_a_greedy_chain_would_have_had_accepted(setup, monkeypatch):
    """After plain steps the draft catches up on the target's tokens; its guess after each must be what a greedy
    chain drafted there would have proposed: the draft's own teacher-forced argmax, compared with the next token."""
    _, target, drafts, refs = setup
    prompt, ref = PROMPTS[1], refs[1]
    budget = Hindsight([0] * 5 + [2] + [0] * 6 + [1] + [0] * 3 + [3])
    res = Decoder(target, VanillaDrafter(drafts["perturbed"], gamma=3), max_new_tokens=NEW, budget=budget).generate(
        prompt
    )
    assert res.tokens == ref
    seq = prompt + ref
    with torch.no_grad():
        guess = drafts["perturbed"](torch.tensor([seq])).logits[0].argmax(-1).tolist()  # [len(seq)]: after each
    assert len(budget.seen) == 3 and len(budget.seen[0][1]) == 6  # the first: every token after the prompt's last
    for new, matches in budget.seen:
        end = len(prompt) + new  # the pending token's position: the draft's own first guess comes after it
        want = [guess[p - 1] == seq[p] for p in range(end - len(matches), end)]
        assert matches == want, (new, matches, want)
        assert end - len(matches) >= len(prompt)  # generated tokens only
    assert budget.firsts == [None] * 3  # a chain: its guesses are its spine's
    # reading the latest two positions only: the same guesses, cut to the last two
    short = Hindsight([0] * 5 + [2] + [0] * 6 + [1] + [0] * 3 + [3])
    drafter = VanillaDrafter(drafts["perturbed"], gamma=3)
    monkeypatch.setattr("engine.drafters.vanilla.HINDSIGHT_ROWS", 2)
    assert Decoder(target, drafter, max_new_tokens=NEW, budget=short).generate(prompt).tokens == ref
    assert short.seen == [(new, matches[-2:]) for new, matches in budget.seen]


def test_vanilla_catch_ups_feed_the_draft_model_the_latest_tokens_at_their_positions(setup):
    """A catch-up longer than the draft's `context` (the prompt, or a stretch of plain steps) feeds its latest tokens
    only, at their text positions: the draft's logits after the stretch equal the draft model's over the tokens its
    cache holds, teacher-forced at those positions; output stays the target's."""
    _, target, drafts, refs = setup
    prompt, ref = PROMPTS[1], refs[1]  # 7 tokens: with the first new one, 8 at the first draft, 4 left out
    draft_model = drafts["perturbed"]
    drafter = VanillaDrafter(draft_model, gamma=3)
    drafter.context = 4
    logits, step = [], drafter._forward
    budget = Hindsight([3] + [0] * 9 + [3] * 3)
    drafter._forward = lambda *args, step=step: (lambda out: logits.append(out[0][0]) or out)(step(*args))
    res = Decoder(target, drafter, max_new_tokens=NEW, budget=budget).generate(prompt)
    assert res.tokens == ref
    seq = prompt + res.tokens
    cached = len(prompt) + 1 + min(len(res.events[1].accepted_nodes), 2)  # tokens 4.. of these before the stretch
    now = len(prompt) + sum(len(e.tokens) for e in res.events[:11])  # tokens committed at the draft after it
    kept = list(range(4, cached)) + list(range(now - 4, now))
    assert drafter.skipped[0] == 4 + (now - 4 - cached) > 4
    with torch.no_grad():
        out = draft_model(torch.tensor([[seq[k] for k in kept]]), position_ids=torch.tensor([kept])).logits[0, -1]
    catch_up = logits[3]  # the first draft's three calls (its catch-up and two drafted tokens), then this one
    assert torch.allclose(catch_up.float(), out.float(), atol=1e-4), (catch_up - out).abs().max()


def test_stops_at_eos():
    target = tiny_model("llama", sharpen=4.0)
    ref = reference(target, PROMPTS[1])
    eos = ref[5]
    first = ref.index(eos)
    res = Decoder(
        target, VanillaDrafter(perturbed_copy(target, 0.3), gamma=4), max_new_tokens=NEW, eos_token_ids=[eos]
    ).generate(PROMPTS[1])
    assert res.tokens == ref[: first + 1]
    assert res.summary.stop_reason == "eos"


def test_cancel_between_steps_keeps_partial_output():
    target = tiny_model("llama", sharpen=4.0)
    cancel = threading.Event()
    stream = Decoder(target, max_new_tokens=NEW).run(PROMPTS[0], cancel)
    seen = [next(stream), next(stream), next(stream)]
    cancel.set()
    rest = list(stream)
    assert len(rest) == 1 and rest[0].stop_reason == "cancelled"
    assert rest[0].token_ids == [t for e in seen for t in e.tokens]
    assert rest[0].token_ids == reference(target, PROMPTS[0])[:3]


@pytest.mark.parametrize("confidence", [0.3, 0.7])
def test_vanilla_confidence_stop_is_lossless_and_shortens_chains(setup, confidence):
    _, target, drafts, refs = setup
    lengths = []
    for prompt, ref in zip(PROMPTS, refs):
        drafter = VanillaDrafter(drafts["perturbed"], gamma=6, confidence=confidence)
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(prompt)
        assert res.tokens == ref
        lengths += [len(e.draft_tokens) for e in res.events[1:]]
    assert min(lengths) < 6  # the draft stopped early on doubtful tokens


def test_events_without_details_carry_no_probabilities_and_the_same_tokens():
    from engine.decoding.loop import Decoder
    from tests.conftest import tiny_model

    target = tiny_model("llama")
    full = Decoder(target, max_new_tokens=8).generate([1, 2, 3])
    lean = Decoder(target, max_new_tokens=8, details=False).generate([1, 2, 3])
    assert lean.tokens == full.tokens
    assert all(e.target_probs == [] and e.target_top == [] for e in lean.events)
    assert all(len(e.target_probs) == len(e.tokens) for e in full.events)


def test_top_tokens_are_kept_for_the_rows_that_emitted_a_token():
    """Tooltips and the inspector read the target's top tokens at the rows that emitted a token; the other rows of a
    wide tree are not softmaxed (that was most of the per-step cost). Greedy: each emitted token is its row's top."""
    from engine.decoding.loop import Decoder
    from engine.drafters.lookahead import LookaheadDrafter
    from tests.conftest import tiny_model

    target = tiny_model("llama", seed=0, sharpen=4.0)
    loopy = [5, 9, 14, 5, 9, 14, 22, 5, 9, 31, 14, 22, 5]
    res = Decoder(target, LookaheadDrafter(4, 3, 4), max_new_tokens=NEW).generate(loopy)
    wide = [e for e in res.events[1:] if len(e.draft_tokens) > len(e.accepted_nodes)]
    assert wide  # steps with rejected nodes: rows that emitted nothing
    for e in res.events[1:]:
        rows = [0] + [a + 1 for a in e.accepted_nodes]
        assert [r for r, top in enumerate(e.target_top) if top] == rows[: len(e.tokens)]
        for r, tok, p in zip(rows, e.tokens, e.target_probs):
            assert e.target_top[r][0][0] == tok and abs(e.target_top[r][0][1] - p) < 1e-6
