"""How deep each step may draft. `FullBudget` lets the drafter's own settings decide (every step drafts in full);
`CostAwareBudget` picks, before each step, the depth cap that maximises expected tokens per second from what this run
has measured: the time of a step (drafting and verifying) at each depth it drafted, and the acceptance observed at
each depth (starting from what the last run of the same target and drafter learned, see `remembered`). A cap of 0
is a plain decoding step. Only the draft's size changes, never the acceptance rule, so output
stays exactly the target's.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.decoding.tree import Draft, is_chain, node_depths, spine_nodes
from engine.errors import GlanceError

WARMUP_STEPS = 3  # two full drafts, then one plain step: the two ends every cap lies between
EXPLORE_EVERY = 6  # then about every 6th step probes one depth past the best cap: the next estimate up stays fresh
DEEP_EVERY = 4  # and every 4th probe while drafting drafts uncapped, so deep acceptance is relearned
# ... while the whole draft rates at least this share of the best cap: a whole tree can cost three one-deep spines,
# and probing it where it cannot win costs more than it teaches.
DEEP_SHARE = 0.8
# Probes come 4 to 8 steps apart, not every 6th: code repeats in short periods, and a fixed interval that divides
# one keeps probing the same phase of it.
PROBE_GAPS = (EXPLORE_EVERY - 2, EXPLORE_EVERY + 2)
# A probe one depth past a drafted best is skipped where even full acceptance at that depth could not rate above the
# best (unless its price is stale): a head that is rarely right should not keep paying for deeper probes.
SKIP_HOPELESS = True
# While plain steps stay best, each probe comes twice as far after the last, up to 2**MAX_BACKOFF times: where
# drafting loses, regular probes cost a tenth of the run; the cap keeps a run able to notice when drafting pays again.
MAX_BACKOFF = 5
# Never more often than spends PROBE_SHARE of the run on probing: a probe from plain steps switches the target
# between graphs and runs cold, so an idle probe costs several plain steps.
PROBE_SHARE = 0.01
PROBE_COSTS = 5  # probes' costs remembered: the median spaces the next ones
# A probe's cost runs until PROBE_TAIL plain steps after it: the plain steps after a drafted one run cold for several
# steps, not one. The run's first drafted step (the drafter reading the prompt, paid once) is left out of it.
PROBE_TAIL = 4
# A narrow step (one spine) never timed costs a plain step plus this share of one per spine token: about what
# verifying one more token costs on a CPU.
NARROW_GUESS = 0.1
# A spine d deep costs at most its drafting plus a plain step scaled by the target's steady forward cost of d + 1
# tokens (timed once a session for 1 to SPINE_WIDTHS tokens): a price set by cold steps would otherwise stay, since a
# narrow step is timed only when chosen.
SPINE_WIDTHS = 5
BOUND_ALWAYS = True  # apply that bound to every price, not only stale ones: with STAY, few switches are paid
STALE_STEPS = 24  # with BOUND_ALWAYS off: a price this many steps old is stale
# Acceptance counts fade by this every step, drafted or plain (about the latest 33 steps weigh): text changes, and a
# run's first stretch must not outweigh the rest.
FADE = 0.97
QUIET = 8  # while plain steps are best, the caps are re-rated every QUIET steps only: nothing else moves between probes
# A new run is new text: where plain steps were best, its first probe comes RUN_PROBE_AT steps in at the latest,
# whatever back-off the last runs built up; a run too short for that probes at its first step where a fully
# accepted draft could win back its cost.
RUN_PROBE_AT = 16
KEEP = 5  # steps remembered per depth: the context grows and costs drift with it
# A run starts from the last run of the same target, drafter settings, batch size and sampling (its step costs, its
# acceptance counted as at most PRIOR_WEIGHT drafts): the warm-up's two full drafts cost more than a short run wins.
PRIOR_WEIGHT = 8
# Before a run has drafted, a cap is taken only when the tokens left would win back what a run's first draft costs
# extra (the drafter's catch-up over the prompt): the median of the latest ENTRY_COSTS runs' extra cost.
ENTRY_COSTS = 5
# While plain steps are best, a probe needs this many tokens left: one that finds drafting pays must have steps left
# to win back its cost.
PROBE_HORIZON = 24
# A plain step costs the median of the latest PLAIN_RUNS runs' at this batch size (and this run's once it has
# PLAIN_MIN), each run's being a low quantile of its steady plain steps: the step after a drafted one runs cold, and
# the host's speed drifts, so neither the mean nor the fastest run is a fair price.
PLAIN_RUNS = 4
PLAIN_QUANTILE = 0.2  # about the fastest of five (what a run of plain steps measured before)
PLAIN_KEEP = 64
PLAIN_MIN = 5  # this run's plain steps before their quantile counts
# Where no run has measured a steady plain step, the warm-up's plain step runs on until this many steady ones are
# timed: plain steps after drafted ones settle over four to six steps, and a cold price makes drafting look cheap.
PLAIN_BLOCK = 6
# The first SETTLE drafted steps after a plain one go untimed, and a probe from plain steps drafts SETTLE + 1 steps
# when its first accepted anything: the switch-in steps catch the drafter up and bring the weights back into cache.
SETTLE = 2
# A drafted choice holds for STAY steps (a probe may still come in between): every change of depth switches the
# target's verify between compiled graphs, and the first steps after a switch run cold.
STAY = 8
# A deeper or wider draft must rate this much above a one-deep one to be chosen: their extra verify rows cost more
# than the steady forward timing tells, while where deep drafts really pay (a GPU) they rate far above the margin.
DEEPER_MARGIN = 0.15
# A batch size the drafter never drafted at starts from the nearest size's snapshot (acceptance as the prior, prices
# scaled by the two sizes' plain steps, all stale) instead of the warm-up's full drafts, which short batched runs
# cannot win back.
SEED_ROWS = True
_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target module -> {run key: snapshot}
_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {batch size: [a run's plain step]}


def remembered(target, drafter, rows: int, sampling) -> dict:
    """The slot a budget reads before a run of `drafter` on `target` and writes after it: one per drafter settings,
    batch size and sampling setting, kept as long as the target is loaded. Its "plain" list, the plain step cost of each
    of the latest runs at this batch size, is shared by every drafter's slot, plain decoding's included."""
    settings = json.dumps(drafter.settings(), sort_keys=True, default=str)
    key = (drafter.name, settings, rows, sampling.temperature, sampling.top_p)
    slots = _MEMORY.setdefault(target, {})
    slot = slots.setdefault(key, {})
    slot.setdefault("plain", _PLAIN.setdefault(target, {}).setdefault(rows, []))
    slot.pop("seed", None)
    if "recent" not in slot and SEED_ROWS:  # never drafted at this batch size: the nearest one's, if any
        near = [k for k, s in slots.items() if k[2] != rows and k[:2] + k[3:] == key[:2] + key[3:] and "recent" in s]
        if near:
            slot["seed"] = slots[min(near, key=lambda k: (abs(math.log(k[2] / rows)), k[2]))]
    return slot


def _seeded(memory: dict) -> dict | None:
    """What a run at a batch size that never drafted starts from (SEED_ROWS): the nearest batch size's snapshot, its
    seconds scaled by the two batch sizes' plain steps, every price stale (none was timed at this size). None where
    either plain step is unknown."""
    seed = memory.get("seed")
    if not seed or not memory.get("plain") or not seed.get("plain"):
        return None
    scale = _median(memory["plain"]) / _median(seed["plain"])
    out = dict(seed, plain=memory["plain"], timed_ages=[], probes=0, idle_probes=0, probe_in=RUN_PROBE_AT)
    for name in ("recent", "narrow_recent", "draft_recent"):
        out[name] = {d: [t * scale for t in v] for d, v in seed.get(name, {}).items()}
    for name in ("probe_costs", "entry_costs"):
        out[name] = [t * scale for t in seed.get(name, [])]
    return out


def _quantile(values: list[float], q: float) -> float:
    """The value a fraction `q` of the way up the sorted list (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def _median(values: list[float]) -> float:
    """statistics.median of a short list, without its overhead."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def monotone_ratios(costs: dict[int, float]) -> dict[int, float]:
    """{tokens: a forward's cost against one token's}, never falling as tokens grow and never below 1: a forward over
    more tokens does the work of one over fewer, and a timing that says otherwise is noise (which priced one-deep
    drafts below a plain step's verify; see engine.runtime.forward_timing.RUNS). Empty without a one-token cost."""
    if not costs.get(1):
        return {}
    ratios, top = {}, 1.0
    for k in sorted(costs):
        top = max(top, costs[k] / costs[1])
        ratios[k] = top
    return ratios


class FullBudget:
    """Every step drafts as much as the drafter's settings allow (the behaviour of the papers' loops)."""

    name = "full"
    narrow = False  # whether the step `choose` last capped verifies only its draft's greedy spine (Draft.spine)

    def reset(self, memory: dict | None = None) -> None:
        """Start a run: forget the previous one, then read what `memory` (a `remembered` slot) kept, if anything."""

    def finish(self) -> None:
        """The run ended: write what it learned to the memory `reset` was given."""

    def price_forwards(self, measure: Callable[[tuple[int, ...]], dict[int, float]]) -> None:
        """After `reset`: `measure(widths)` gives the target's steady forward seconds per token count (cost-aware
        budgets price a spine's verify with it; see SPINE_WIDTHS). A full budget measures nothing."""

    def choose(self, left: int | None = None) -> int | None:
        """The depth cap for the next step; None: no cap. `left`: the most tokens any row may still emit."""
        return None

    def observe(
        self,
        cap: int | None,
        draft: Draft,
        accepted: int,
        draft_s: float,
        verify_s: float,
        path: list[int] | None = None,
    ) -> None:
        """What the step that ran under `cap` drafted, how many of its tokens were accepted (`path`: which nodes, root
        to leaf, where known), and what it cost: a batch step of one row."""
        self.observe_rows(cap, [draft], [accepted], draft_s, verify_s, None if path is None else [path])

    def observe_rows(
        self,
        cap: int | None,
        drafts: list[Draft],
        accepted: list[int],
        draft_s: float,
        verify_s: float,
        paths: list[list[int]] | None = None,
        timed: bool = True,
    ) -> None:
        """A batch step: every row's draft and accepted count (and nodes), and what the whole step cost (`timed`
        False: a cost that says nothing of the step's depth, such as a row's first draft reading its prompt)."""

    def hindsight(self, matches: list[bool], first: list[bool] | None = None, depth: int | None = None) -> None:
        """Whether a greedy draft would have guessed each of a run of committed tokens nobody drafted
        (Drafter.hindsight); `first`: whether a tree's first choice would have (None: a chain's, `matches`);
        `depth`: how deep the drafter's guesses tell (None: a chain's, as deep as the run)."""


@dataclass
class CostAwareBudget(FullBudget):
    """The depth cap with the most expected tokens per second, re-chosen every step.

    Expected tokens at cap D: 1 + the chance the accepted path gets through depth 1, 2, ... D: the product of the
    acceptance seen at each depth *given* the path got that far (any draft that reached a depth with its path still
    alive tells, whatever its cap). Seconds at cap D: the median of the latest steps that drafted D deep (draft plus
    verify), linear between measured depths, flat beyond them."""

    name = "auto"
    steps: int = 0
    max_depth: int = 0  # deepest draft seen in this run
    # per depth (index 0 = depth 1): steps whose draft reached it with the accepted path alive at the depth above
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)  # ... and whose accepted path got through it
    recent: dict[int, list[float]] = field(default_factory=dict)  # depth drafted -> seconds of its latest steps
    plain_floor: float = float("inf")  # a plain step's cost: the median of the latest runs' and this run's
    remembered_plain: list[float] = field(default_factory=list)  # the latest runs' (each its PLAIN_QUANTILE)
    plain_times: list[float] = field(default_factory=list)  # this run's steady plain steps, the latest PLAIN_KEEP
    drafted: bool = False  # whether a step of this run has drafted yet (the first is not timed)
    # The greedy spine (Draft.spine) of drafters whose drafts branch: a narrow cap verifies only the chain of first
    # children. Its acceptance per depth is counted on every drafted step (whether the accepted path followed the
    # spine), its seconds on narrow steps only; wide stats count wide steps only (a spine says nothing of siblings).
    branched: bool = False  # whether any draft of this run (or the last) branched: only then are narrow caps offered
    spine_reached: list[float] = field(default_factory=list)
    spine_accepted: list[float] = field(default_factory=list)
    narrow_recent: dict[int, list[float]] = field(default_factory=dict)  # spine depth -> seconds of latest steps
    draft_recent: dict[int, list[float]] = field(default_factory=dict)  # depth -> drafting seconds of latest steps
    forward_ratios: dict[int, float] = field(default_factory=dict)  # tokens -> a forward's cost against one token's
    timed_at: dict[tuple[bool, int], int] = field(default_factory=dict)  # (narrow, depth) -> step last timed
    quiet_until: int = 0  # plain steps without re-rating until this step (QUIET)
    last_depth: int = 0  # the previous step's deepest draft (a drafted step after a plain one is not timed)
    # drafted steps in a row since the last plain step (the first `settle` are not timed); None: no plain step yet
    in_row: int | None = None
    hold: tuple[int | None, bool, int] | None = None  # a probe's (cap, narrow, steps left): past the settling steps
    probes: int = 0
    idle_probes: int = 0  # probes in a row made while plain steps were best
    probe_costs: list[float] = field(default_factory=list)  # seconds each latest idle probe cost (PROBE_SHARE)
    entry_costs: list[float] = field(default_factory=list)  # the latest runs' first drafted steps beyond their price
    plain_best: bool = False  # whether the latest rating found plain steps best (the next run's first probe)
    probe_open: float | None = None  # the cost so far of the idle probe under way
    probe_tail: int = 0  # plain steps since the idle probe under way drafted
    next_probe: int = WARMUP_STEPS + EXPLORE_EVERY
    rng: random.Random = field(default_factory=lambda: random.Random(0))  # seeded: a run's caps are reproducible
    # kept across `reset` (what tests and A/B runs vary)
    fade: float = FADE
    plain_quantile: float = PLAIN_QUANTILE
    run_probe_at: int | None = RUN_PROBE_AT
    settle: int = SETTLE
    bound_always: bool = BOUND_ALWAYS
    stay: int = STAY
    deeper_margin: float = DEEPER_MARGIN
    skip_hopeless: bool = SKIP_HOPELESS
    stay_left: int = 0  # steps the latest drafted choice still holds (STAY)
    stay_choice: tuple[int, bool] = (0, False)  # ... and that choice: (cap, narrow)

    memory: dict | None = field(default=None, repr=False)  # the `remembered` slot of this run

    def reset(self, memory: dict | None = None) -> None:
        self.__init__(
            fade=self.fade,
            plain_quantile=self.plain_quantile,
            run_probe_at=self.run_probe_at,
            settle=self.settle,
            bound_always=self.bound_always,
            stay=self.stay,
            deeper_margin=self.deeper_margin,
            skip_hopeless=self.skip_hopeless,
        )
        self.memory = memory
        if memory and "recent" not in memory:
            memory = _seeded(memory) or memory
        if memory and memory.get("plain"):
            self.remembered_plain = list(memory["plain"])
            self.plain_floor = _median(self.remembered_plain)
        if memory and "recent" in memory:  # no warm-up: the last run measured plain steps and full drafts
            self.recent = {d: list(v) for d, v in memory["recent"].items()}
            scale = min(1.0, PRIOR_WEIGHT / max(memory["reached"][0], 1.0)) if memory["reached"] else 1.0
            self.reached = [r * scale for r in memory["reached"]]
            self.accepted = [a * scale for a in memory["accepted"]]
            self.max_depth = memory["max_depth"]
            self.branched = memory.get("branched", False)
            if "spine_reached" in memory:
                self.spine_reached = [r * scale for r in memory["spine_reached"]]
                self.spine_accepted = [a * scale for a in memory["spine_accepted"]]
                self.narrow_recent = {d: list(v) for d, v in memory["narrow_recent"].items()}
                self.draft_recent = {d: list(v) for d, v in memory.get("draft_recent", {}).items()}
            self.steps = WARMUP_STEPS
            self.timed_at = {(n, d): self.steps - age for n, d, age in memory.get("timed_ages", [])}
            # probes keep their pace across runs (reset every run, runs of 32 tokens ended before the first probe,
            # and plain steps were kept for good), but a new text is probed early (RUN_PROBE_AT)
            self.probes, self.idle_probes = memory.get("probes", 0), memory.get("idle_probes", 0)
            self.probe_costs = list(memory.get("probe_costs", []))
            self.entry_costs = list(memory.get("entry_costs", []))
            probe_in = memory.get("probe_in", self.rng.randint(*PROBE_GAPS))
            if self.run_probe_at is not None:  # where plain steps were best, at RUN_PROBE_AT: no sooner, no later
                probe_in = self.run_probe_at if memory.get("plain_best") else min(probe_in, self.run_probe_at)
            self.next_probe = self.steps + probe_in

    def finish(self) -> None:
        if self.memory is not None and self.plain_times:
            floors = self.memory.setdefault("plain", [])
            floors.append(_quantile(self.plain_times, self.plain_quantile))
            del floors[:-PLAIN_RUNS]
        if self.memory is not None and self.max_depth > 0 and 0 in self.recent:
            self.memory.update(
                recent={d: list(v) for d, v in self.recent.items()},
                reached=list(self.reached),
                accepted=list(self.accepted),
                max_depth=self.max_depth,
                branched=self.branched,
                spine_reached=list(self.spine_reached),
                spine_accepted=list(self.spine_accepted),
                narrow_recent={d: list(v) for d, v in self.narrow_recent.items()},
                draft_recent={d: list(v) for d, v in self.draft_recent.items()},
                timed_ages=[(n, d, self.steps - at) for (n, d), at in self.timed_at.items()],
                probes=self.probes,
                idle_probes=self.idle_probes,
                probe_costs=list(self.probe_costs),
                entry_costs=list(self.entry_costs),
                probe_in=max(0, self.next_probe - self.steps),
                plain_best=self.plain_best,
            )

    def price_forwards(self, measure: Callable[[tuple[int, ...]], dict[int, float]]) -> None:
        self.forward_ratios = monotone_ratios(measure(tuple(range(1, SPINE_WIDTHS + 1))))

    def choose(self, left: int | None = None) -> int | None:
        self.narrow = False
        if self.steps < WARMUP_STEPS - 1 or self.max_depth == 0:
            return None
        if self.steps == WARMUP_STEPS - 1:
            return 0  # measure a plain step: the baseline every cap must beat
        if not self.remembered_plain and len(self.plain_times) < PLAIN_BLOCK:
            return 0  # ... and where no run measured one, steady plain steps (see PLAIN_BLOCK)
        if self.hold is not None:
            cap, self.narrow, left = self.hold
            self.hold = (cap, self.narrow, left - 1) if left > 1 else None
            return cap
        if self.stay_left > 0 and self.steps < self.next_probe:
            self.stay_left -= 1  # a drafted choice holds (see STAY)
            cap, self.narrow = self.stay_choice
            return cap
        if self.steps < self.quiet_until and self.steps < self.next_probe:
            return 0  # plain steps were best and nothing has been learned since (see QUIET)
        best, narrow, spine_first, whole_share = self._best()
        if best > 0 and not self.drafted and not self._repays_entry(best, narrow, left):
            best = 0  # this run has not drafted yet, and drafting would not win back its first draft (ENTRY_COSTS)
        self.plain_best = best == 0
        if best == 0 and self.steps == WARMUP_STEPS and not self.drafted and self._probe_at_start(left):
            self.next_probe = self.steps  # too short a run for its probe at RUN_PROBE_AT: now, where it could pay
        self.quiet_until = self.steps + QUIET if best == 0 else 0
        if best > 0:
            self.probe_open = None  # a probe from plain steps found that drafting pays: it cost nothing
        if best == 0 and left is not None and left < PROBE_HORIZON:
            return 0  # too late in the run for a probe to pay for itself
        if self.steps >= self.next_probe:  # a probe: one depth past the best, now and then uncapped
            # (it used to alternate uncapped drafts with every cap in turn: where plain steps win, each such probe
            # cost several plain steps, and the budget's own measuring held drafters below 1x off the suite)
            self.idle_probes = self.idle_probes + 1 if best == 0 else 0
            backoff = 2 ** min(self.idle_probes - 1, MAX_BACKOFF) if self.idle_probes else 1
            gap = self.rng.randint(*PROBE_GAPS) * backoff
            if best == 0 and self.probe_costs and self.plain_floor < float("inf"):
                share = _median(self.probe_costs) / (PROBE_SHARE * max(self.plain_floor, 1e-9))  # steps apart
                gap = max(gap, int(share * self.rng.uniform(1.0, 1.5)))  # jittered: no fixed period (PROBE_GAPS)
            self.next_probe = self.steps + gap
            self.probes += 1
            # no uncapped probe while plain steps are best: a full tree there cost 3 plain steps off the suite (27 ms
            # against 8.5) for 1-4 tokens, so probes climb one depth at a time until drafting pays; a narrow best
            # climbs its spine, and every DEEP_EVERY-th probe drafts the whole tree (wide stats stay fresh) where
            # that rates near the best (DEEP_SHARE)
            deep = self.probes % DEEP_EVERY == 0 and best > 0 and whole_share > DEEP_SHARE
            cap = None if deep or best >= self.max_depth else best + 1
            hopeless = cap is not None and best > 0 and self.skip_hopeless and self._hopeless(cap, narrow, best)
            if not hopeless:  # (an uncapped probe, cap None, is never skipped)
                self.narrow = cap is not None and (narrow or (best == 0 and spine_first))
                self.hold = (cap, self.narrow, self.settle) if self.last_depth == 0 else None  # from plain: SETTLE
                if best == 0 and self.last_depth == 0:
                    self.probe_open, self.probe_tail = 0.0, 0  # an idle probe: its cost counts until PROBE_TAIL
                return cap
        self.narrow = narrow
        if best > 0:
            self.stay_left, self.stay_choice = self.stay - 1, (best, narrow)
        return best

    def _best(self) -> tuple[int, bool, bool, float]:
        """The best cap, whether it is narrow, whether a one-deep spine rates above a one-deep tree (what a probe
        from plain steps drafts), and the whole draft's rate as a share of the best cap's (DEEP_SHARE). Anything
        deeper or wider than one token must rate DEEPER_MARGIN above a one-deep draft to be chosen."""
        caps = range(self.max_depth + 1)
        seconds = self._seconds(caps)  # every cap's estimate from one pass over the measured depths
        tokens = self._expected(self.max_depth, *self._tree_counts())  # and every cap's expected tokens
        rates = [t / max(sec, 1e-9) for t, sec in zip(tokens, seconds)]
        best = max(caps, key=rates.__getitem__)
        whole = rates[-1]  # every depth: an uncapped draft
        if not self.branched:
            if best > 1 and rates[0] < rates[1] and rates[best] < rates[1] * (1 + self.deeper_margin):
                best = 1
            return best, False, False, whole / max(rates[best], 1e-9)
        spine_seconds = self._narrow_seconds(caps)
        spine_tokens = self._expected(self.max_depth, self.spine_reached, self.spine_accepted)
        spine_rates = [t / max(sec, 1e-9) for t, sec in zip(spine_tokens, spine_seconds)]
        spine_best = max(caps[1:], key=spine_rates.__getitem__)
        top = max(spine_rates[spine_best], rates[best])
        if rates[0] < spine_rates[1] and top < spine_rates[1] * (1 + self.deeper_margin):
            return 1, True, True, whole / max(spine_rates[1], 1e-9)  # the one-deep spine (see DEEPER_MARGIN)
        if spine_rates[spine_best] > rates[best]:
            return spine_best, True, True, whole / max(spine_rates[spine_best], 1e-9)
        return best, False, spine_rates[1] > rates[1], whole / max(rates[best], 1e-9)

    def _hopeless(self, cap: int, narrow: bool, best: int) -> bool:
        """Whether drafting `cap` deep (its spine when `narrow`) would rate below the `best` cap even if every path
        that reached its deepest level were accepted there (SKIP_HOPELESS). Never while its price is stale (not
        timed in the last STALE_STEPS steps): a price set by cold steps would otherwise stand for good."""
        if not self._fresh(narrow, cap):
            return False
        reached, accepted = (self.spine_reached, self.spine_accepted) if narrow else self._tree_counts()
        upto = self._expected(cap - 1, reached, accepted)  # expected tokens at caps 0 .. cap - 1
        through = upto[-1] - upto[-2] if cap > 1 else 1.0  # the chance a path gets through depth cap - 1
        rate_best = self._expected(best, reached, accepted)[-1] / max(self._step_seconds(best, narrow), 1e-9)
        return (upto[-1] + through) / max(self._step_seconds(cap, narrow), 1e-9) < rate_best

    def _probe_at_start(self, left: int | None) -> bool:
        """Whether a run too short for its probe at RUN_PROBE_AT probes now: whether a one-deep draft with every token
        accepted would save more over the `left` tokens than a run's first draft costs extra and an idle probe costs
        (the medians of the latest runs')."""
        if left is None or self.run_probe_at is None or left >= self.run_probe_at + PROBE_HORIZON:
            return False
        if self.plain_floor == float("inf"):
            return False
        cost = sum(_median(costs) for costs in (self.entry_costs, self.probe_costs) if costs)
        return left * (self.plain_floor - self._step_seconds(1, self.branched) / 2) > cost

    def _repays_entry(self, cap: int, narrow: bool, left: int | None) -> bool:
        """Whether drafting at `cap` (its spine when `narrow`) for the `left` tokens still to come saves more than
        the median extra cost of the latest runs' first drafted steps (True when nothing tells)."""
        if left is None or not self.entry_costs or self.plain_floor == float("inf"):
            return True
        counts = (self.spine_reached, self.spine_accepted) if narrow else self._tree_counts()
        per_token = self._step_seconds(cap, narrow) / max(self._expected(cap, *counts)[-1], 1e-9)
        return left * (self.plain_floor - per_token) > _median(self.entry_costs)

    def _step_seconds(self, cap: int, narrow: bool) -> float:
        """The predicted seconds of a step at `cap`: its spine's when `narrow`, else the draft's."""
        return (self._narrow_seconds if narrow else self._seconds)([cap])[0]

    def expected_tokens(self, cap: int) -> float:
        """1 (the target's own token) plus, per depth, the chance the accepted path gets that deep: the product of
        the conditional acceptance of every depth down to it."""
        return self._expected(min(cap, self.max_depth))[-1]

    def _expected(self, deepest: int, reached: list[float] | None = None, accepted: list[float] | None = None):
        """`expected_tokens` of every cap from 0 to `deepest` in one pass: `choose` runs every step, and a cap at a
        time cost it a pass per cap (8 us a step at depth 7, where a plain step costs 2.7 ms). With `reached` and
        `accepted`, another set of counts per depth (the spine's)."""
        reached = self.reached if reached is None else reached
        accepted = self.accepted if accepted is None else accepted
        totals, total, through = [1.0], 1.0, 1.0
        for k in range(deepest):
            through *= (accepted[k] + 1) / (reached[k] + 2)  # Laplace: an unseen depth counts as 1/2
            total += through
            totals.append(total)
        return totals

    def seconds(self, cap: int) -> float:
        """Predicted seconds of a step drafting `cap` deep: the median of the latest steps at each measured depth
        (one step stalled by the machine must not move an estimate), linear between them, flat beyond. Only steady
        steps count: a drafted step right after a plain one pays to catch the drafter up and to bring the target's
        weights back into the cache, once per switch, and so does the plain step after a drafted one. A plain step
        costs the median of the latest runs' low quantiles and this run's (PLAIN_QUANTILE: every plain step has the
        same shape over a static cache; see PLAIN_RUNS)."""
        return self._seconds([cap])[0]

    def _seconds(self, caps) -> list[float]:
        """Plain Python: a handful of depths and at most KEEP steps each (numpy's interp and statistics' median took
        about 45 us a step here, for a few dozen numbers)."""
        known = sorted(self.recent)
        plain = self.plain_floor if self.plain_floor < float("inf") else min(self.recent.get(0, [0.0]))
        if not known:  # nothing measured in this run or the last: a plain step's remembered cost, if any
            return [plain for _ in caps]
        medians = [plain if d == 0 else self._chain_median(d, plain) for d in known]
        out = []
        for cap in caps:
            if cap <= known[0]:
                out.append(medians[0])
            elif cap >= known[-1]:
                out.append(medians[-1])
            else:
                i = bisect.bisect_right(known, cap)  # known[i - 1] <= cap < known[i]
                lo, hi = known[i - 1], known[i]
                out.append(medians[i - 1] + (medians[i] - medians[i - 1]) * (cap - lo) / (hi - lo))
        return out

    def _tree_counts(self) -> tuple[list[float], list[float]]:
        """The tree's counts per depth, each depth's rate raised to the spine's where that is higher (a tree holds its
        spine: while narrow steps run, the tree's own counts stand still and the spine's tell the text has changed)."""
        if not self.branched:
            return self.reached, self.accepted
        reached, accepted = [], []
        for r, a, sr, sa in zip(self.reached, self.accepted, self.spine_reached, self.spine_accepted):
            if (sa + 1) * (r + 2) > (a + 1) * (sr + 2):
                r, a = sr, sa
            reached.append(r)
            accepted.append(a)
        return reached, accepted

    def _narrow_seconds(self, caps) -> list[float]:
        """Predicted seconds of a narrow step per spine depth: the median of its latest steps at each measured depth,
        a plain step at depth 0, linear between; beyond the deepest measured, the last stretch's slope goes on (a
        spine's extra token costs a verify row, never nothing), and with none measured each depth adds NARROW_GUESS of
        a plain step (optimistic: the first narrow steps measure it)."""
        plain = self.plain_floor if self.plain_floor < float("inf") else min(self.recent.get(0, [0.0]))
        known = [0] + sorted(d for d in self.narrow_recent if d > 0)
        medians = [plain] + [self._narrow_median(d, plain) for d in known[1:]]
        if len(known) == 1:
            slope = NARROW_GUESS * plain
        else:
            slope = max((medians[-1] - medians[-2]) / (known[-1] - known[-2]), NARROW_GUESS * plain / 2)
        out = []
        for cap in caps:
            if cap >= known[-1]:
                out.append(medians[-1] + slope * (cap - known[-1]))
            else:
                i = bisect.bisect_right(known, cap)  # known[i - 1] <= cap < known[i]
                lo, hi = known[i - 1], known[i]
                out.append(medians[i - 1] + (medians[i] - medians[i - 1]) * (cap - lo) / (hi - lo))
        return out

    def _narrow_median(self, depth: int, plain: float) -> float:
        """The median of the spine's latest steps at `depth`, bounded while stale (see SPINE_WIDTHS)."""
        ratio = self.forward_ratios.get(depth + 1, 1 + NARROW_GUESS * depth)
        return self._bounded(_median(self.narrow_recent[depth]), True, depth, plain, ratio)

    def _chain_median(self, depth: int, plain: float) -> float:
        """The median of the latest steps at `depth`; a chain's (a draft that never branched verifies depth + 1
        tokens) bounded while stale, as a spine's (vanilla's one-deep chain stayed priced at 6.4-7.0 ms from cold
        probes against 4.1-4.3 ms plain steps). A tree verifies more than its depth tells: its price stands."""
        ratio = None if self.branched else self.forward_ratios.get(depth + 1)
        return self._bounded(_median(self.recent[depth]), False, depth, plain, ratio)

    def _bounded(self, measured: float, narrow: bool, depth: int, plain: float, ratio: float | None) -> float:
        """`measured`, or at most drafting `depth` deep plus a plain step scaled by `ratio` (the forward of depth + 1
        tokens against one's; None: no bound); with `bound_always` off, only once stale (STALE_STEPS)."""
        if ratio is None or depth not in self.draft_recent or (not self.bound_always and self._fresh(narrow, depth)):
            return measured
        return min(measured, _median(self.draft_recent[depth]) + plain * ratio)

    def _fresh(self, narrow: bool, depth: int) -> bool:
        """Whether a step at `depth` (a spine's when `narrow`) was timed in the last STALE_STEPS steps."""
        return self.steps - self.timed_at.get((narrow, depth), -STALE_STEPS - 1) <= STALE_STEPS

    def rate(self, cap: int) -> float:
        return self.expected_tokens(cap) / max(self.seconds(cap), 1e-9)

    def hindsight(self, matches: list[bool], first: list[bool] | None = None, depth: int | None = None) -> None:
        """A chain drafted at each of these positions would have had its tokens accepted up to the first miss: counted
        like a drafted step's (depth k + 1 only where the path got through depth k), as deep as the deepest draft
        seen, the known positions and `depth` allow (EAGLE's catch-up tells depth 1 only: deeper guesses would have
        read its own predicted features). No seconds: no step ran. Where plain steps are best, the probes after
        them learn one draft each; the draft's catch-up over the plain steps' tokens tells about every position.
        A tree's `first` counts for its greedy spine: without it the spine's rate stood still while plain steps ran,
        and off the suite one prompt where EAGLE-3's first choices missed kept it at plain steps through the next
        three, where its one-deep spine paid."""
        deepest = min(self.max_depth, depth or self.max_depth)
        self._count_runs(matches, deepest, self.reached, self.accepted)
        if first is not None:
            self._count_runs(first, deepest, self.spine_reached, self.spine_accepted)

    def _forget(self) -> None:
        """Fade every acceptance count by `fade`: once a step, drafted or not (the text moves on either way; a plain
        step's own tokens come later as hindsight, counted afresh)."""
        if self.fade < 1.0:
            keep = self.fade
            for counts in (self.reached, self.accepted, self.spine_reached, self.spine_accepted):
                for k in range(len(counts)):
                    counts[k] *= keep

    @staticmethod
    def _count_runs(matches: list[bool], deepest: int, reached: list[float], accepted: list[float]) -> None:
        """Add, per depth, the chains from each position that got that far and those whose token there matched."""
        n = len(matches)
        for j in range(n):
            for k in range(min(deepest, n - j)):
                reached[k] += 1
                if not matches[j + k]:
                    break
                accepted[k] += 1

    def observe_rows(
        self,
        cap: int | None,
        drafts: list[Draft],
        accepted: list[int],
        draft_s: float,
        verify_s: float,
        paths: list[list[int]] | None = None,
        timed: bool = True,
    ) -> None:
        """Acceptance per depth from every row; the step's seconds under its deepest draft (not where `timed` is
        False). Expected tokens are per row and the seconds per batch step, so the best cap maximises the batch's
        tokens per second."""
        self.steps += 1
        self._forget()
        deepest = 0
        for i, (draft, got) in enumerate(zip(drafts, accepted)):
            depth = max(node_depths(draft.parents), default=0)
            deepest = max(deepest, depth)
            if depth > self.max_depth:
                grow = depth - self.max_depth
                for counts in (self.reached, self.accepted, self.spine_reached, self.spine_accepted):
                    counts += [0.0] * grow
                self.max_depth = depth
            spine, branches = spine_nodes(draft.parents), not is_chain(draft.parents)  # a path is a chain
            self.branched = self.branched or branches
            path = paths[i] if paths is not None else (list(range(got)) if not branches else None)
            for k in range(len(spine) if path is not None else 0):  # did the accepted path follow the spine?
                self.spine_reached[k] += 1
                if k >= len(path) or path[k] != spine[k]:
                    break
                self.spine_accepted[k] += 1
            if self.narrow:
                continue  # a spine tells nothing of the tree's other branches
            # Conditional counts: depth k + 1 was tried only if the path got through depth k. (Counting every
            # draft that reached a depth made the product above multiply unconditional rates: with one in three
            # first tokens accepted and nearly every second one after it, depth 2 counted as 1/3 x 1/3, not 1/3 x 1,
            # and the budget drafted too shallow off the suite.)
            for k in range(min(depth, got + 1)):
                self.reached[k] += 1
                self.accepted[k] += k < got
        if deepest == 0 and self.last_depth == 0:  # a steady plain step (one after a drafted step runs cold)
            self.plain_times.append(draft_s + verify_s)
            del self.plain_times[:-PLAIN_KEEP]
            runs = self.remembered_plain
            if len(self.plain_times) >= PLAIN_MIN or not runs:
                runs = runs + [_quantile(self.plain_times, self.plain_quantile)]
            self.plain_floor = _median(runs)
        if self.probe_open is not None and self.plain_floor < float("inf"):
            tokens = 1 + sum(accepted) / max(len(accepted), 1)  # per row: what plain steps would have taken
            if timed and (deepest == 0 or self.drafted):  # not the run's first draft (see PROBE_TAIL)
                self.probe_open += draft_s + verify_s - tokens * self.plain_floor
            self.probe_tail = self.probe_tail + 1 if deepest == 0 else 0
            if self.probe_tail >= PROBE_TAIL:  # the cold plain steps after the probe are over
                self.probe_costs.append(max(self.probe_open, 0.0))
                del self.probe_costs[:-PROBE_COSTS]
                self.probe_open = None
        self.last_depth = deepest
        self.in_row = 0 if deepest == 0 else None if self.in_row is None else self.in_row + 1
        if self.hold is not None and self.in_row == 1 and not any(accepted):
            self.hold = None  # the probe's first draft missed outright: no settled step to time (drafting rarely pays)
        if deepest > 0 and not self.drafted:
            self.drafted = True
            if self.recent:  # what it cost beyond the price of its kind of step (ENTRY_COSTS)
                self.entry_costs.append(max(draft_s + verify_s - self._step_seconds(deepest, self.narrow), 0.0))
                del self.entry_costs[:-ENTRY_COSTS]
            return  # the run's first drafted step feeds the drafter the whole prompt: its time says nothing later
        if not timed:
            return  # likewise a row that joined the batch mid-run (engine/decoding/batch.py: continuous batching)
        if self.in_row is not None and 0 < self.in_row <= self.settle:
            return  # its time is the switch's, not its depth's (see SETTLE)
        if deepest:
            drafting = self.draft_recent.setdefault(deepest, [])
            drafting.append(draft_s)
            del drafting[:-KEEP]
        kept = (self.narrow_recent if self.narrow and deepest else self.recent).setdefault(deepest, [])
        kept.append(draft_s + verify_s)
        del kept[:-KEEP]
        self.timed_at[(self.narrow and deepest > 0, deepest)] = self.steps


BUDGETS = {"full": FullBudget, "auto": CostAwareBudget}


def make_budget(name: str) -> FullBudget:
    """A budget policy by name ("full" or "auto")."""
    if name not in BUDGETS:
        raise GlanceError(f"unknown draft budget {name!r}: choose one of {', '.join(BUDGETS)}")
    return BUDGETS[name]()
