"""Lookahead's budget under `--draft-budget auto`: each step either runs the window (and verifies the pooled n-grams
of the pending token) or decodes plain, whichever has given more tokens per second in this run. No depth cap fits
lookahead: its cost is the window's width, which `LookaheadDrafter.fit_window` sizes before the run, and its gain is how
often the pool holds the target's continuation, which only the run itself tells. On SmolLM2-135M's chat prompts
(bf16 EPYC) the window of 1/3/1 verified five tokens a step at 1.13 plain steps' cost for 1.02-1.06 tokens on four of
six prompts (0.92-0.93x of plain decoding) and 1.57 on a maths prompt (1.30x): a fixed window loses where the text
does not repeat, and the budget decodes plain there. Cap None: the window; cap 0: a plain step (the pool still takes
the committed text's n-grams). Exactness is untouched: a plain step is the target's own.

Plain steps keep the estimate alive (hindsight, as the model drafters' budget has): each notes the pooled n-grams of
its pending token, and once the text after it is committed, how many tokens they would have got counts as a window
step would (`NgramDrafter.take_guessed`). That understates a window (its own n-grams of the stretch are missing) but
calls a probe early where the text starts repeating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.budget.cost_aware import FADE, FullBudget, _median, monotone_ratios
from engine.decoding.tree import Draft

KEEP = 8  # steady steps of each kind whose median prices it
PROBE_STEPS = 6  # a probe from plain steps runs the window this many steps before re-rating
# A run starts with RUN_START window steps: the pool needs a few steps of the new text before its n-grams hit (the
# bundled target off the suite: tau 1.0 over the first 6-20 steps of every prompt, 2-3 after). Interleaved in one
# process, 3 rounds (bf16 EPYC; cumulative speedup over plain decoding): starting with 6 / 12 / 20 window steps, and
# the window every step: bundled target off the suite 1.376 / 1.412 / 1.409 / 1.422x in the last round; SmolLM2-135M,
# 6 chat prompts of 64 tokens 0.971 / 0.965 / 0.953 / 0.880x (its maths prompt 0.96-1.08x / 1.10-1.13x / 1.09-1.13x
# / 1.09-1.14x: 6 steps were too few to see its repeats every time).
RUN_START = 12
STAY = 8  # a choice of the window holds this many steps: each switch runs the next step cold (another graph)
PROBE_GAP = 16  # plain steps before the first probe; each probe that finds plain steps still best doubles it ...
MAX_BACKOFF = 3  # ... up to 2**MAX_BACKOFF times
PROBE_HORIZON = 16  # no probe with fewer tokens left: it could not win back its cost
QUIET = 4  # during plain steps the rates are re-rated every QUIET steps: the pool's hindsight may call a probe early
PLAIN_BLOCK = 3  # plain steps timed where nothing else prices one (no run before, no forward costs)


@dataclass
class WindowBudget(FullBudget):
    """Window or plain step, re-rated when a choice runs out (and every QUIET plain steps): tokens per window step
    (faded by FADE a step, plain steps' hindsight included) over the median of steady window steps' seconds, against
    one token over the median of steady plain steps' (the latest runs' plain step where this run has none yet, else
    the window's scaled by the target's forward cost at one token against the window's width). A step right after a
    switch is not timed: it runs another compiled graph, cold. A new run is new text: it keeps the last run's window
    price, not its tokens per step (carried over as a prior of eight steps, the chat prompts before SmolLM2's maths
    prompt held it at plain steps: 1.01x there against 1.30x with the window every step)."""

    width: Callable[[], int] = lambda: 1  # tokens a window step verifies (the drafter's `row_tokens`, fitted)
    guessed: Callable[[], list[int]] = list  # the drafter's `take_guessed`: plain steps' pooled guesses, scored
    name = "auto"
    steps: int = 0
    tokens: float = 0.0  # faded tokens emitted on window steps (and guessed in hindsight at plain ones)
    count: float = 0.0  # faded steps counted in `tokens`
    window_times: list[float] = field(default_factory=list)
    plain_times: list[float] = field(default_factory=list)
    remembered_plain: float | None = None  # the latest runs' plain step (budget.remembered's shared list)
    ratio: float | None = None  # a one-token forward's cost against the window's
    last_window: bool | None = None  # the kind of the previous step (None: the prefill)
    window_left: int = 0  # window steps still to run before re-rating (a run starts with `run_start` of them)
    plain_left: int = 0  # plain steps still to run before the next probe
    idle_probes: int = 0  # probes in a row that found plain steps best
    run_start: int = RUN_START  # kept across `reset` (what A/B runs vary)
    memory: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.window_left = self.run_start

    def reset(self, memory: dict | None = None) -> None:
        self.__init__(width=self.width, guessed=self.guessed, run_start=self.run_start)
        self.memory = memory
        if memory and memory.get("plain"):
            self.remembered_plain = _median(memory["plain"])
        if memory and memory.get("window_times"):  # what a window step cost; what it gets is the new text's
            self.window_times = list(memory["window_times"])

    def finish(self) -> None:
        if self.memory is not None and self.window_times:
            self.memory["window_times"] = list(self.window_times)

    def price_forwards(self, measure: Callable[[tuple[int, ...]], dict[int, float]]) -> None:
        width = self.width()
        ratios = monotone_ratios(measure((1, width)))
        if ratios.get(width):
            self.ratio = 1 / ratios[width]

    def window_rate(self) -> float:
        """Expected tokens per second of a window step (0 until one was timed)."""
        if not self.window_times or not self.count:
            return 0.0
        return (self.tokens / self.count) / max(_median(self.window_times), 1e-9)

    def plain_rate(self) -> float:
        """Tokens per second of a plain step (0 when nothing prices one)."""
        if self.plain_times:
            seconds = _median(self.plain_times)
        elif self.remembered_plain is not None:
            seconds = self.remembered_plain
        elif self.window_times and self.ratio is not None:
            seconds = _median(self.window_times) * self.ratio
        else:
            return 0.0
        return 1.0 / max(seconds, 1e-9)

    def choose(self, left: int | None = None) -> int | None:
        if self.window_left > 0:
            self.window_left -= 1
            return None
        if self.plain_left > 0:
            quiet = self.steps % QUIET or (left is not None and left < PROBE_HORIZON)
            if quiet or not 0 < self.plain_rate() <= self.window_rate():
                self.plain_left -= 1
                return 0
            self.plain_left = 0  # the pool's hindsight caught up with plain steps: probe the window now
            self.window_left = PROBE_STEPS - 1
            return None
        if self.last_window is False:  # a stretch of plain steps ended: probe the window, if it can still pay
            if left is not None and left < PROBE_HORIZON:
                self.plain_left = left
                return 0
            self.window_left = PROBE_STEPS - 1
            return None
        plain = self.plain_rate()
        if not plain:  # nothing prices a plain step yet: time a few (the first runs cold)
            self.plain_left = PLAIN_BLOCK - 1
            return 0
        if self.window_rate() >= plain:
            self.idle_probes = 0
            self.window_left = STAY - 1
            return None
        self.idle_probes += 1
        self.plain_left = PROBE_GAP * 2 ** min(self.idle_probes - 1, MAX_BACKOFF) - 1
        return 0

    def _count(self, tokens: float) -> None:
        self.tokens = self.tokens * FADE + tokens
        self.count = self.count * FADE + 1

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
        self.steps += 1
        window = any(d.side_tokens for d in drafts)
        if window:
            self._count(1 + sum(accepted) / max(len(accepted), 1))
        for got in self.guessed():  # what the pool guessed right at plain steps (hindsight)
            self._count(1 + got)
        if timed and window == self.last_window:  # steady: the previous step ran the same graph
            times = self.window_times if window else self.plain_times
            times.append(draft_s + verify_s)
            del times[:-KEEP]
        self.last_window = window
