"""The left-hand panels: models, prompt with presets, generation settings and per-variant knobs."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.theme import RESOURCES
from engine.drafters.eagle import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL
from engine.drafters.lookahead import DEFAULT_GUESSES, DEFAULT_NGRAM, DEFAULT_WINDOW
from engine.drafters.medusa import DEFAULT_TREE, TREES
from engine.variants import DEFAULT_GAMMA, METHODS

PROMPTS = RESOURCES / "prompts" / "suite.jsonl"
DEFAULT_PROMPT = "def fibonacci(n):"


def _path_row(edit: QLineEdit, parent: QWidget) -> QWidget:
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(edit, 1)
    browse = QPushButton("…")
    browse.setFixedWidth(28)
    browse.setToolTip("choose a local model folder")

    def pick() -> None:
        folder = QFileDialog.getExistingDirectory(parent, "Model folder", edit.text() or str(Path.home()))
        if folder:
            edit.setText(folder)

    browse.clicked.connect(pick)
    lay.addWidget(browse)
    return row


def _spin(lo: int, hi: int, value: int, tip: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo, hi)
    box.setValue(value)
    if tip:
        box.setToolTip(tip)
    return box


def _row(*widgets: QWidget) -> QWidget:
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        lay.addWidget(w)
    return row


class ModelPanel(QGroupBox):
    def __init__(self) -> None:
        super().__init__("Models")
        self.target = QLineEdit()
        self.target.setPlaceholderText("bundled demo target (or a folder / hub id)")
        self.draft = QLineEdit()
        self.draft.setPlaceholderText("bundled demo draft (or a folder / hub id; empty: none)")
        self.medusa = QLineEdit()
        self.medusa.setPlaceholderText("bundled Medusa heads (or a heads folder; empty: none)")
        self.eagle = QLineEdit()
        self.eagle.setPlaceholderText("bundled EAGLE head (or a head folder; empty: none)")
        self.device = QComboBox()
        self.device.addItems(["auto", "cpu", "cuda", "mps"])
        self.dtype = QComboBox()
        self.dtype.addItems(["auto", "float32", "bfloat16", "float16"])
        self.allow_download = QCheckBox("allow hub downloads")
        self.load = QPushButton("Load")
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setVisible(False)
        self.info = QLabel("no model loaded")
        self.info.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow("target", _path_row(self.target, self))
        form.addRow("draft", _path_row(self.draft, self))
        form.addRow("medusa", _path_row(self.medusa, self))
        form.addRow("eagle", _path_row(self.eagle, self))
        form.addRow("device", self.device)
        form.addRow("dtype", self.dtype)
        form.addRow(self.allow_download)
        form.addRow(self.load, self.busy)
        form.addRow(self.info)

    def set_busy(self, busy: bool) -> None:
        self.busy.setVisible(busy)
        self.load.setEnabled(not busy)


class PromptPanel(QGroupBox):
    def __init__(self) -> None:
        super().__init__("Prompt")
        self.presets = QComboBox()
        self.presets.addItem("(custom)", None)
        for rec in load_presets():
            self.presets.addItem(f"{rec['category']} · {rec['id']}", rec["prompt"])
        self.text = QPlainTextEdit(DEFAULT_PROMPT)
        self.text.setMinimumHeight(90)
        self.presets.currentIndexChanged.connect(self._preset)
        lay = QVBoxLayout(self)
        lay.addWidget(self.presets)
        lay.addWidget(self.text)

    def _preset(self, index: int) -> None:
        prompt = self.presets.itemData(index)
        if prompt:
            self.text.setPlainText(prompt)


class SettingsPanel(QGroupBox):
    def __init__(self) -> None:
        super().__init__("Generation")
        self.max_new = QSpinBox()
        self.max_new.setRange(1, 4096)
        self.max_new.setValue(64)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.1)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(1.0)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.methods = {m: QCheckBox(m) for m in METHODS}
        for box in self.methods.values():
            box.setChecked(True)
        self.gamma = QSpinBox()
        self.gamma.setRange(1, 16)
        self.gamma.setValue(DEFAULT_GAMMA)
        self.adaptive = QCheckBox("adaptive gamma")
        self.draft_confidence = QDoubleSpinBox()
        self.draft_confidence.setRange(0.0, 0.95)
        self.draft_confidence.setSingleStep(0.05)
        self.draft_confidence.setToolTip("stop drafting when the draft's probability of its token falls below this")
        self.medusa_tree = QComboBox()
        self.medusa_tree.addItems(list(TREES))
        self.medusa_tree.setCurrentText(DEFAULT_TREE)
        self.acceptance = QComboBox()
        self.acceptance.addItems(["exact", "typical"])
        self.acceptance.setToolTip("typical acceptance is Medusa's approximate rule: faster, not exact")
        self.eagle_mode = QComboBox()
        self.eagle_mode.addItems(["dynamic", "static"])
        self.eagle_top_k = _spin(1, 32, DEFAULT_TOP_K)
        self.eagle_depth = _spin(1, 12, DEFAULT_DEPTH)
        self.eagle_total = _spin(1, 128, DEFAULT_TOTAL)
        self.lookahead_window = _spin(1, 32, DEFAULT_WINDOW, "W: window width (Jacobi guesses per level)")
        self.lookahead_ngram = _spin(2, 8, DEFAULT_NGRAM, "N: n-gram size (the window keeps N - 1 levels)")
        self.lookahead_guesses = _spin(0, 32, DEFAULT_GUESSES, "G: n-grams verified per step (0: plain decoding)")
        self.lookahead_context = QCheckBox("lookahead: pool prompt and output n-grams too")
        self.lookahead_context.setChecked(True)
        self.sequential = QCheckBox("sequential (benchmark) mode")
        self.show_rejected = QCheckBox("show rejected draft tokens")
        self.run_one = QComboBox()
        self.run_one.addItems(list(METHODS))
        form = QFormLayout(self)
        form.addRow("max new tokens", self.max_new)
        form.addRow("temperature", self.temperature)
        form.addRow("top-p", self.top_p)
        form.addRow("seed", self.seed)
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        for box in self.methods.values():
            rl.addWidget(box)
        form.addRow("race", row)
        form.addRow("vanilla gamma", self.gamma)
        form.addRow(self.adaptive)
        form.addRow("vanilla stop below p", self.draft_confidence)
        form.addRow("medusa tree", self.medusa_tree)
        form.addRow("medusa acceptance", self.acceptance)
        form.addRow("eagle mode", self.eagle_mode)
        form.addRow("eagle top-k / depth / total", _row(self.eagle_top_k, self.eagle_depth, self.eagle_total))
        form.addRow("lookahead W / N / G", _row(self.lookahead_window, self.lookahead_ngram, self.lookahead_guesses))
        form.addRow(self.lookahead_context)
        form.addRow(self.sequential)
        form.addRow(self.show_rejected)
        form.addRow("run one", self.run_one)

    def chosen_methods(self) -> list[str]:
        return [m for m, box in self.methods.items() if box.isChecked()]


def watch_changes(panels, changed) -> None:
    """Call `changed()` whenever the user edits any field of the panels (the window saves settings debounced)."""
    for panel in panels:
        for edit in panel.findChildren(QLineEdit):
            edit.textChanged.connect(changed)
        for text in panel.findChildren(QPlainTextEdit):
            text.textChanged.connect(changed)
        for box in panel.findChildren(QComboBox):
            box.currentIndexChanged.connect(changed)
        for spin in panel.findChildren(QSpinBox) + panel.findChildren(QDoubleSpinBox):
            spin.valueChanged.connect(changed)
        for check in panel.findChildren(QCheckBox):
            check.toggled.connect(changed)


def load_presets() -> list[dict]:
    if not PROMPTS.exists():
        return []
    return [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]


def save_settings(models: ModelPanel, prompt: PromptPanel, gen: SettingsPanel, settings: QSettings) -> None:
    settings.setValue("target", models.target.text())
    settings.setValue("draft", models.draft.text())
    settings.setValue("medusa", models.medusa.text())
    settings.setValue("eagle", models.eagle.text())
    settings.setValue("eagle_mode", gen.eagle_mode.currentText())
    settings.setValue("medusa_tree", gen.medusa_tree.currentText())
    settings.setValue("acceptance", gen.acceptance.currentText())
    settings.setValue("device", models.device.currentText())
    settings.setValue("dtype", models.dtype.currentText())
    settings.setValue("prompt", prompt.text.toPlainText())
    settings.setValue("max_new", gen.max_new.value())
    settings.setValue("temperature", gen.temperature.value())
    settings.setValue("top_p", gen.top_p.value())
    settings.setValue("seed", gen.seed.value())
    settings.setValue("gamma", gen.gamma.value())
    settings.setValue("adaptive", gen.adaptive.isChecked())
    settings.setValue("draft_confidence", gen.draft_confidence.value())
    settings.setValue("eagle_knobs", f"{gen.eagle_top_k.value()},{gen.eagle_depth.value()},{gen.eagle_total.value()}")
    settings.setValue(
        "lookahead",
        f"{gen.lookahead_window.value()},{gen.lookahead_ngram.value()},"
        f"{gen.lookahead_guesses.value()},{int(gen.lookahead_context.isChecked())}",
    )
    settings.setValue("sequential", gen.sequential.isChecked())
    settings.setValue("show_rejected", gen.show_rejected.isChecked())
    settings.setValue("methods", ",".join(gen.chosen_methods()))


def restore_settings(models: ModelPanel, prompt: PromptPanel, gen: SettingsPanel, settings: QSettings) -> None:
    def get(key, default, kind=str):
        value = settings.value(key, default)
        if kind is bool:
            return value in (True, "true", "1", 1)
        try:
            return kind(value)
        except (TypeError, ValueError):
            return default

    models.target.setText(get("target", ""))
    models.draft.setText(get("draft", ""))
    models.medusa.setText(get("medusa", ""))
    models.eagle.setText(get("eagle", ""))
    gen.eagle_mode.setCurrentText(get("eagle_mode", "dynamic"))
    gen.medusa_tree.setCurrentText(get("medusa_tree", DEFAULT_TREE))
    gen.acceptance.setCurrentText(get("acceptance", "exact"))
    models.device.setCurrentText(get("device", "auto"))
    models.dtype.setCurrentText(get("dtype", "auto"))
    prompt.text.setPlainText(get("prompt", DEFAULT_PROMPT))
    gen.max_new.setValue(get("max_new", 64, int))
    gen.temperature.setValue(get("temperature", 0.0, float))
    gen.top_p.setValue(get("top_p", 1.0, float))
    gen.seed.setValue(get("seed", 0, int))
    gen.gamma.setValue(get("gamma", DEFAULT_GAMMA, int))
    gen.adaptive.setChecked(get("adaptive", False, bool))
    gen.draft_confidence.setValue(get("draft_confidence", 0.0, float))
    try:
        k, depth, total = (int(v) for v in get("eagle_knobs", "").split(","))
        gen.eagle_top_k.setValue(k)
        gen.eagle_depth.setValue(depth)
        gen.eagle_total.setValue(total)
    except ValueError:
        pass  # nothing saved yet: keep the defaults
    try:
        w, n, g, c = (int(v) for v in get("lookahead", "").split(","))
        gen.lookahead_window.setValue(w)
        gen.lookahead_ngram.setValue(n)
        gen.lookahead_guesses.setValue(g)
        gen.lookahead_context.setChecked(bool(c))
    except ValueError:
        pass  # nothing saved yet: keep the defaults
    gen.sequential.setChecked(get("sequential", False, bool))
    gen.show_rejected.setChecked(get("show_rejected", False, bool))
    chosen = get("methods", ",".join(METHODS)).split(",")
    for m, box in gen.methods.items():
        box.setChecked(m in chosen)
