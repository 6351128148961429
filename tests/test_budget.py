"""The draft budget's behaviour, on simulated steps with fake forward costs: plain steps where drafting loses, deep
drafts where verifying is nearly free, recovery when the text turns novel and back, sane choices at every batch size,
and the same choices from the same inputs. The loop's lossless runs under the budget are in test_batch.py and
test_bundled.py."""

import random

import pytest

from engine.budget.draft_budget import PRICE_WIDTHS, DraftBudget, FullBudget, make_budget
from engine.decoding.tree import Draft
from engine.errors import GlanceError

DEPTH = 5  # the simulated drafter's full chain


def linear_costs(per_token: float, rows: int = 1):
    """A forward of w tokens a row over `rows` rows: a fixed cost plus `per_token` of it per token and row."""
    return lambda widths: {w: 0.010 * (1.0 + per_token * (w * rows - 1)) for w in widths}


def run(budget, steps: int, accept: float, costs, rows: int = 1, seed: int = 0, draft_s: float = 0.0005):
    """Simulate `steps` steps of a chain drafter whose every token is accepted with probability `accept`; each step
    takes the fake forward's seconds at its width plus `draft_s` a depth. Returns the caps chosen."""
    rng = random.Random(seed)
    table = costs(list(range(1, 64)))
    caps = []
    for _ in range(steps):
        cap = budget.choose(100)
        caps.append(cap)
        depth = DEPTH if cap is None else min(cap, DEPTH)
        drafts, got = [], []
        for _ in range(rows):
            n = 0
            while n < depth and rng.random() < accept:
                n += 1
            drafts.append(Draft.chain(list(range(depth))))
            got.append(n)
        budget.observe_rows(cap, drafts, got, draft_s * depth, table[1 + depth], [list(range(n)) for n in got])
    return caps


def drafted_share(caps) -> float:
    return sum(c != 0 for c in caps) / len(caps)


def fresh(costs) -> DraftBudget:
    budget = DraftBudget()
    budget.reset({})
    budget.price_forwards(costs)
    return budget


def test_plain_steps_where_drafting_loses():
    """Verifying costs a lot per token (a CPU at a large batch) and drafts are rarely right: nearly every step is
    plain, with a probe now and then."""
    budget = fresh(linear_costs(0.5))
    caps = run(budget, 300, accept=0.1, costs=linear_costs(0.5))
    assert drafted_share(caps[100:]) < 0.15, caps[100:]


def test_deep_drafts_where_verifying_is_nearly_free():
    """A flat cost table (a GPU) and good drafts: the budget reaches full drafts by itself."""
    budget = fresh(linear_costs(0.001))
    caps = run(budget, 200, accept=0.8, costs=linear_costs(0.001))
    late = caps[50:]
    assert sum(c is None or c >= DEPTH for c in late) > 0.8 * len(late), late


def test_recovery_from_novel_text_and_back():
    """Repetitive text (drafts right), then novel text (drafts wrong), then repetitive again: the budget drafts,
    falls back to plain steps, and drafts again without being told."""
    costs = linear_costs(0.08)
    budget = fresh(costs)
    good = run(budget, 150, accept=0.9, costs=costs)
    bad = run(budget, 200, accept=0.0, costs=costs, seed=1)
    again = run(budget, 300, accept=0.9, costs=costs, seed=2)
    assert drafted_share(good[50:]) > 0.8
    assert drafted_share(bad[100:]) < 0.2
    assert drafted_share(again[150:]) > 0.8


def test_hindsight_brings_plain_steps_back_to_drafting_sooner():
    """Where the drafter tells what it would have guessed on plain steps, good guesses move the budget to drafting
    long before its estimates would have faded back on their own."""
    costs = linear_costs(0.08)
    told, untold = fresh(costs), fresh(costs)
    for budget in (told, untold):
        run(budget, 200, accept=0.0, costs=costs)
    for _ in range(10):
        told.hindsight([True] * 6)
    assert told.choose(100) != 0
    assert told.expected_tokens((None, False)) > untold.expected_tokens((None, False)) + 1.0


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_sane_choices_at_every_batch_size(rows):
    """The same drafter and text at B = 1, 2, 4 on a CPU-like cost (a verified token costs more the more rows): the
    budget drafts at one row and drafts no deeper as rows grow."""
    depths = {}
    for b in (1, 2, 4):
        costs = linear_costs(0.05, b)
        budget = fresh(costs)
        caps = run(budget, 200, accept=0.6, costs=costs, rows=b)
        depths[b] = sum(DEPTH if c is None else c for c in caps[100:]) / 100
    assert depths[1] > 0.5 and depths[1] >= depths[2] >= depths[4]


def test_the_same_inputs_give_the_same_choices():
    costs = linear_costs(0.08)
    assert run(fresh(costs), 200, 0.5, costs, seed=3) == run(fresh(costs), 200, 0.5, costs, seed=3)


def test_a_window_is_run_where_it_pays_and_plain_steps_where_it_does_not():
    """Lookahead's window: a window step or a plain one, by what window steps emitted and what the plain steps'
    pooled n-grams would have got."""
    for per_token, emitted, want in ((0.001, 2, None), (0.2, 0, 0)):
        guessed = []
        budget = DraftBudget(window=(lambda: 9, lambda g=guessed: [g.pop() for _ in range(len(g))]))
        budget.reset({})
        budget.price_forwards(linear_costs(per_token))
        table = linear_costs(per_token)(list(range(1, 16)))
        caps = []
        for _ in range(100):
            cap = budget.choose(100)
            caps.append(cap)
            window = cap is None
            draft = Draft([], [], side_tokens=[1] * 8 if window else [], side_offsets=list(range(8)) if window else [],
                          side_visible=__import__("torch").eye(8, dtype=bool) if window else None)  # fmt: skip
            if not window:
                guessed.append(emitted)
            budget.observe_rows(cap, [draft], [emitted], 0.0, table[9 if window else 1])
        assert caps[-20:].count(want) >= 18, (per_token, caps[-20:])


def test_prices_come_from_the_measured_forwards_until_a_shape_ran():
    budget = fresh(linear_costs(0.5))
    assert set(budget.forward) == set(PRICE_WIDTHS)
    before = budget.step_seconds((3, False))
    run(budget, 30, accept=0.5, costs=linear_costs(0.0))  # real steps: far cheaper than the table said
    assert budget.step_seconds((3, False)) < before or (3, False) not in budget.seconds


def test_make_budget_knows_full_and_auto():
    assert isinstance(make_budget("full"), FullBudget) and make_budget("auto").name == "auto"
    with pytest.raises(GlanceError, match="unknown draft budget"):
        make_budget("fast")
