"""Each drafter's knobs, generated from its registry spec: one collapsible section per drafter, one row per option
(a spin box for numbers, a check box for flags, a combo box for choices and suggestions)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import DRAFTERS, DrafterSpec, KnobField


def narrow(combo: QComboBox, chars: int = 8) -> QComboBox:
    """A combo box whose width does not follow its longest item (long presets and trees would widen the panel)."""
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(chars)
    return combo


def knob_widget(k: KnobField) -> QWidget:
    """The editor for one option, set to its default, with the option's help as tooltip."""
    kn = k.knob
    if k.kind is bool:
        w: QWidget = QCheckBox(k.label)
        w.setChecked(bool(k.default))
    elif k.kind is int:
        w = QSpinBox()
        w.setRange(int(kn.lo if kn.lo is not None else 0), int(kn.hi if kn.hi is not None else 2**31 - 1))
        w.setValue(int(k.default))
    elif k.kind is float:
        w = QDoubleSpinBox()
        w.setDecimals(2)
        w.setSingleStep(0.05)
        w.setRange(float(kn.lo if kn.lo is not None else 0.0), float(kn.hi if kn.hi is not None else 1e9))
        w.setValue(float(k.default))
    else:
        w = narrow(QComboBox())
        w.addItems(list(kn.choices or kn.suggestions or ()))
        w.setEditable(kn.choices is None)  # suggestions: the user may type another value (a JSON tree, say)
        w.setCurrentText(str(k.default))
    w.setToolTip(f"{k.flag}: {kn.help}")
    return w


def widget_value(w: QWidget) -> Any:
    if isinstance(w, QCheckBox):
        return w.isChecked()
    if isinstance(w, QSpinBox | QDoubleSpinBox):
        return w.value()
    return w.currentText().strip()


class DrafterSection(QWidget):
    """A drafter's knobs under a header that folds them away."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.spec = spec
        self.toggle = QToolButton()
        self.toggle.setText(f"{spec.label} options")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setStyleSheet(f"QToolButton {{ border: none; color: {spec.color}; font-weight: bold }}")
        self.toggle.setToolTip(spec.summary)
        self.body = QWidget()
        form = QFormLayout(self.body)
        form.setContentsMargins(12, 0, 0, 0)
        self.widgets: dict[str, QWidget] = {}
        for k in spec.knobs:
            w = knob_widget(k)
            self.widgets[k.name] = w
            if isinstance(w, QCheckBox):
                form.addRow(w)
            else:
                form.addRow(k.label, w)
        self.shape = QLabel("")  # what the values build, where the drafter explains it (EAGLE: levels, nodes)
        self.shape.setWordWrap(True)
        self.shape.setObjectName("knobShape")
        if spec.explain is not None:
            form.addRow(self.shape)
            for w in self.widgets.values():
                signal = getattr(w, "valueChanged", None) or getattr(w, "currentTextChanged", None)
                signal = signal or getattr(w, "toggled", None)
                signal.connect(self.update_shape)
            self.update_shape()
        self.body.setVisible(False)
        self.toggle.toggled.connect(self.set_open)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.toggle)
        lay.addWidget(self.body)

    def update_shape(self, *_args) -> None:
        """One line on what the current values build; empty while they do not form valid options."""
        try:
            options = self.spec.options(**{k.field: widget_value(self.widgets[k.name]) for k in self.spec.knobs})
            self.shape.setText(f"= {self.spec.explain(options)}" if self.spec.explain(options) else "")
        except (TypeError, ValueError):
            self.shape.setText("")

    def set_open(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)


class DrafterKnobs(QWidget):
    """Every registered drafter's section, and their values by option name."""

    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.sections = {s.name: DrafterSection(s) for s in DRAFTERS if s.knobs}
        for section in self.sections.values():
            lay.addWidget(section)
        self.widgets: dict[str, QWidget] = {n: w for s in self.sections.values() for n, w in s.widgets.items()}

    def values(self) -> dict[str, Any]:
        """Option name -> value, for DrafterOptions(**values)."""
        return {name: widget_value(w) for name, w in self.widgets.items()}
