"""How each step drafts, chosen by what this run measured: the draft shape with the most expected tokens per second.

A shape is a depth cap (0: a plain step), for a tree also its greedy spine alone (`narrow`), or for lookahead its
window or none. Expected tokens per row of a shape: 1 + sum over depths d of P(the path gets through d), the product
of each depth's acceptance given the path got there (decaying counts, fed by every step and, where the drafter gives
it, by hindsight over the plain steps' tokens). Seconds of a shape: what its steps took (a decaying average), or,
before one ran, the plain step scaled by the target's measured forward cost at the shape's width (this batch size)
plus the drafter's seconds per depth. Each step takes the best rate, with an optimistic bonus for shapes tried
little lately (so new ones get tried, and old ones again after a while) and a small margin before it switches.
Only the draft's size changes, never the acceptance rule: output stays exactly the target's.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable

from engine.decoding.tree import Draft, is_chain, node_depths, spine_nodes
from engine.errors import GlanceError

FADE = 0.95  # acceptance counts fade by this a step: the latest ~20 steps weigh most, as the text moves on
TIME_WEIGHT = 0.3  # a shape's seconds: a running average giving its newest step this weight (steps drift)
BONUS = 0.3  # a shape tried n times rates (1 + BONUS / (1 + n)) of its estimate: untried ones get tried
SWITCH = 0.05  # another draft shape must rate this much above the running one: steps after a switch run cold
PRIOR = 0.5  # depth 1's acceptance before anything told about it; a deeper depth's is the depth above's
PRIOR_STEPS = 8  # a run starts from the last run's counts, weighed as at most this many steps
PRICE_WIDTHS = (1, 2, 4, 8, 16, 32)  # the target's forward widths timed once a session, to price untried shapes
_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target module -> {run key: snapshot}

Shape = tuple  # (cap: int | None, narrow: bool); cap None: as the drafter's settings allow


def remembered(target, drafter, rows: int, sampling) -> dict:
    """The slot a budget reads before a run of `drafter` on `target` and writes after it: one per drafter settings,
    batch size and sampling setting, kept as long as the target is loaded."""
    settings = json.dumps(drafter.settings(), sort_keys=True, default=str)
    key = (drafter.name, settings, rows, sampling.temperature, sampling.top_p)
    return _MEMORY.setdefault(target, {}).setdefault(key, {})


class FullBudget:
    """Every step drafts as much as the drafter's settings allow (the behaviour of the papers' loops)."""

    name = "full"
    narrow = False  # whether the step `choose` last chose verifies only its tree's greedy spine (Draft.spine)

    def reset(self, memory: dict | None = None) -> None:
        """Start a run, from what `memory` (a `remembered` slot) kept."""

    def finish(self) -> None:
        """The run ended: keep what it learned in the memory `reset` was given."""

    def price_forwards(self, measure: Callable[[list[int]], dict[int, float]]) -> None:
        """`measure(widths)`: the target's steady forward seconds per token count a row, at this batch size."""

    def choose(self, left: int | None = None) -> int | None:
        """The depth cap for the next step (None: none); `left`: the most tokens a row may still emit."""
        return None

    def observe_rows(self, cap, drafts: list[Draft], accepted: list[int], draft_s, verify_s, paths=None, timed=True):
        """A step: each row's draft, accepted count and path (node indices), and what the step cost (`timed`
        False: its time says nothing of its shape, such as a row's first draft reading its prompt)."""

    def hindsight(self, matches: list[bool], first: list[bool] | None = None, depth: int | None = None) -> None:
        """Whether a greedy draft would have guessed each of a run of committed tokens nobody drafted; `first`: a
        tree's first choice; `depth`: how deep the guesses tell (None: a chain's, as deep as the run)."""


