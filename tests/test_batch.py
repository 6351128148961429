"""Batched decoding: every row of every variant equals its own unbatched plain greedy decoding, with prompts of
different lengths, rows that advance by different amounts and rows that stop early."""

import pytest

from engine.batch import BatchDecoder, BatchResult
from engine.budget import WARMUP_STEPS, CostAwareBudget
from engine.drafters.eagle import EagleDrafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.medusa import MedusaDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.heads.readout import draft_step
from tests.conftest import perturbed_copy, tiny_model
from tests.test_eagle import random_head
from tests.test_lookahead import LOOPY
from tests.test_lossless import reference
from tests.test_medusa import random_heads

NEW = 16
PROMPTS = [[1, 2, 3], [17, 5, 60, 33, 8, 8, 41], [90], LOOPY, [4, 4, 4, 4], [50, 51], [7, 70, 7, 70, 7], [33] * 9]


def makers(target):
    draft = perturbed_copy(target, 0.3)
    heads = random_heads(target)
    head = random_head(target)
    return {
        "ar": None,
        "vanilla": lambda: VanillaDrafter(draft, gamma=3),
        "medusa": lambda: MedusaDrafter(heads, "cpu_16"),
        "eagle": lambda: EagleDrafter(head, top_k=3, depth=3, total_tokens=8),
        "lookahead": lambda: LookaheadDrafter(window=3, ngram=3, guesses=3),
    }


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def setup(request):
    target = tiny_model(request.param, seed=0, sharpen=4.0)
    refs = {tuple(p): reference(target, p)[:NEW] for p in PROMPTS}
    return target, makers(target), refs


@pytest.mark.parametrize("method", ["ar", "vanilla", "medusa", "eagle", "lookahead"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_every_row_is_lossless(setup, method, batch):
    target, make, refs = setup
    prompts = PROMPTS[:batch]
    res = BatchDecoder(target, make[method], max_new_tokens=NEW).generate(prompts)
    for prompt, tokens in zip(prompts, res.tokens):
        assert tokens == refs[tuple(prompt)], (method, prompt)
    if method == "ar":
        assert res.steps == [NEW - 1] * batch and res.mean_accepted_length == 1.0
    if method == "vanilla" and batch == 8:
        assert len(set(res.steps)) > 1  # rows advanced by different amounts


def test_rows_stop_at_their_own_eos(setup):
    target, make, refs = setup
    prompts = PROMPTS[:3]
    eos = refs[tuple(prompts[1])][4]  # row 1 stops after 5 tokens; the others run on unless they meet it too
    res = BatchDecoder(target, make["vanilla"], max_new_tokens=NEW, eos_token_ids=eos).generate(prompts)
    for prompt, tokens in zip(prompts, res.tokens):
        ref = refs[tuple(prompt)]
        expected = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert tokens == expected


def test_batched_plain_decoding_is_one_forward_per_token(setup):
    target, _, _ = setup
    res = BatchDecoder(target, None, max_new_tokens=NEW).generate([PROMPTS[0], PROMPTS[2]])
    assert res.forwards == NEW and res.new_tokens == 2 * NEW


@pytest.mark.parametrize("method", ["vanilla", "lookahead"])
def test_batched_rows_emit_step_events_like_single_decoding(setup, method):
    """The batch streams StepEvents per row; read through the engine's statistics they give each row's tokens, its
    step count, and (for every row) the same tau the single-prompt decoder reports for that prompt."""
    from engine.decoder import Decoder
    from engine.stats import RunStats

    target, make, _ = setup
    prompts = PROMPTS[:3]
    stats = [RunStats() for _ in prompts]
    result = None
    for item in BatchDecoder(target, make[method], max_new_tokens=NEW, variant=method).stream(prompts):
        if isinstance(item, tuple):
            row, event = item
            assert event.variant == method
            stats[row].add(event)
        else:
            result = item
    assert result is not None
    for b, prompt in enumerate(prompts):
        assert stats[b].tokens == result.tokens[b] and stats[b].steps == result.steps[b]
        single = Decoder(target, make[method](), max_new_tokens=NEW).generate(prompt).summary
        assert stats[b].tokens == single.token_ids and stats[b].tau == pytest.approx(single.mean_accepted_length)


def batched_and_alone(target, make, prompts, model):
    """Each row's drafts (tokens, parents, meta) and the calls of `model`, drafting batched and row by row."""
    from engine.drafters.base import RowByRow

    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))

    def drafts_of():
        out = {}
        for item in BatchDecoder(target, make, max_new_tokens=NEW).stream(prompts):
            if isinstance(item, BatchResult):
                break
            row, ev = item
            out.setdefault(row, []).append((ev.draft_tokens, ev.draft_parents, ev.extra.get("draft_ids")))
        return out

    try:
        batched = drafts_of()
        batched_calls, calls[:] = len(calls), []
        cls = type(make())
        own = cls.__dict__.get("batch_drafting")  # the class's own (batched) one, or None when it inherits it
        cls.batch_drafting = classmethod(lambda c, ds: RowByRow(ds))
        try:
            alone = drafts_of()
        finally:
            if own is None:
                del cls.batch_drafting
            else:
                cls.batch_drafting = own
    finally:
        hook.remove()
    return batched, alone, batched_calls, len(calls)


