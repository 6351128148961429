"""A lane's speedup says what it rests on: a lane that never drafted reads "no drafts", and a difference within the
two runs' step-time spread reads as a tie."""

import random

from engine import RunStats, StepEvent, compare


def run(step_seconds: list[float], draft: int, accepted: int) -> RunStats:
    """A run of steps that each draft `draft` tokens and accept `accepted` of them, taking the given seconds."""
    stats, clock, new = RunStats(), 0.0, 1
    stats.add(StepEvent("r", "x", 0, [], [], [], [7], [False], [1.0], 0.0, 0.001, 0.001, 1, prefill=True))
    for i, s in enumerate(step_seconds, 1):
        clock += s
        tokens = [7] * (accepted + 1)
        new += len(tokens)
        parents = list(range(-1, draft - 1))
        stats.add(
            StepEvent("r", "x", i, [7] * draft, parents, list(range(accepted)), tokens,
                      [True] * accepted + [False], [1.0] * len(tokens), s / 3, 2 * s / 3, clock + 0.001, new)
        )  # fmt: skip
    return stats


def jittered(mean: float, n: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_lane_that_never_drafted_is_not_a_win():
    plain = run(jittered(0.010, 40, 0.3, 0), 0, 0)
    lucky = run(jittered(0.007, 40, 0.3, 1), 0, 0)  # faster by luck of the clock, with no draft at all
    assert compare(lucky, plain).verdict == "no drafts: plain steps"


def test_a_small_difference_in_noisy_steps_is_a_tie_and_a_clear_one_is_not():
    plain = run(jittered(0.010, 30, 0.5, 0), 0, 0)
    close = run(jittered(0.020, 30, 0.5, 0), 2, 1)  # two tokens a step at twice the time: about 1.0x
    assert compare(close, plain).verdict.endswith("a tie")
    clear = run(jittered(0.012, 30, 0.05, 2), 2, 2)  # three tokens a step for 1.2 plain steps
    s = compare(clear, plain)
    assert s.value > 2 and s.verdict == f"{s.value:.2f}x" and s.drafted == 1.0
