"""A card per drafter, built from its spec alone (what drafts, what it needs besides the target, whether it is exact,
what each knob trades), opened from a lane's title; docs/METHODS.md has the longer version."""

from __future__ import annotations

import html

from engine import BASELINE, DRAFTERS, DrafterSpec

METHODS_DOC = "docs/METHODS.md"


def exactness(spec: DrafterSpec) -> str:
    if spec.name == BASELINE:
        return "the reference every other lane is compared with"
    text = (
        "exact: greedy output equals plain decoding token for token; sampled output follows the target's distribution"
    )
    if any(k.field == "acceptance" for k in spec.knobs):
        text += " (except the optional typical acceptance, which is approximate and labelled so)"
    return text


def needs(spec: DrafterSpec) -> str:
    if spec.part is None:
        return "nothing besides the target: no training"
    return f"{spec.part.help} (<code>--{spec.part.key}</code>)"


def knob_line(k) -> str:
    bounds = ""
    if k.knob.lo is not None and k.knob.hi is not None:
        bounds = f", {k.knob.lo:g}-{k.knob.hi:g}"
    elif k.knob.choices:
        bounds = f", one of {', '.join(k.knob.choices)}"
    return f"<li><b>{html.escape(k.label)}</b> ({html.escape(str(k.default))}{bounds}): {html.escape(k.knob.help)}</li>"


def card_html(name: str) -> str:
    """The card of the drafter `name`, as rich text."""
    spec = next(s for s in DRAFTERS if s.name == name)
    knobs = "".join(knob_line(k) for k in spec.knobs) or "<li>none</li>"
    return (
        f"<h3>{html.escape(spec.label)}</h3><p>{html.escape(spec.summary)}</p>"
        f"<p><b>Needs:</b> {needs(spec)}<br><b>Output:</b> {exactness(spec)}</p>"
        f"<p><b>Knobs</b> (what each trades):</p><ul>{knobs}</ul>"
        f"<p>More in <code>{METHODS_DOC}</code>.</p>"
    )