@pytest.mark.parametrize("method", ["vanilla", "medusa", "eagle"])
def test_batched_drafting_drafts_what_each_row_would_alone(setup, method):
    """Vanilla, Medusa and EAGLE batch their model calls across rows (one draft forward per depth, one heads call
    per step, one head forward per depth, for every row): each row's drafts equal the ones it makes drafting
    alone, with far fewer calls."""
    target, make, _ = setup
    model = getattr(make[method](), {"vanilla": "model", "medusa": "heads", "eagle": "head"}[method])
    if method == "eagle":  # drafting calls the head through its drafting step (head forward and read-out)
        model = draft_step(model)
    batched, alone, batched_calls, alone_calls = batched_and_alone(target, make[method], PROMPTS[:5], model)
    assert batched == alone
    assert batched_calls * 2 < alone_calls, (batched_calls, alone_calls)  # five rows: at least halved


@pytest.mark.parametrize("method", ["vanilla", "eagle"])
def test_the_cost_aware_budget_keeps_every_row_lossless(setup, method):
    """One depth cap per batch step, learned from the batch's own step times: only draft sizes change."""
    target, make, refs = setup
    budget = CostAwareBudget()
    res = BatchDecoder(target, make[method], max_new_tokens=NEW, budget=budget).generate(PROMPTS)
    for prompt, tokens in zip(PROMPTS, res.tokens):
        assert tokens == refs[tuple(prompt)], (method, prompt)
    assert budget.steps > WARMUP_STEPS and budget.max_depth > 0  # it ran, and saw drafts


def test_the_cost_aware_budget_fits_lookahead_windows_to_the_batch_and_stays_lossless(setup):
    """Under `auto`, a batch's lookahead rows shrink N, W and G until the batch's verifying forward carries at most
    BATCH_TOKENS tokens (4/5/4 at B = 4 carried 132 and ran 0.81x; 2/4/2, 52, 1.07x); full drafts keep the settings."""
    from engine.drafters.ngram_pool import BATCH_TOKENS

    target, _, refs = setup
    made = []

    def make():
        made.append(LookaheadDrafter())  # the defaults: 4/5/4, 33 tokens a row
        return made[-1]

    prompts = PROMPTS[:4]
    res = BatchDecoder(target, make, max_new_tokens=NEW, budget=CostAwareBudget()).generate(prompts)
    assert res.tokens == [refs[tuple(p)] for p in prompts]
    assert all(4 * d.row_tokens() <= BATCH_TOKENS for d in made)
    assert (made[0].window, made[0].ngram, made[0].guesses) == (2, 4, 3)
    made.clear()
    BatchDecoder(target, make, max_new_tokens=NEW).generate(prompts)
    assert (made[0].window, made[0].ngram, made[0].guesses) == (4, 5, 4)