class DraftBudget(FullBudget):
    """The cost-aware budget (`auto`). With `window` (lookahead's: its width a row, and the tokens each plain step's
    pooled n-grams would have got) the shapes are a window step or a plain one instead of depth caps."""

    name = "auto"

    def __init__(self, window: tuple[Callable[[], int], Callable[[], list[int]]] | None = None) -> None:
        self.window = window
        self.forward: dict[int, float] = {}
        self.reset()

    def reset(self, memory: dict | None = None) -> None:
        self.memory = memory if memory is not None else {}
        m = self.memory
        self.counts: dict[str, list[float]] = {k: list(v) for k, v in m.get("counts", {}).items()}
        for key in ("reached", "accepted", "spine_reached", "spine_accepted"):
            self.counts.setdefault(key, [])
        weight = self.counts["reached"][0] if self.counts["reached"] else 0.0
        if weight > PRIOR_STEPS:  # the last run's counts, as at most PRIOR_STEPS steps' worth
            self.counts = {k: [x * PRIOR_STEPS / weight for x in v] for k, v in self.counts.items()}
        self.seconds: dict[Shape, float] = dict(m.get("seconds", {}))
        self.tried: dict[Shape, float] = {s: min(n, 1.0) for s, n in m.get("tried", {}).items()}
        self.nodes: list[float] = list(m.get("nodes", []))  # a full tree's nodes per depth, a row
        self.per_depth = m.get("per_depth", 0.0)  # drafting seconds per depth drafted
        self.window_tokens = m.get("window_tokens", 1.0 + PRIOR)  # tokens a window step emits, a row
        self.tree = m.get("tree", False)
        self.current: Shape | None = None
        self.narrow = False
        self.drafted = False

    def finish(self) -> None:
        self.memory.update(counts=self.counts, seconds=self.seconds, tried=self.tried, nodes=self.nodes)
        self.memory.update(per_depth=self.per_depth, window_tokens=self.window_tokens, tree=self.tree)

    def price_forwards(self, measure: Callable[[list[int]], dict[int, float]]) -> None:
        self.forward = measure(list(PRICE_WIDTHS)) or {}

    def _forward_ratio(self, width: float) -> float:
        """A forward over `width` tokens a row against one over one token, interpolated from the timed widths (1.0
        unknown); never below 1: a wider forward does the work of a narrower one."""
        known = sorted(self.forward)
        if not known or not self.forward.get(1):
            return 1.0
        lo = max([w for w in known if w <= width], default=known[0])
        hi = min([w for w in known if w >= width], default=known[-1])
        f = self.forward
        cost = f[lo] if hi == lo else f[lo] + (width - lo) / (hi - lo) * (f[hi] - f[lo])
        return max(1.0, cost / f[1])

    def shapes(self) -> list[Shape]:
        if self.window is not None:
            return [(0, False), (None, False)]
        deepest = len(self.counts["reached"])  # the deepest draft seen: as deep as the settings allow (None)
        caps = [(d, False) for d in range(deepest)] + [(None, False)]
        return caps + ([(d, True) for d in range(1, deepest + 1)] if self.tree else [])

    def expected_tokens(self, shape: Shape) -> float:
        """Tokens a row emits in a step of this shape: the target's own, and each depth the path gets through."""
        cap, narrow = shape
        if cap == 0:
            return 1.0
        if self.window is not None:
            return self.window_tokens
        reached, accepted = (self.counts["spine_reached"], self.counts["spine_accepted"]) if narrow else (
            self.counts["reached"], self.counts["accepted"])  # fmt: skip
        depth = len(reached) if cap is None else cap
        tokens, through, prior = 1.0, 1.0, PRIOR
        for d in range(max(depth, 1)):
            r, a = (reached[d], accepted[d]) if d < len(reached) else (0.0, 0.0)
            prior = (a + prior) / (r + 1.0)  # one pseudo-count of the depth above's: acceptance varies smoothly
            through *= prior
            tokens += through
        return tokens

    def step_seconds(self, shape: Shape) -> float:
        """What a step of this shape took lately, or its price before it ran."""
        if shape in self.seconds:
            return self.seconds[shape]
        plain = self.seconds.get((0, False), self.forward.get(1, 1.0))
        cap, narrow = shape
        if cap == 0:
            return plain
        if self.window is not None:
            return plain * self._forward_ratio(self.window[0]())
        depth = len(self.nodes) if cap is None else cap
        width = 1 + (depth if narrow else sum(self.nodes[:depth]) or depth)
        return plain * self._forward_ratio(width) + self.per_depth * max(depth, 1)

    def rate(self, shape: Shape) -> float:
        return self.expected_tokens(shape) / max(self.step_seconds(shape), 1e-9)

    def choose(self, left: int | None = None) -> int | None:
        if self.window is not None:
            for got in self.window[1]():  # the plain steps' pooled guesses, now committed: what a window would get
                self._average("window_tokens", 1.0 + got)
        rates = {s: self.rate(s) for s in self.shapes()}
        hopes = {s: r * (1.0 + BONUS / (1.0 + self.tried.get(s, 0.0))) for s, r in rates.items()}
        best = max(hopes, key=hopes.get)
        now = self.current
        # another draft shape must rate SWITCH above the one running; a plain step is taken as soon as it rates best
        if now is None or now not in rates or best[0] == 0 or hopes[best] > rates[now] * (1.0 + SWITCH):
            self.current = best
        cap, self.narrow = self.current
        return cap

    def _average(self, name: str, value: float) -> None:
        setattr(self, name, (1.0 - TIME_WEIGHT) * getattr(self, name) + TIME_WEIGHT * value)

    def observe_rows(self, cap, drafts, accepted, draft_s, verify_s, paths=None, timed=True):
        for counts in self.counts.values():
            counts[:] = [x * FADE for x in counts]
        deepest = 0
        for i, (draft, got) in enumerate(zip(drafts, accepted)):
            depth = max(node_depths(draft.parents), default=0)
            deepest = max(deepest, depth)
            if self.window is not None:
                if draft.side_tokens:
                    self._average("window_tokens", 1.0 + got)
                continue
            self._grow(depth)
            self.tree = self.tree or not is_chain(draft.parents)
            path = paths[i] if paths is not None else list(range(got))
            spine = spine_nodes(draft.parents)
            for k in range(len(spine)):  # whether the accepted path followed the spine
                self.counts["spine_reached"][k] += 1
                if k >= len(path) or path[k] != spine[k]:
                    break
                self.counts["spine_accepted"][k] += 1
            if not self.narrow:  # depth k + 1 was tried only where the path got through depth k
                for k in range(min(depth, got + 1)):
                    self.counts["reached"][k] += 1
                    self.counts["accepted"][k] += k < got
                if cap is None and depth:
                    levels = node_depths(draft.parents)
                    for k in range(depth):
                        self.nodes[k] = (1 - TIME_WEIGHT) * self.nodes[k] + TIME_WEIGHT * levels.count(k + 1)
        shape = self.current or (cap, self.narrow)
        self.tried[shape] = self.tried.get(shape, 0.0) + 1.0
        first = deepest and not self.drafted  # a run's first draft reads the prompt: its time says nothing later
        self.drafted = self.drafted or bool(deepest)
        if not timed or first:
            return
        if deepest:
            self.per_depth = draft_s / deepest if not self.per_depth else self.per_depth
            self._average("per_depth", draft_s / deepest)
        seconds = draft_s + verify_s
        old = self.seconds.get(shape)
        self.seconds[shape] = seconds if old is None else (1 - TIME_WEIGHT) * old + TIME_WEIGHT * seconds

    def _grow(self, depth: int) -> None:
        for counts in self.counts.values():
            counts += [0.0] * (depth - len(counts))
        self.nodes += [0.0] * (depth - len(self.nodes))

    def hindsight(self, matches, first=None, depth=None) -> None:
        if self.window is not None or not matches:
            return
        deepest = min(len(self.counts["reached"]) or 1, depth or len(matches))
        self._grow(deepest)
        for name, seen in (("", matches), ("spine_", first)):
            for j in range(len(seen or [])):  # a chain drafted at each position: accepted up to its first miss
                for k in range(min(deepest, len(seen) - j)):
                    self.counts[f"{name}reached"][k] += 1
                    if not seen[j + k]:
                        break
                    self.counts[f"{name}accepted"][k] += 1


BUDGETS = {"full": FullBudget, "auto": DraftBudget}


def make_budget(name: str) -> FullBudget:
    """A budget policy by name ("full" or "auto")."""
    if name not in BUDGETS:
        raise GlanceError(f"unknown draft budget {name!r}: choose one of {', '.join(BUDGETS)}")
    return BUDGETS[name]()
