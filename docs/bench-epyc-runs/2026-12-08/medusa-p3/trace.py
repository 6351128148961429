"""Medusa on off-suite prompt 3 (its first head right about a fifth of the time): where its steps' time goes
against plain decoding's, step by step. One compiled session, runs interleaved, 128 tokens, budget auto."""

import json
import statistics
import sys

import torch

from engine.session import RaceSettings, Session

torch.set_grad_enabled(False)
prompt = json.loads(open("../../../bench-offsuite/prompts.jsonl").read().splitlines()[3])["prompt"]
session = Session.load(compile=True, methods=["ar", "medusa"], time_forwards=True)
ids = session.encode(prompt, chat=False)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4


def run(method: str) -> list:
    settings = RaceSettings([method], max_new_tokens=128)
    dec = session.decoder(method, settings)
    dec.details = False
    return list(dec.stream(ids))


for m in ("ar", "medusa"):  # warm-up
    run(m)
totals = {"ar": [], "medusa": []}
for r in range(rounds):
    for m in ("ar", "medusa") if r % 2 == 0 else ("medusa", "ar"):
        events = run(m)
        summary = events[-1]
        steps = events[1:-1]
        totals[m].append(summary.tokens_per_second)
        drafted = [e for e in steps if e.draft_tokens]
        plain = [e for e in steps if not e.draft_tokens]
        ms = lambda es: statistics.mean(e.draft_seconds + e.verify_seconds for e in es) * 1e3 if es else 0.0  # noqa
        print(f"round {r} {m:>7}: {summary.tokens_per_second:6.1f} tok/s, tau {summary.mean_accepted_length:.2f}, "
              f"{len(plain)} plain steps {ms(plain):.2f} ms, {len(drafted)} drafted {ms(drafted):.2f} ms "
              f"(draft sizes {sorted({len(e.draft_tokens) for e in drafted})}, "
              f"accepted {sum(len(e.accepted_nodes) for e in drafted)})")
        if m == "medusa" and r == 0:
            line = "".join("." if not e.draft_tokens else str(min(len(e.accepted_nodes), 9)) for e in steps)
            print("   steps (. plain, n: drafted, n accepted):", line)
            slow = [(i, round((e.draft_seconds + e.verify_seconds) * 1e3, 2)) for i, e in enumerate(steps)]
            print("   plain step ms after a drafted step:",
                  [t for i, t in slow if i and not steps[i].draft_tokens and steps[i - 1].draft_tokens])
ratio = [m / a for m, a in zip(totals["medusa"], totals["ar"])]
print("medusa / plain per round:", [round(x, 3) for x in ratio], "mean", round(statistics.mean(ratio), 3))
