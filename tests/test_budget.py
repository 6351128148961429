"""The cost-aware draft budget: it drafts deep where deep drafts pay and plainly where they do not."""

import pytest

from engine.budget.cost_aware import (
    DEEPER_MARGIN,
    EXPLORE_EVERY,
    FADE,
    MAX_BACKOFF,
    NARROW_GUESS,
    PRIOR_WEIGHT,
    SETTLE,
    STALE_STEPS,
    STAY,
    WARMUP_STEPS,
    CostAwareBudget,
    FullBudget,
    make_budget,
    monotone_ratios,
)
from engine.decoding.tree import Draft, spine_nodes
from engine.errors import GlanceError
from engine.session import RaceSettings


def chain(depth: int) -> Draft:
    return Draft(list(range(depth)), list(range(-1, depth - 1)))


def run(budget: CostAwareBudget, steps: int, accepted_of, seconds_of) -> list:
    """Drive the budget like the loop does: `accepted_of(depth)` tokens accepted of a draft that deep, at
    `seconds_of(depth)` seconds per step; a draft is 4 deep unless capped."""
    caps = []
    for _ in range(steps):
        cap = budget.choose()
        depth = 4 if cap is None else min(cap, 4)
        budget.observe(cap, chain(depth), accepted_of(depth), 0.0, seconds_of(depth))
        caps.append(cap)
    return caps


def test_slow_verification_and_poor_acceptance_lead_to_plain_steps():
    """A real model on a CPU: every drafted token costs a lot and one in five is accepted."""
    budget = CostAwareBudget()
    caps = run(budget, 60, lambda d: 1 if d and budget.steps % 5 == 0 else 0, lambda d: 0.060 * (1 + 0.5 * d))
    later = caps[WARMUP_STEPS:]
    assert later.count(0) > 0.7 * len(later)  # mostly plain steps: exploration keeps a few others
    assert caps[WARMUP_STEPS - 1] == 0  # a plain step is measured early


def test_where_plain_steps_win_the_probes_stay_shallow():
    """Exploring costs most where drafting loses: probes go one depth past the best cap, about every
    EXPLORE_EVERY-th step, never uncapped while plain steps are best (it used to be every other one, and cycled
    through every cap, then one in DEEP_EVERY)."""
    budget = CostAwareBudget()
    caps = run(budget, 240, lambda d: 0, lambda d: 0.010 * (1 + 0.5 * d))  # nothing is ever accepted
    probes = [c for c in caps[WARMUP_STEPS:] if c != 0]
    assert set(probes) == {1}, probes
    # plain steps stay best, so each probe comes twice as far after the last as that one did, up to 2**MAX_BACKOFF
    # times the gap (each gap 4 to 8 steps times its back-off)
    assert probes_within(237, EXPLORE_EVERY + 2) <= len(probes) <= probes_within(237, EXPLORE_EVERY - 2) + 1, probes


def probes_within(steps: int, gap: int) -> int:
    """Probes in `steps` steps where they back off from `gap` steps apart, doubling up to 2**MAX_BACKOFF."""
    count, used = 0, EXPLORE_EVERY
    while used <= steps:
        count += 1
        used += gap * 2 ** min(count - 1, MAX_BACKOFF)
    return count


def test_probes_do_not_alias_with_periodic_text():
    """Text that repeats every 3 tokens, whose third token the draft always misses: a first draft token is accepted
    at two positions in three, so drafting one token pays. Probing every 6th step (a multiple of the period) kept
    landing on the missed token after the budget had gone plain, and it never drafted again."""
    for start in range(3):  # every phase of the cycle at the first probe
        budget = CostAwareBudget()
        caps = drive_periodic(budget, start)
        assert sum(c == 1 for c in caps[-100:]) > 60, (start, caps[-100:])


def drive_periodic(budget: CostAwareBudget, position: int) -> list:
    caps = []
    for _ in range(300):
        cap = budget.choose()
        depth = 1 if cap is None else min(cap, 1)
        got = 1 if depth and position % 3 != 2 else 0
        if len(caps) < 6:
            got = 0  # a poor start: the budget goes plain first
        budget.observe(cap, chain(depth), got, 0.0, 0.010 if depth == 0 else 0.013)
        position += 1 + got
        caps.append(cap)
    return caps


def test_cheap_verification_and_good_acceptance_lead_to_full_depth():
    budget = CostAwareBudget()
    caps = run(budget, 60, lambda d: d, lambda d: 0.015 + 0.001 * d)
    later = caps[10:]
    assert sum(c in (None, 4) for c in later) > 0.8 * len(later)


