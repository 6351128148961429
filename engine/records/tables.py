"""Tables from a session log: per-step CSV, per-run CSV and a short Markdown report (used by the app's export)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from engine.records.files import write_text_checked
from engine.records.session_log import SessionLog

STEP_COLUMNS = [
    "run_id",
    "variant",
    "step",
    "draft_size",
    "accepted",
    "emitted",
    "new_tokens",
    "draft_seconds",
    "verify_seconds",
    "clock",
]
RUN_COLUMNS = [
    "run_id",
    "variant",
    "new_tokens",
    "steps",
    "target_forwards",
    "mean_accepted_length",
    "acceptance_rate",
    "tokens_per_second",
    "wall_seconds",
    "draft_seconds",
    "verify_seconds",
    "stop_reason",
    "approximate",
]


def write_steps_csv(log: SessionLog, path: Path) -> None:
    """The per-step table, written whole or not at all (engine/records/files.py)."""
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(STEP_COLUMNS)
    for e in log.steps:
        row = [e.run_id, e.variant, e.step, len(e.draft_tokens), len(e.accepted_nodes), len(e.tokens), e.new_tokens]
        w.writerow(row + [f"{e.draft_seconds:.6f}", f"{e.verify_seconds:.6f}", f"{e.clock:.6f}"])
    write_text_checked(path, fh.getvalue())


def write_runs_csv(log: SessionLog, path: Path) -> None:
    """The per-run table, written whole or not at all."""
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(RUN_COLUMNS)
    for s in log.summaries:
        w.writerow([getattr(s, c) for c in RUN_COLUMNS])
    write_text_checked(path, fh.getvalue())


def _lane_order(variants) -> list[str]:
    from engine.registry import METHODS

    return sorted(variants, key=lambda v: METHODS.index(v) if v in METHODS else len(METHODS))


def lane_texts(log: SessionLog) -> dict[str, str]:
    """Each lane's output text from the decoded pieces stored beside its events (by the app and by `generate --log`)."""
    texts: dict[str, str] = {}
    for e, text in zip(log.steps, log.texts):
        if text is not None:
            texts[e.variant] = texts.get(e.variant, "") + "".join(text.pieces)
    return texts


def markdown_report(log: SessionLog, baseline: str = "ar") -> str:
    """The session on one page: device, models and heads, settings, the prompt, one row per lane (plain decoding
    first) with speedup over the baseline, then every lane's output."""
    h = log.header
    base = next((s for s in log.summaries if s.variant == baseline), None)
    lines = [
        "# Glance session",
        "",
        f"- device: {h.get('device')}",
        f"- environment: {', '.join(f'{k} {v}' for k, v in h.get('environment', {}).items())}",
    ]
    for role, m in h.get("models", {}).items():
        params = m.get("parameters")
        size = f"{params / 1e6:.1f}M parameters, " if isinstance(params, (int, float)) else ""
        lines.append(f"- {role}: {m.get('name', role)} ({size}{m.get('dtype', 'dtype unknown')})")
    settings = h.get("settings", {})
    if settings:
        lines.append("- settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k != "prompt"))
    prompt = h.get("prompt", settings.get("prompt"))
    if prompt is not None:
        lines += ["", "## Prompt", "", "```text", str(prompt), "```"]
    lines += [
        "",
        "## Lanes",
        "",
        "| variant | new tokens | tau | acceptance | tokens/s | speedup | same as baseline | stop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_variant = {s.variant: s for s in log.summaries}
    for v in _lane_order(by_variant):
        s = by_variant[v]
        speed = f"{s.tokens_per_second / base.tokens_per_second:.2f}x" if base and base.tokens_per_second else "-"
        same = "-" if base is None else ("yes" if s.token_ids == base.token_ids else "no")
        acc = "-" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
        label = s.variant + (" (approximate)" if s.approximate else "")
        lines.append(
            f"| {label} | {s.new_tokens} | {s.mean_accepted_length:.2f} | {acc} | "
            f"{s.tokens_per_second:.1f} | {speed} | {same} | {s.stop_reason} |"
        )
    texts = lane_texts(log)
    for v in _lane_order(texts):
        lines += ["", f"## Output: {v}", "", "```text", texts[v], "```"]
    return "\n".join(lines) + "\n"
