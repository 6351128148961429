"""Lookahead's window budget: a window step or a plain step, whichever this run measured to pay more; exact either
way."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.budget.cost_aware import CostAwareBudget, FullBudget
from engine.budget.window import MAX_BACKOFF, PROBE_GAP, PROBE_HORIZON, PROBE_STEPS, RUN_START, STAY, WindowBudget
from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.decoding.tree import Draft
from engine.drafters.base import DecodeState
from engine.drafters.lookahead import LookaheadDrafter
from engine.models.loading import BUNDLED_TARGET
from tests.conftest import PARALLEL

# a window step that verified one pooled token beside a three-token window
WINDOW = Draft([7], [-1], side_tokens=[1, 2, 3], side_offsets=[1, 2, 3], side_visible=torch.eye(3, dtype=torch.bool))


def run(budget: WindowBudget, steps: int, window_s: float, plain_s: float, accepted: int, left: int = 1000):
    """Drive `steps` steps: each window step takes `window_s` and gets `accepted` draft tokens, each plain step
    `plain_s`. Returns the caps chosen."""
    caps = []
    for i in range(steps):
        cap = budget.choose(left - i)
        caps.append(cap)
        if cap is None:
            budget.observe(cap, WINDOW, accepted, 0.0, window_s)
        else:
            budget.observe(cap, Draft(), 0, 0.0, plain_s)
    return caps


def fresh(width: int = 5) -> WindowBudget:
    """A run's budget as the decoder starts it: no run before, the target's forwards timed at 1 and 5 tokens."""
    budget = WindowBudget(width=lambda: width)
    budget.reset({"plain": []})
    budget.price_forwards(lambda widths: {1: 0.010, width: 0.013})
    return budget


@pytest.fixture(scope="module")
def bundled():
    torch.set_num_threads(1 if PARALLEL else 2)  # another worker uses the other core
    target = AutoModelForCausalLM.from_pretrained(BUNDLED_TARGET, dtype=torch.float32).eval()
    yield target, AutoTokenizer.from_pretrained(BUNDLED_TARGET)
    torch.set_num_threads(1)


def test_a_window_that_pays_runs_every_step():
    caps = run(fresh(), 60, window_s=0.011, plain_s=0.010, accepted=1)  # 2 tokens for 1.1 plain steps
    assert caps == [None] * 60


def test_a_window_that_loses_gives_way_to_plain_steps_and_is_probed_less_and_less():
    caps = run(fresh(), 400, window_s=0.013, plain_s=0.010, accepted=0)  # 1 token for 1.3 plain steps
    assert caps[:RUN_START] == [None] * RUN_START  # a run starts by trying the window
    stretches, kind, length = [], caps[0], 0
    for cap in caps:
        if cap == kind:
            length += 1
        else:
            stretches.append((kind, length))
            kind, length = cap, 1
    plain = [n for k, n in stretches if k == 0]
    probes = [n for k, n in stretches if k is None]
    assert plain[:4] == [PROBE_GAP, 2 * PROBE_GAP, 4 * PROBE_GAP, 8 * PROBE_GAP]  # backing off ...
    assert max(plain) == PROBE_GAP * 2**MAX_BACKOFF  # ... up to a bound
    assert probes[0] == RUN_START and all(n == PROBE_STEPS for n in probes[1:])
    assert caps.count(None) < 0.2 * len(caps)


def test_a_probe_that_finds_the_window_paying_again_keeps_it():
    budget = fresh()
    run(budget, RUN_START + PROBE_GAP, window_s=0.013, plain_s=0.010, accepted=0)  # loses, then plain
    caps = run(budget, 40, window_s=0.013, plain_s=0.010, accepted=3)  # the text turned repetitive
    assert caps[: PROBE_STEPS + STAY] == [None] * (PROBE_STEPS + STAY)  # a probe, then the window stays
    assert caps.count(0) == 0


def test_a_step_after_a_switch_is_not_timed():
    budget = fresh()
    budget.observe(None, WINDOW, 0, 0.0, 0.050)  # the run's first window step, after the prefill: cold
    budget.observe(None, WINDOW, 0, 0.0, 0.012)
    budget.observe(0, Draft(), 0, 0.0, 0.040)  # the plain step after a window step: cold
    budget.observe(0, Draft(), 0, 0.0, 0.010)
    assert budget.window_times == [0.012] and budget.plain_times == [0.010]


def test_no_probe_too_late_in_the_run():
    budget = fresh()
    run(budget, RUN_START + PROBE_GAP, window_s=0.013, plain_s=0.010, accepted=0)
    caps = run(budget, PROBE_HORIZON - 1, window_s=0.013, plain_s=0.010, accepted=3, left=PROBE_HORIZON - 1)
    assert caps == [0] * (PROBE_HORIZON - 1)


def test_nothing_to_price_a_plain_step_by_times_a_few():
    budget = WindowBudget(width=lambda: 5)
    budget.reset({"plain": []})  # no run before, no forward costs (a budget driven by hand)
    caps = run(budget, RUN_START + 3, window_s=0.013, plain_s=0.010, accepted=0)
    assert caps[RUN_START:] == [0, 0, 0] and budget.plain_times == [0.010, 0.010]


def test_without_a_plain_step_the_forward_costs_price_one():
    budget = fresh(width=5)
    caps = run(budget, RUN_START + 1, window_s=0.013, plain_s=0.010, accepted=0)
    assert budget.plain_times == [] and caps[-1] == 0  # 1 token at 13 ms against 1 at 10 ms: plain


def test_the_next_run_keeps_the_window_price_and_rates_its_own_text():
    memory = {"plain": []}
    first = WindowBudget(width=lambda: 5)
    first.reset(memory)
    first.price_forwards(lambda widths: {1: 0.010, 5: 0.013})
    run(first, 40, window_s=0.013, plain_s=0.010, accepted=0)  # text the window cannot guess
    first.finish()
    second = WindowBudget(width=lambda: 5)
    second.reset(memory)
    second.price_forwards(lambda widths: {1: 0.010, 5: 0.013})
    assert second.window_times == first.window_times and second.count == 0
    caps = run(second, 30, window_s=0.013, plain_s=0.010, accepted=1)  # repetitive text: the window pays
    assert caps == [None] * 30


def test_the_pools_hindsight_calls_a_probe_before_the_plain_stretch_ends():
    hits: list[int] = []
    budget = WindowBudget(width=lambda: 5, guessed=lambda: [hits.pop() for _ in range(len(hits))])
    budget.reset({"plain": []})
    budget.price_forwards(lambda widths: {1: 0.010, 5: 0.013})
    run(budget, RUN_START + 1, window_s=0.013, plain_s=0.010, accepted=0)  # the window lost: plain steps
    caps = []
    for _ in range(PROBE_GAP - 1):
        hits.append(2)  # every plain step's pooled n-gram would have got two tokens
        caps += run(budget, 1, window_s=0.013, plain_s=0.010, accepted=2)
    assert caps[0] == 0 and None in caps  # a probe well before PROBE_GAP plain steps


def test_plain_steps_score_what_the_pool_would_have_guessed():
    drafter = LookaheadDrafter(window=1, ngram=3, guesses=2)
    state = DecodeState([5, 6, 7, 5], 4, SamplingConfig(), torch.Generator())
    drafter.begin(0, state)  # pools the prompt's 3-grams: 5 -> (6, 7), 6 -> (7, 5)
    drafter.rows[0].levels = [[1], [2]]  # a full window: the reference verifies pooled n-grams only then
    for token in (6, 9, 4):
        (draft,) = drafter.propose([state], [0])  # a plain step
        assert len(draft) == 0 and not draft.side_tokens
        state.tokens.append(token)
        drafter.update(0, state, draft, [])
    # 5 pending: (6, 7) against 6, 9: one right; 6 pending: (7, 5) against 9: none; 9's guess is not due yet
    assert drafter.take_guessed() == [1, 0] and drafter.take_guessed() == []


class PlainFirst(WindowBudget):
    """A window budget that always rates plain steps best: the window runs only at probes, so the drafter switches
    between window steps and plain ones as often as a run allows."""

    def plain_rate(self) -> float:
        return float("inf")


def test_switching_between_window_and_plain_steps_is_exact(bundled, monkeypatch):
    target, tok = bundled
    drafter = LookaheadDrafter()
    gate = PlainFirst(width=drafter.row_tokens)
    monkeypatch.setattr(Decoder, "budget_for", lambda self, rows: gate if self.drafter is drafter else FullBudget())
    ids = tok("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n")["input_ids"]
    ref = Decoder(target, max_new_tokens=60).generate(ids).tokens
    out = Decoder(target, drafter, max_new_tokens=60, budget=CostAwareBudget()).generate(ids)
    assert out.tokens == ref
    steps = out.events[1:-1]  # the last step has nothing left to guess: plain whatever the budget says
    caps = [e.budget.depth_cap for e in steps]
    assert caps[:RUN_START] == [None] * RUN_START and 0 in caps[RUN_START:]
    assert None in caps[RUN_START + PROBE_GAP :]  # a probe after the plain stretch
    assert all((e.notes.window is not None) == (e.budget.depth_cap is None) for e in steps)  # plain: no window
    assert drafter.rows[0].fed == len(ids) + len(out.tokens)  # the pool took every committed token, plain steps too
