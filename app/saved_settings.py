"""The window's settings file read through one schema: every value is parsed and checked against the widget that
shows it (a spin box's range, a list's items, a text's length). A value that does not fit leaves the widget at its
default and is named in one notice, so one bad line in the file never stops the window from starting."""

from __future__ import annotations

import math
from typing import Any

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QPlainTextEdit, QSpinBox, QTextEdit

MAX_TEXT = {QLineEdit: 4096, QPlainTextEdit: 100_000, QTextEdit: 100_000}  # a path; a prompt (a 2 MB one hung)
BOOLS = {"true": True, "false": False, "1": True, "0": False}  # QSettings gives strings; bools and ints compare equal


def restore(widget, raw: Any) -> str | None:
    """Set `widget` from a saved value; None when it fit, else why not (the widget keeps its value)."""
    if raw is None:
        return None
    if isinstance(widget, QCheckBox):
        key = str(raw).lower() if isinstance(raw, (bool, str, int)) else None
        if key not in BOOLS:
            return f"{str(raw)[:40]!r} is not true or false"
        widget.setChecked(BOOLS[key])
        return None
    if isinstance(widget, (QSpinBox, QDoubleSpinBox)):
        kind = int if isinstance(widget, QSpinBox) else float
        try:
            value = kind(raw)
        except (TypeError, ValueError, OverflowError):
            return f"{str(raw)[:40]!r} is not a number"
        if not math.isfinite(value) or not widget.minimum() <= value <= widget.maximum():
            return f"{str(raw)[:40]} is outside {widget.minimum():g} to {widget.maximum():g}"
        widget.setValue(value)
        return None
    text = str(raw)
    if isinstance(widget, QComboBox):
        if widget.findText(text) < 0 and not widget.isEditable():
            return f"{text[:40]!r} is not one of {', '.join(widget.itemText(i) for i in range(widget.count()))}"
        widget.setCurrentText(text)
        return None
    limit = next((n for kind, n in MAX_TEXT.items() if isinstance(widget, kind)), 4096)
    if len(text) > limit:
        return f"{len(text):,} characters, more than {limit:,}"
    widget.setPlainText(text) if hasattr(widget, "setPlainText") else widget.setText(text)
    return None


def notice(problems: dict[str, str]) -> str:
    """One line naming the settings that were reset ("" when none)."""
    if not problems:
        return ""
    named = "; ".join(f"{key}: {why}" for key, why in list(problems.items())[:3])
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return f"reset to defaults from the settings file: {named}{more}"