def test_estimates_follow_measurements():
    budget = CostAwareBudget()
    run(budget, 12, lambda d: d // 2, lambda d: 0.010 + 0.002 * d)
    assert budget.seconds(0) == pytest.approx(0.010)
    assert budget.seconds(4) == pytest.approx(0.018)
    assert 1.0 < budget.expected_tokens(4) < 5.0
    assert budget.expected_tokens(0) == 1.0


def test_seconds_are_medians_linear_between_measured_depths_and_flat_beyond():
    budget = CostAwareBudget()
    budget.recent = {1: [0.010, 0.030, 0.011], 3: [0.020, 0.022], 6: [0.040]}  # medians 0.011, 0.021, 0.040
    assert budget._seconds(range(9)) == pytest.approx(
        [0.011, 0.011, 0.016, 0.021, 0.0273, 0.0337, 0.040, 0.040, 0.040], abs=1e-4
    )
    assert budget.seconds(2) == pytest.approx(0.016)
    assert CostAwareBudget()._seconds([0, 3]) == [0.0, 0.0]  # nothing measured yet


def test_budgets_by_name():
    assert isinstance(make_budget("full"), FullBudget) and make_budget("full").choose() is None
    assert isinstance(make_budget("auto"), CostAwareBudget)
    with pytest.raises(GlanceError, match="unknown draft budget 'fast'"):
        make_budget("fast")
    with pytest.raises(GlanceError, match="draft budget"):
        RaceSettings(["ar"], draft_budget="fast")
    assert RaceSettings(["ar"]).describe()["draft_budget"] == "auto"


def test_a_batch_step_counts_every_rows_acceptance_and_the_steps_time_once():
    budget = CostAwareBudget()
    budget.observe_rows(None, [chain(3), chain(2), chain(0)], [3, 0, 0], 0.004, 0.006)
    assert budget.max_depth == 3
    assert budget.reached == [2.0, 1.0, 1.0] and budget.accepted == [1.0, 1.0, 1.0]  # row 2 stopped at depth 1
    assert budget.recent == {}  # the run's first drafted step fed the drafters the prompts: not timed
    budget.observe_rows(None, [chain(3), chain(2), chain(0)], [3, 0, 0], 0.004, 0.006)
    assert budget.recent == {3: [0.010]}  # one batch step, under its deepest draft


def test_the_first_drafted_step_of_a_run_is_not_timed():
    """It feeds the draft model or head the whole prompt (2-3 plain steps' time on the bundled models): as the cost of
    drafting it kept the next runs, which start from this one's costs, from ever drafting in short runs."""
    budget = CostAwareBudget(fade=1.0)  # counts as counted (fading: its own test)
    budget.observe(None, chain(4), 2, 0.030, 0.008)
    budget.observe(None, chain(4), 2, 0.002, 0.008)
    budget.observe(0, Draft(), 0, 0.0, 0.006)
    assert budget.recent == {4: [0.010], 0: [0.006]} and budget.reached[0] == 2


def test_a_step_not_timed_counts_acceptance_and_no_seconds():
    """A batch step where a row that joined mid-run read its prompt (engine/decoding/batch.py) is not timed: its
    acceptance
    counts, its seconds price no depth."""
    budget = CostAwareBudget(fade=1.0)
    budget.observe(None, chain(4), 2, 0.030, 0.008)  # the run's first draft: untimed anyway
    budget.observe_rows(None, [chain(4)], [3], 0.002, 0.008)
    budget.observe_rows(None, [chain(4), chain(4)], [1, 4], 0.040, 0.009, timed=False)
    assert budget.recent == {4: [0.010]} and budget.draft_recent == {4: [0.002]} and budget.reached[0] == 4


def test_expected_tokens_chain_conditional_acceptance():
    """Half the drafts are accepted whole, half not at all: every depth is reached half the time, so a cap of 4
    expects 1 + 4 x 1/2 = 3 tokens. (Multiplying the unconditional rates of each depth gave 1.94: deep caps looked
    worse than they were.)"""
    budget = CostAwareBudget(fade=1.0)  # counts as counted (fading: its own test)
    for i in range(400):
        budget.observe(None, chain(4), 4 if i % 2 else 0, 0.0, 0.01)
    assert budget.expected_tokens(4) == pytest.approx(3.0, abs=0.05)
    assert budget.expected_tokens(1) == pytest.approx(1.5, abs=0.05)


def test_a_plain_step_costs_its_fastest_recent_time():
    """Plain steps have one shape; the first after a drafted step runs slower (a switch of compiled graphs), which a
    run of plain steps stops paying, so the baseline is the fastest. Drafted depths keep their medians."""
    budget = CostAwareBudget()
    budget.recent = {0: [0.0075, 0.0060, 0.0070], 2: [0.010, 0.030, 0.011]}
    assert budget.seconds(0) == pytest.approx(0.0060)
    assert budget.seconds(2) == pytest.approx(0.011)


def test_the_plain_cost_is_the_median_of_the_latest_runs_whoever_ran_them():
    """A drafter that drafts nearly every step sees only cold plain steps; plain decoding's own runs (or any other
    drafter's) at the same batch size tell the budget what a plain step costs: the median of the latest PLAIN_RUNS
    runs' low quantiles, so that one run on a briefly faster machine does not make every draft look dear."""
    from engine.budget.cost_aware import PLAIN_RUNS, remembered
    from engine.decoding.sampling import SamplingConfig
    from engine.drafters.base import Drafter
    from engine.drafters.prompt_lookup import PromptLookupDrafter

    class Target:
        pass

    target, greedy = Target(), SamplingConfig()
    plain = CostAwareBudget()
    plain.reset(remembered(target, Drafter(), 1, greedy))
    for t in (0.0070, 0.0052, 0.0055):  # plain decoding: no draft ever
        plain.observe(plain.choose(), Draft(), 0, 0.0, t)
    plain.finish()

    drafting = CostAwareBudget()
    drafting.reset(remembered(target, PromptLookupDrafter(), 1, greedy))
    assert drafting.seconds(0) == pytest.approx(0.0052)  # before it measured a plain step of its own
    run(drafting, 12, lambda d: d, lambda d: 0.0080 if d == 0 else 0.010)  # its plain steps all run cold
    assert drafting.seconds(0) == pytest.approx(0.0052)
    drafting.finish()
    assert remembered(target, Drafter(), 1, greedy)["plain"] == [0.0052]  # cold plain steps are not a run's cost
    assert remembered(target, Drafter(), 2, greedy)["plain"] == []  # a batch's plain step is another cost

    floors = []
    for _ in range(PLAIN_RUNS):  # later runs measure slower plain steps (a busier machine): the old cost goes
        later = CostAwareBudget()
        later.reset(remembered(target, Drafter(), 1, greedy))
        floors.append(later.plain_floor)
        later.observe(later.choose(), Draft(), 0, 0.0, 0.0060)
        later.finish()
    assert floors == pytest.approx([0.0052, 0.0056, 0.0060, 0.0060])
    fresh = CostAwareBudget()
    fresh.reset(remembered(target, Drafter(), 1, greedy))
    assert fresh.seconds(0) == pytest.approx(0.0060)


def test_drafted_steps_after_plain_ones_are_timed_once_settled_and_a_probe_from_plain_steps_drafts_until_then():
    """The first SETTLE drafted steps after plain ones (the drafter catches up, the target's weights come back into
    the cache: EAGLE-3 14.5, 11.3, 11.1, then 10.6-10.8 ms) and the plain step after a drafted one say nothing about
    a steady step at their depth; a probe from plain steps holds its cap until a settled step is timed, if its first
    draft got anything accepted."""
    budget = CostAwareBudget()
    assert budget.settle == SETTLE == 2
    budget.observe(None, chain(2), 2, 0.030, 0.008)  # the run's first draft: the prompt
    budget.observe(None, chain(2), 2, 0.002, 0.008)  # no plain step yet: timed
    budget.observe(0, Draft(), 0, 0.0, 0.009)  # cold
    budget.observe(0, Draft(), 0, 0.0, 0.006)
    assert budget.plain_times == [0.006] and budget.recent == {2: [0.010], 0: [0.009, 0.006]}
    budget.observe(1, chain(1), 1, 0.004, 0.009)  # a switch: not timed
    budget.observe(1, chain(1), 1, 0.002, 0.008)  # still settling: not timed
    assert 1 not in budget.recent
    budget.observe(1, chain(1), 1, 0.001, 0.007)
    assert budget.recent[1] == [0.008]
    budget.observe(0, Draft(), 0, 0.0, 0.006)  # a plain step again: the next drafted ones settle anew
    budget.observe(1, chain(1), 1, 0.004, 0.009)
    assert budget.recent[1] == [0.008]

    for settle in (1, 2, 3):
        for hit, held in ((1, settle), (0, 0)):  # a probe whose first draft got nothing accepted is not held
            probing = CostAwareBudget(settle=settle)
            run(probing, 3, lambda d: d, lambda d: 0.010 + 0.010 * d)  # warm-up: plain steps are best
            caps = []
            for _ in range(60):
                cap = probing.choose()
                depth = 0 if cap == 0 else 1
                probing.observe(cap, chain(depth), hit * depth, 0.0, 0.010 + 0.010 * depth)
                caps.append(depth)
            starts = [i for i in range(1, len(caps) - settle - 1) if caps[i] and not caps[i - 1]]
            assert starts and all(caps[i : i + held + 2] == [1] * (held + 1) + [0] for i in starts), (settle, caps)


def test_hindsight_counts_what_chains_drafted_at_each_position_would_have_had_accepted():
    """Matches [hit, hit, miss, hit] at max depth 3: chains from each position get 2, 1, 0 and 1 tokens accepted
    (the last one knows only its first depth). Counted per depth, conditional on the path being alive."""
    budget = CostAwareBudget(fade=1.0)  # counts as counted (fading: its own test)
    budget.hindsight([True, False])
    assert budget.reached == [] and budget.accepted == []  # no draft seen yet: no depths to count at
    budget.observe(None, chain(3), 0, 0.0, 0.010)  # a 3-deep draft, its first token rejected
    budget.hindsight([True, True, False, True])
    assert budget.reached == [1 + 4, 2, 1] and budget.accepted == [0 + 3, 1, 0]
    assert budget.steps == 1 and budget.recent == {}  # acceptance only (and the first drafted step is not timed)
    budget.hindsight([True, True, False], depth=1)  # a tree head's catch-up: depth 1 of a draft at each position
    assert budget.reached == [5 + 3, 2, 1] and budget.accepted == [3 + 2, 1, 0]


def test_a_run_starts_from_what_the_last_run_learned():
    """No warm-up after a run with the same slot: its costs as they were, its acceptance as at most PRIOR_WEIGHT
    drafts (so the new text's own acceptance soon outweighs it)."""
    memory: dict = {}
    first = CostAwareBudget()
    first.reset(memory)
    caps = run(first, 40, lambda d: d, lambda d: 0.010 + 0.004 * d)
    assert caps[:WARMUP_STEPS] == [None, None, 0]
    first.finish()
    assert memory["max_depth"] == 4 and memory["recent"][0] == first.recent[0]

    second = CostAwareBudget()
    second.reset(memory)
    assert second.seconds(4) == first.seconds(4) and second.seconds(0) == first.seconds(0)
    assert second.reached[0] == PRIOR_WEIGHT and second.accepted[0] == PRIOR_WEIGHT  # every depth-1 token accepted
    best = max(range(5), key=second.rate)  # from the remembered costs and acceptance
    if second.rate(best) < second.rate(1) * (1 + DEEPER_MARGIN):
        best = 1  # deeper drafts must rate DEEPER_MARGIN above a one-deep one
    assert best > 0 and second.choose() == best  # the best cap at once: no full drafts, no plain step to measure
    later = run(second, 40, lambda d: 0, lambda d: 0.010 + 0.004 * d)  # the new text: nothing is accepted any more
    assert later[-20:].count(0) > 14, later

    fresh = CostAwareBudget()
    fresh.reset({})  # an empty slot: the warm-up as before
    assert fresh.choose() is None
    fresh.finish()  # nothing measured: nothing written
    assert CostAwareBudget().memory is None


def test_the_memory_has_a_slot_per_drafter_setting_batch_size_and_sampling():
    from engine.budget.cost_aware import remembered
    from engine.decoding.sampling import SamplingConfig
    from engine.drafters.prompt_lookup import PromptLookupDrafter

    class Target:  # anything a weak reference can point to: the slots live as long as the model
        pass

    target, other = Target(), Target()
    greedy, hot = SamplingConfig(), SamplingConfig(temperature=0.8)
    a = PromptLookupDrafter()
    slot = remembered(target, a, 1, greedy)
    slot["x"] = 1
    assert remembered(target, PromptLookupDrafter(), 1, greedy) is slot  # same settings: the same slot
    assert remembered(target, a, 2, greedy) is not slot
    assert remembered(target, a, 1, hot) is not slot
    assert remembered(other, a, 1, greedy) is not slot
    assert remembered(target, PromptLookupDrafter(max_ngram=a.max_ngram + 1), 1, greedy) is not slot


def test_a_batch_size_never_drafted_at_starts_from_the_nearest_ones_run_at_its_own_plain_price():
    """No warm-up at a new batch size where another drafted: its acceptance as the prior, its prices scaled by the two
    sizes' plain steps and stale (re-timed, never skipped on); nothing to seed from, or seeding off: the warm-up."""
    import engine.budget.cost_aware as eb
    from engine.decoding.sampling import SamplingConfig
    from engine.drafters.prompt_lookup import PromptLookupDrafter

    class Target:
        pass

    target, greedy, drafter = Target(), SamplingConfig(), PromptLookupDrafter()
    one = eb.remembered(target, drafter, 1, greedy)
    first = CostAwareBudget()
    first.reset(one)
    run(first, 40, lambda d: d, lambda d: 0.010 + 0.004 * d)
    first.finish()
    assert "recent" in one and one["plain"]

    eb.remembered(target, drafter, 4, greedy)["plain"][:] = [2 * x for x in one["plain"]]  # plain decoding at B = 4
    seeded = CostAwareBudget()
    seeded.reset(eb.remembered(target, drafter, 4, greedy))
    assert seeded.choose() not in (None, 0)  # the best cap at once: no full drafts, no plain step to measure
    assert seeded.seconds(4) == pytest.approx(2 * first.seconds(4)) and seeded.reached[0] == PRIOR_WEIGHT
    assert not seeded._fresh(False, 4)
    seeded.finish()
    assert "seed" not in eb.remembered(target, drafter, 4, greedy)  # it drafted: its own snapshot from now on

    eb.remembered(target, drafter, 2, greedy)["plain"][:] = [0.02]
    other_sampling = CostAwareBudget()
    other_sampling.reset(eb.remembered(target, drafter, 2, SamplingConfig(temperature=0.8)))
    assert other_sampling.choose() is None  # another sampling setting: nothing to seed from, the warm-up
    saved, eb.SEED_ROWS = eb.SEED_ROWS, False
    try:
        off = CostAwareBudget()
        off.reset(eb.remembered(target, drafter, 2, greedy))
        assert off.choose() is None
    finally:
        eb.SEED_ROWS = saved
    on = CostAwareBudget()
    on.reset(eb.remembered(target, drafter, 2, greedy))  # nearest of 1 and 4 by ratio: 1 (the smaller on a tie)
    scale = 0.02 / eb._median(one["plain"])  # B = 2's plain step against B = 1's
    assert on.seconds(0) == pytest.approx(0.02) and on.seconds(4) == pytest.approx(first.seconds(4) * scale)


def test_no_probe_near_the_end_of_a_run_while_plain_steps_win():
    """A probe that finds drafting pays needs steps left to win back its cost: with fewer than PROBE_HORIZON tokens
    left and plain steps best, every step is plain; with more, probes come as before."""
    from engine.budget.cost_aware import PROBE_HORIZON

    caps = {}
    for left in (PROBE_HORIZON - 1, PROBE_HORIZON + 100):
        budget, caps[left] = CostAwareBudget(), []
        for _ in range(60):
            cap = budget.choose(left)
            depth = 4 if cap is None else min(cap, 4)
            budget.observe(cap, chain(depth), 0, 0.0, 0.010 * (1 + 0.5 * depth))  # nothing is ever accepted
            caps[left].append(cap)
    assert caps[PROBE_HORIZON - 1][WARMUP_STEPS:] == [0] * (60 - WARMUP_STEPS)
    assert caps[PROBE_HORIZON - 1][:WARMUP_STEPS] == [None, None, 0]  # the warm-up measures both ends regardless
    assert sum(c != 0 for c in caps[PROBE_HORIZON + 100][WARMUP_STEPS:]) >= 2


def test_costly_probes_take_at_most_their_share_of_the_run():
    """Where a probe from plain steps costs many plain steps (a switch between graphs, a catch-up, a cold cache),
    probes come far enough apart that they take about PROBE_SHARE of the run; where a probe costs little, the back-off
    alone paces them. The probes' costs carry over to the next run."""
    from engine.budget.cost_aware import PROBE_SHARE

    def probe_steps(drafted_s: float, memory=None, steps: int = 4000) -> list[int]:
        budget = CostAwareBudget()
        budget.reset(memory)
        caps = run(budget, steps, lambda d: 0, lambda d: 0.010 if d == 0 else drafted_s)  # nothing is accepted
        budget.finish()
        return [i for i, c in enumerate(caps[WARMUP_STEPS:]) if c != 0]

    costly = probe_steps(0.100)  # each probe costs 9 plain steps on top
    assert costly and len(costly) * 0.090 <= 1.5 * PROBE_SHARE * 4000 * 0.010 + 2 * 0.090, costly
    cheap = probe_steps(0.0105)
    assert len(cheap) > 2 * len(costly), (cheap, costly)  # the back-off's pace: up to every 128-256 steps
    memory: dict = {}
    probe_steps(0.100, memory, 60)
    assert memory["probe_costs"] == [pytest.approx(0.090)] * len(memory["probe_costs"]) != []
    later = probe_steps(0.100, memory, 400)
    assert len(later) <= 1, later  # the new text's one (RUN_PROBE_AT), no cheap ones: the next comes ~900 steps on


def test_probes_keep_their_pace_across_short_runs():
    """Where plain steps win, probes come every 8 to 16 steps; runs shorter than that must not each start the count
    again, or a short run never probes and a text where drafting pays is never noticed."""
    memory: dict = {}
    probes = 0
    for run_no in range(12):
        budget = CostAwareBudget()
        budget.reset(memory)
        for _ in range(6):
            cap = budget.choose(100)
            depth = 4 if cap is None else min(cap, 4)
            budget.observe(cap, chain(depth), 0, 0.0, 0.010 * (1 + 0.5 * depth))  # nothing is ever accepted
            probes += run_no > 0 and cap != 0
        budget.finish()
    assert 66 / (EXPLORE_EVERY + 2) / 2**MAX_BACKOFF <= probes <= 66 / (EXPLORE_EVERY - 2) + 1


def test_a_new_run_probes_early_whatever_back_off_the_last_runs_built_up():
    """A new run is new text: after runs where drafting lost (probes backed off and spaced by their cost), the next
    run still probes within RUN_PROBE_AT steps, and its hindsight decides. Carried over, the pace put the next probe
    past the end of the next runs."""
    from engine.budget.cost_aware import RUN_PROBE_AT

    def first_probe(run_probe_at) -> int | None:
        memory: dict = {}
        for steps in (600, 64):  # a long losing run builds up the back-off; then a new one
            budget = CostAwareBudget(run_probe_at=run_probe_at)
            budget.reset(memory)
            caps = run(budget, steps, lambda d: 0, lambda d: 0.010 if d == 0 else 0.100)  # nothing is accepted
            budget.finish()
        assert memory["probe_in"] > 64  # the back-off's pace would probe past the new run's end
        return next((i for i, c in enumerate(caps) if c != 0), None)

    assert first_probe(RUN_PROBE_AT) is not None and first_probe(RUN_PROBE_AT) <= RUN_PROBE_AT
    assert first_probe(None) is None


def test_a_probes_cost_counts_the_cold_plain_steps_after_it():
    """After a drafted step the next PROBE_TAIL plain steps run cold (the target's one-token graph comes back into the
    cache), so an idle probe costs its own step's excess and theirs: counting only the first plain step, the share
    rule spaced probes for about half their cost."""
    budget = CostAwareBudget()
    since_draft = [99]

    def seconds_of(depth: int) -> float:  # four cold plain steps after a drafted one, as measured off the suite
        since_draft[0] = 0 if depth else since_draft[0] + 1
        return 0.030 if depth else 0.010 + (0.004 if since_draft[0] <= 4 else 0.0)

    run(budget, 600, lambda d: 0, seconds_of)  # nothing is accepted: plain steps stay best, probes now and then
    assert budget.probe_costs and budget.probe_costs[-1] == pytest.approx(0.020 + 4 * 0.004)


def tree(depth: int, width: int = 3) -> Draft:
    """`width` children under the root and under every spine node, `depth` deep: the spine is nodes 0, width, ..."""
    tokens, parents, spine = [], [], -1
    for _ in range(depth):
        first = len(tokens)
        tokens += [0] * width
        parents += [spine] * width
        spine = first
    return Draft(tokens, parents)


def run_trees(budget: CostAwareBudget, steps: int, spine_hit, sibling_hit, seconds_of) -> list:
    """Drive the budget with 4-deep trees of width 3 (their spine when `budget.narrow`): at each depth the spine node
    is accepted when `spine_hit(step)`, else the second child when `sibling_hit(step)`; `seconds_of(nodes)`."""
    shapes = []
    for i in range(steps):
        cap = budget.choose()
        draft = tree(4 if cap is None else min(cap, 4))
        if budget.narrow:
            draft = draft.spine()
        path, parent = [], -1
        while True:
            kids = draft.children(parent)
            if kids and spine_hit(i):
                parent = kids[0]
            elif len(kids) > 1 and sibling_hit(i):
                parent = kids[1]
            else:
                break
            path.append(parent)
            if parent != kids[0]:
                break  # the tree grows under the spine only
        budget.observe(cap, draft, len(path), 0.0, seconds_of(len(draft)), path)
        shapes.append((cap, budget.narrow))
    return shapes


def test_where_a_trees_width_costs_more_than_it_wins_the_budget_verifies_its_spine():
    """Off the suite on a CPU: every verified token costs, the first guess is right every other step and a second
    guess rarely. A one-deep tree of width 3 verifies 4 tokens for 1.6 a step; its spine, 2 for 1.5."""
    budget = CostAwareBudget()
    shapes = run_trees(budget, 200, lambda i: i % 2 == 0, lambda i: i % 10 == 1, lambda n: 0.010 + 0.003 * n)
    later = shapes[20:]
    assert sum(narrow and cap >= 1 for cap, narrow in later) > 0.7 * len(later), later
    assert budget.branched


def test_where_the_width_pays_the_budget_keeps_the_tree():
    """Verifying is nearly free and second guesses are often right: whole trees stay."""
    budget = CostAwareBudget()
    shapes = run_trees(budget, 200, lambda i: i % 2 == 0, lambda i: True, lambda n: 0.010 + 0.0001 * n)
    later = shapes[20:]
    assert sum(not narrow and cap != 0 for cap, narrow in later) > 0.7 * len(later), later


def test_chains_are_never_narrowed():
    """A chain is its own spine: a budget that never saw a branching draft offers no narrow caps."""
    budget = CostAwareBudget()
    narrow = []
    for _ in range(80):
        cap = budget.choose()
        narrow.append(budget.narrow)
        depth = 4 if cap is None else min(cap, 4)
        budget.observe(cap, chain(depth), depth // 2, 0.0, 0.010 + 0.003 * depth, list(range(depth // 2)))
    assert not any(narrow) and not budget.branched


def test_hindsight_of_a_tree_counts_its_first_choices_for_the_spine():
    """A tree's catch-up tells whether the target's token was among its depth-1 candidates (the tree's counts) and
    whether it was the first one (the spine's); a chain's tells the first only, counted once."""
    budget = CostAwareBudget(fade=1.0)  # counts as counted (fading: its own test)
    budget.observe(None, tree(2), 0, 0.0, 0.010, [])  # a branching draft: its first guess missed
    budget.hindsight([True, True, False], [True, False, False], depth=1)
    assert budget.reached == [1 + 3, 0] and budget.accepted == [0 + 2, 0]
    assert budget.spine_reached == [1 + 3, 0] and budget.spine_accepted == [0 + 1, 0]
    budget.hindsight([True, True], None, depth=1)  # no first choices told: the spine's counts stand
    assert budget.reached[0] == 6 and budget.spine_reached[0] == 4


def test_plain_steps_hindsight_brings_the_spine_back_when_the_text_turns_predictable():
    """The first 60 steps the first guess always misses (plain steps win); then it always hits. Where a one-deep
    spine pays and a tree does not, the catch-up at the next probe must bring narrow steps back: counted as the
    tree's only, the spine's rate kept the misses of the first stretch and plain steps stayed."""
    budget = CostAwareBudget()
    shapes, missed = [], []  # `missed`: whether each plain step's token would have been the first guess's miss
    for i in range(220):
        hit = i >= 60
        cap = budget.choose()
        draft = tree(4 if cap is None else min(cap, 4))
        if budget.narrow:
            draft = draft.spine()
        if len(draft) and missed:
            told = [not m for m in missed]
            budget.hindsight(told, told, depth=1)  # the siblings never hit here: the tree's matches are the spine's
            missed = []
        path = spine_nodes(draft.parents) if hit else []
        budget.observe(cap, draft, len(path), 0.0, 0.010 + 0.006 * len(draft), path)
        if not len(draft):
            missed.append(not hit)
        shapes.append((cap, budget.narrow))
    assert sum(narrow and cap >= 1 for cap, narrow in shapes[180:]) > 30, shapes[60:]


def test_acceptance_counts_fade_so_the_latest_text_outweighs_a_runs_first_stretch():
    """100 drafts accepted whole, then 40 rejected outright: counted for good, depth 1 would still rate 0.7; faded by
    FADE per step, it rates below 0.3 and the budget stops drafting."""
    budget = CostAwareBudget()
    for i in range(140):
        budget.observe(None, chain(2), 2 if i < 100 else 0, 0.0, 0.010)
    rate = (budget.accepted[0] + 1) / (budget.reached[0] + 2)
    assert rate < 0.3 and budget.fade == FADE < 1.0
    budget.reset()
    assert budget.fade == FADE  # a run keeps the setting
    still = CostAwareBudget(fade=1.0)
    for i in range(140):
        still.observe(None, chain(2), 2 if i < 100 else 0, 0.0, 0.010)
    assert (still.accepted[0] + 1) / (still.reached[0] + 2) > 0.7


def test_a_runs_first_catch_up_does_not_space_its_later_probes():
    """A run's first draft feeds the drafter the prompt, a cost paid once: counted as its probe's cost, it spaced
    every later probe (off the suite, 200-400 steps apart, past the end of every run)."""
    memory: dict = {}
    budget = CostAwareBudget()
    budget.reset(memory)
    run(budget, 300, lambda d: 0, lambda d: 0.010 if d == 0 else 0.030)  # a first run: plain steps win
    budget.finish()
    budget.reset(memory)
    drafted = [0]

    def seconds_of(depth: int) -> float:  # this run's first draft costs 10 plain steps, the others 3
        drafted[0] += depth > 0
        return 0.010 if depth == 0 else 0.100 if drafted[0] == 1 else 0.030

    caps = run(budget, 300, lambda d: 0, seconds_of)
    assert caps[0] == 0 and drafted[0] >= 2  # its first draft is a probe from plain steps, and so are later ones
    assert budget.probe_costs and max(budget.probe_costs) < 0.05, budget.probe_costs  # 0.02 each, not 0.09


def test_a_spine_priced_by_its_cold_first_steps_is_chosen_again():
    """Off the suite: the spine's first timed steps ran cold (25 ms where warm ones take 11), so the budget drafted
    whole trees (15 ms for 1.6 tokens) and, never choosing the spine, never timed it again. A spine costs at most its
    drafting plus a plain step scaled to its forward: it is chosen again, timed warm, and stays."""
    budget = CostAwareBudget()
    budget.price_forwards(lambda widths: {k: 0.004 * (1 + 0.05 * (k - 1)) for k in widths})
    shapes = []
    for i in range(300):
        cap = budget.choose()
        draft = tree(4 if cap is None else min(cap, 4))
        if budget.narrow:
            draft = draft.spine()
        kids = draft.children(-1)
        path = [kids[0]] if kids and i % 2 == 0 else [kids[1]] if len(kids) > 1 and i % 10 == 1 else []
        verify = 0.010 + 0.002 * max(len(draft) - 1, 0)  # every verified token past the first costs 2 ms
        if budget.narrow and i < 60:
            verify += 0.015  # the spine's first steps run cold
        budget.observe(cap, draft, len(path), 0.001 if len(draft) else 0.0, verify, path)
        shapes.append((cap, budget.narrow))
    later = shapes[200:]
    assert sum(narrow and cap == 1 for cap, narrow in later) > 0.7 * len(later), later


def test_a_spines_bound_is_its_drafting_plus_a_plain_step_scaled_by_the_measured_forward():
    """Two tokens measured at 1.3 one token's forward: a one-deep spine whose cold steps took 30 ms is priced at its
    drafting (2 ms) plus 1.3 plain steps (10 ms each) at once (BOUND_ALWAYS) or, with the bound for stale prices
    only, once that price is STALE_STEPS old; without a measurement, NARROW_GUESS per spine token."""
    for measured, ratio in ((True, 1.3), (False, 1 + NARROW_GUESS)):
        budget = CostAwareBudget(bound_always=False)
        if measured:
            budget.price_forwards(lambda widths: {k: 0.004 + 0.0012 * (k - 1) for k in widths})
        budget.plain_floor = 0.010
        budget.branched = True
        budget.drafted = True
        budget.narrow = True
        budget.observe(1, tree(1).spine(), 1, 0.002, 0.028, [0])
        assert budget._narrow_seconds([1])[0] == pytest.approx(0.030)  # fresh: the measured price stands
        budget.steps += STALE_STEPS + 1
        assert budget._narrow_seconds([1])[0] == pytest.approx(0.002 + 0.010 * ratio)
        budget.narrow = False
        budget.observe(1, tree(1), 1, 0.004, 0.012, [0])  # a tree's drafting counts too (a spine drafts the same)
        assert budget._narrow_seconds([1])[0] == pytest.approx(0.003 + 0.010 * ratio)
    budget = CostAwareBudget()  # the default: bounded from its first timed step
    budget.price_forwards(lambda widths: {k: 0.004 + 0.0012 * (k - 1) for k in widths})
    budget.plain_floor, budget.branched, budget.drafted, budget.narrow = 0.010, True, True, True
    budget.observe(1, tree(1).spine(), 1, 0.002, 0.028, [0])
    assert budget._narrow_seconds([1])[0] == pytest.approx(0.002 + 0.010 * 1.3)


def test_a_chains_price_is_bounded_like_a_spines_and_a_trees_is_not():
    """Vanilla's one-deep chain stayed priced at its cold probes' 6.4-7.0 ms against 4.1-4.3 ms plain steps: a chain
    verifies depth + 1 tokens, so once its price is stale it costs at most its drafting plus the scaled plain step.
    A tree verifies more tokens than its depth tells: its measured price stands."""
    for branched, bounded in ((False, True), (True, False)):
        budget = CostAwareBudget(bound_always=False)
        budget.price_forwards(lambda widths: {k: 0.004 + 0.0012 * (k - 1) for k in widths})
        budget.plain_floor, budget.drafted, budget.branched = 0.010, True, branched
        draft = tree(1) if branched else chain(1)
        budget.observe(1, draft, 1, 0.002, 0.028, [0])  # a cold step: 30 ms
        assert budget.seconds(1) == pytest.approx(0.030)  # fresh: the measured price stands
        budget.steps += STALE_STEPS + 1
        assert budget.seconds(1) == pytest.approx(0.002 + 0.010 * 1.3 if bounded else 0.030)


def test_whole_drafts_are_probed_only_while_they_rate_near_the_best_cap():
    """A whole draft (an uncapped probe) that rates far below the best cap is not probed: off the suite EAGLE-3's
    and Medusa's whole trees cost 23-28 ms against 4-6 for a one-deep spine, and each such probe about 5% of a run
    of 128 tokens. A chain whose first token is always accepted and whose second never is: one deep is best."""
    budget = CostAwareBudget()
    caps = run(budget, 200, lambda d: min(d, 1), lambda d: 0.010 + (0.001 if d == 1 else 0.010 * d))
    assert None not in caps[WARMUP_STEPS:], caps
    assert caps[WARMUP_STEPS:].count(1) > 0.7 * len(caps[WARMUP_STEPS:])  # the rest: probes one deeper


def settled(branched: bool = False, **knobs) -> CostAwareBudget:
    """A budget well past its warm-up, plain steps at 10 ms, no probe due."""
    budget = CostAwareBudget(**knobs)
    budget.reset(None)
    budget.steps, budget.next_probe, budget.drafted, budget.branched = 50, 10**6, True, branched
    budget.remembered_plain, budget.plain_floor = [0.010], 0.010
    return budget


def test_deeper_drafts_must_rate_the_margin_above_a_one_deep_one():
    """On a CPU the budget's estimates of deeper drafts sat within 10% of a one-deep one, and a fixed one-deep draft
    every step beat it: a chain two deep is chosen only when it rates DEEPER_MARGIN above one deep; a tree only when
    it rates that much above its one-deep spine."""
    for ratio, margin, expected in ((1.05, DEEPER_MARGIN, 1), (1.30, DEEPER_MARGIN, 2), (1.05, 0.0, 2)):
        budget = settled(deeper_margin=margin)
        budget.max_depth, budget.reached, budget.accepted = 2, [100.0, 100.0], [100.0, 50.0]
        one = budget.expected_tokens(1) / 0.012
        budget.recent = {0: [0.010], 1: [0.012], 2: [budget.expected_tokens(2) / (one * ratio)]}
        assert budget.choose() == expected, (ratio, margin)
        assert not budget.narrow
    for margin, expected in ((DEEPER_MARGIN, (1, True)), (0.0, (1, False))):
        budget = settled(branched=True, deeper_margin=margin)
        budget.max_depth, budget.reached, budget.accepted = 1, [100.0], [100.0]  # the tree's first level: always
        budget.spine_reached, budget.spine_accepted = [100.0], [80.0]  # its first child: four times in five
        budget.recent, budget.narrow_recent = {0: [0.010], 1: [0.012]}, {1: [0.012]}  # 11% more tokens, same price
        assert (budget.choose(), budget.narrow) == expected, margin


def test_a_probe_one_deeper_is_skipped_where_even_full_acceptance_there_could_not_pay():
    """Off the suite Medusa's one-deep spine got a quarter of a token a step, and its two-deep probes (every 4-8
    steps, 40% dearer than the spine) got nothing: a probe one depth past the best is skipped where every path that
    reaches the new depth, accepted there, would still rate below the best; where that depth is cheap it is probed
    whatever it got before (its acceptance may have changed), and so is one whose price is stale (cold steps may
    have set it)."""
    cases = ((0.016, True, 0, 1), (0.016, False, 0, 2), (0.011, True, 0, 2), (0.016, True, STALE_STEPS + 1, 2))
    for two_deep, skip, age, expected in cases:
        budget = settled(skip_hopeless=skip)
        budget.next_probe = budget.steps  # a probe is due
        budget.max_depth, budget.reached, budget.accepted = 2, [100.0, 20.0], [25.0, 0.0]
        budget.recent = {0: [0.010], 1: [0.0105], 2: [two_deep]}
        budget.timed_at = {(False, 2): budget.steps - age}  # when a two-deep step was last timed
        assert budget.choose() == expected, (two_deep, skip, age)
        assert budget.probes == 1  # it counted as the probe, taken or not: the next comes PROBE_GAPS later


def test_a_drafted_choice_holds_for_stay_steps():
    """Every change of depth switches the target's verify to another compiled graph whose first steps run cold: a
    drafted choice holds for STAY steps, even once plain steps rate best, then the budget chooses afresh."""
    budget = settled()
    budget.max_depth, budget.reached, budget.accepted = 1, [100.0], [90.0]
    budget.recent = {0: [0.010], 1: [0.012]}
    assert budget.choose() == 1
    budget.accepted = [0.0]  # the text turns: nothing is accepted any more, plain steps rate best
    held = [budget.choose() for _ in range(STAY - 1)]
    assert held == [1] * (STAY - 1)
    assert budget.choose() == 0


def test_forward_ratios_never_fall_as_tokens_grow():
    """A forward over more tokens does the work of one over fewer: a timing that says two tokens cost 0.95 of one is
    noise, and priced that way a one-deep draft looked cheaper than it ran (off the suite Medusa drafted at 1.2
    tokens a step where its steps cost 1.29 plain ones: 0.84-0.87x of plain decoding)."""
    assert monotone_ratios({1: 4.0, 2: 3.8, 3: 6.0, 4: 5.5, 5: 8.0}) == {1: 1.0, 2: 1.0, 3: 1.5, 4: 1.5, 5: 2.0}
    assert monotone_ratios({2: 3.0}) == {} and monotone_ratios({}) == {}
    budget = CostAwareBudget()
    budget.price_forwards(lambda widths: {k: 0.004 - 0.0002 * (k - 1) for k in widths})  # falling: noise
    assert budget.forward_ratios == {k: 1.0 for k in range(1, 6)}
    budget.plain_floor, budget.branched, budget.drafted, budget.narrow = 0.010, True, True, True
    budget.observe(1, tree(1).spine(), 1, 0.002, 0.028, [0])
    assert budget._narrow_seconds([1])[0] == pytest.approx(0.002 + 0.010)  # never below drafting plus a plain step


def test_before_a_run_drafts_a_cap_must_win_back_what_its_first_draft_costs_extra():
    """A run's first draft catches the drafter up on the prompt (ENTRY_COSTS): the latest runs' extra cost of it is
    remembered, and where drafting pays a little, a run with few tokens left keeps plain steps rather than pay it,
    while one with many left drafts at once."""

    def seconds_of(depth: int) -> float:  # one deep: 2 tokens in 18 ms against 10 ms plain steps, 1 ms a token won
        return 0.010 + 0.008 * depth

    memory: dict = {}
    budget = CostAwareBudget()
    budget.reset(memory)
    run(budget, 40, lambda d: d, seconds_of)  # the first run: warm-up, nothing priced its first draft
    budget.finish()
    assert memory["entry_costs"] == []
    budget.reset(memory)
    cap = budget.choose(200)
    assert cap == 1  # nothing tells what a first draft costs extra: draft
    budget.observe(cap, chain(1), 1, 0.0, seconds_of(1) + 0.050)  # the catch-up: 50 ms on top
    assert budget.entry_costs == [pytest.approx(0.050)]
    budget.finish()
    for left, expected in ((30, 0), (100, 1)):  # 30 tokens win back 30 ms, 100 win back 100 ms
        memory["probe_in"] = 50  # no probe due
        budget.reset(memory)
        assert budget.choose(left) == expected, left


def test_a_short_run_after_plain_steps_probes_at_its_start_only_where_a_probe_could_pay():
    """A probe the last run could not make (too few tokens left) is not carried as due at the next run's first step.
    A run too short for its probe at RUN_PROBE_AT probes at its first step only where that could pay: where a
    one-deep draft would save time even with every token accepted (cheap drafts), not where it could not."""
    from engine.budget.cost_aware import PROBE_HORIZON, RUN_PROBE_AT

    short = PROBE_HORIZON + RUN_PROBE_AT - 2  # tokens in each short run: at RUN_PROBE_AT too few are left to probe
    for per_depth, probes in ((0.020, False), (0.002, True)):  # a one-deep draft: 3 plain steps' cost, or 1.2
        memory: dict = {}
        budget = CostAwareBudget()
        budget.reset(memory)
        run(budget, 300, lambda d: 0, lambda d, k=per_depth: 0.010 + k * d)  # nothing accepted: plain steps win
        budget.finish()
        for _ in range(3):
            budget.reset(memory)
            caps = [budget.choose(short - i) for i in range(short)]
            for cap in caps:
                depth = 4 if cap is None else min(cap, 4)
                budget.observe(cap, chain(depth), 0, 0.0, 0.010 + per_depth * depth)
            budget.finish()
            assert (caps[0] != 0) == probes, (per_depth, caps)
            assert memory["plain_best"] or probes
            assert caps[1:] == [0] * (short - 1) or probes, caps  # no probe later in a short run
