"""Colors per variant, token formats' shades, and the dark/light style sheets from resources/."""

from __future__ import annotations

import zlib
from pathlib import Path

from PySide6.QtGui import QColor, QIcon

from engine import DRAFTERS

RESOURCES = Path(__file__).resolve().parent.parent / "resources"

VARIANT_COLORS = {s.name: s.color for s in DRAFTERS}
# Reference rows of the benchmark and anything else without a drafter spec: fixed colours, then a stable hash.
OTHER_COLORS = {"hf_generate": "#e0e0e0", "hf_assisted": "#b0bec5", "hf_prompt_lookup": "#f06292"}
FALLBACK_COLORS = ["#dce775", "#7986cb", "#ff8a65", "#a1887f"]
NEUTRAL = {"dark": "#e5e9f0", "light": "#1f2430"}
REJECTED = "#7b8394"
# Colour grammar: lane colours mean lanes and nothing else; verdicts are symbols (✓ accepted or matching, ✗ rejected)
# in one mid-tone that reads on both themes, and red is kept for a result that should never happen.
VERDICT = "#8c9bb5"
ALARM = "#ef5350"


def variant_color(name: str) -> QColor:
    base = name.split(":")[0]
    known = VARIANT_COLORS.get(base) or OTHER_COLORS.get(base)
    if known:
        return QColor(known)
    return QColor(FALLBACK_COLORS[zlib.crc32(base.encode()) % len(FALLBACK_COLORS)])  # the same every launch


def depth_shade(color: QColor, depth: int) -> QColor:
    """Deeper accepted draft tokens get a lighter background of the variant's color."""
    c = QColor(color)
    c.setAlphaF(max(0.18, 0.6 - 0.1 * (depth - 1)))
    return c


def style_sheet(theme: str) -> str:
    path = RESOURCES / "styles" / f"{theme}.qss"
    return path.read_text() if path.exists() else ""


def app_icon() -> QIcon:
    return QIcon(str(RESOURCES / "icons" / "glance.svg"))
