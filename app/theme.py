"""Colors per variant, token formats' shades, and the dark/light style sheets from resources/."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QIcon

RESOURCES = Path(__file__).resolve().parent.parent / "resources"

VARIANT_COLORS = {
    "ar": "#9e9e9e",
    "vanilla": "#4fc3f7",
    "medusa": "#ffb74d",
    "eagle": "#81c784",
    "lookahead": "#ba68c8",
}
FALLBACK_COLORS = ["#f06292", "#4db6ac", "#dce775", "#7986cb"]
NEUTRAL = {"dark": "#e5e9f0", "light": "#1f2430"}
REJECTED = "#7b8394"


def variant_color(name: str) -> QColor:
    base = name.split(":")[0]
    if base in VARIANT_COLORS:
        return QColor(VARIANT_COLORS[base])
    return QColor(FALLBACK_COLORS[hash(base) % len(FALLBACK_COLORS)])


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
