"""How long a session's first race waits before its first token, with and without the load timing the forwards.

One compiled session (as the app loads it). `time_forwards` is what the load now does after compiling; then a race
of every method starts at once. Clearing the memo of measured forwards brings back what a first race did before."""

import time

import torch

import engine.forward_timing as timing
from engine.registry import METHODS
from engine.session import RaceSettings, Session

torch.set_grad_enabled(False)
session = Session.load(compile=True)
prompt = session.encode("def fibonacci(n):")


def first_events(label: str) -> None:
    """Seconds from starting each method's run alone to its prefill event and to its first verification step."""
    for m in METHODS:
        if not session.available(m):
            continue
        decoder = session.decoder(m, RaceSettings([m], max_new_tokens=16))
        t0 = time.perf_counter()
        seen = []
        for event in decoder.stream(prompt):
            seen.append(time.perf_counter() - t0)
            if len(seen) == 2:
                break
        print(f"{label:>22} {m:>14}: prefill event {seen[0] * 1e3:7.1f} ms, first step {seen[1] * 1e3:7.1f} ms")


t = time.perf_counter()
session.time_forwards()
print(f"load step 'timing the target's forwards': {time.perf_counter() - t:.2f} s")
first_events("after the load's timing")
timing._MEMO.clear()  # as a session whose load did not time them
first_events("nothing timed")
first_events("second run")
