"""The left-hand panels: models, prompt with presets, generation settings and per-variant knobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.estimate import PhaseClock
from app.knobs import DrafterKnobs, narrow
from app.theme import RESOURCES
from engine import DRAFTERS, METHODS, installed, parts

PROMPTS = RESOURCES / "prompts" / "suite.jsonl"
# prompts each kind of model answers well: the bundled code model continues a class; an instruct model gets a question
DEFAULT_PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):'
CHAT_PROMPT = "Explain in two sentences why the sky is blue."
REAL_MODEL = "smollm2"  # the catalog model one click away


def _path_row(edit: QLineEdit, parent: QWidget, models: bool = False) -> QWidget:
    """The field and a "…" menu: a model folder, a GGUF file, and (for models) every installed catalog model."""
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(edit, 1)
    browse = QToolButton()
    browse.setText("…")
    browse.setToolTip("choose a model folder, a .gguf file or an installed model")
    browse.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
    menu = QMenu(browse)

    def pick_folder() -> None:
        folder = QFileDialog.getExistingDirectory(parent, "Model folder", edit.text() or str(Path.home()))
        if folder:
            edit.setText(folder)

    def pick_gguf() -> None:
        path, _ = QFileDialog.getOpenFileName(parent, "GGUF file", str(Path.home()), "GGUF models (*.gguf)")
        if path:
            edit.setText(path)

    def fill() -> None:  # installed models can change while the window is open: list them when the menu opens
        menu.clear()
        menu.addAction("Model folder…", pick_folder)
        menu.addAction("GGUF file…", pick_gguf)
        if models:
            menu.addSeparator()
            menu.addAction("bundled demo model", lambda: edit.setText(""))
            for name in installed():
                menu.addAction(name, lambda n=name: edit.setText(n))

    menu.aboutToShow.connect(fill)
    fill()
    browse.setMenu(menu)
    lay.addWidget(browse)
    return row


def _row(*widgets: QWidget) -> QWidget:
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        lay.addWidget(w)
    return row


class ModelPanel(QGroupBox):
    """The target and one field per part the registered drafters need (draft model, heads), device and dtype."""

    def __init__(self) -> None:
        super().__init__("Models")
        self.target = QLineEdit()
        self.target.setPlaceholderText("bundled demo target (or a folder, .gguf file, hub id or installed model)")
        self.parts: dict[str, QLineEdit] = {}
        for part in parts():
            edit = QLineEdit()
            empty = "the one bundled for the target, if any" if part.bundled is not None else "none"
            edit.setPlaceholderText(f"a folder{' / .gguf / hub id' if part.key == 'draft' else ''} (empty: {empty})")
            edit.setToolTip(part.help)
            self.parts[part.key] = edit
            setattr(self, part.key, edit)  # model_panel.draft, .medusa, ...
        self.device = QComboBox()
        self.device.addItems(["auto", "cpu", "cuda", "mps"])
        self.dtype = QComboBox()
        self.dtype.addItems(["auto", "float32", "bfloat16", "float16"])
        self.allow_download = QCheckBox("allow hub downloads")
        self.compile = QCheckBox()
        self.set_compile_time(None)
        self.compile.setToolTip(
            "torch.compile: compiles the target's and the draft model's forwards and the EAGLE heads' drafting "
            "steps when loading (with progress; the time it took here last is shown); every method decodes faster "
            "after. Off (the default): the models "
            "load in seconds and race eager; each lane's title says which forward it ran."
        )
        self.load = QPushButton("Load")
        self.real = QPushButton()  # the real model, one click away: installed and loaded, or installed first
        self.update_real_button()
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setVisible(False)
        # what is loading, on a line of its own: in the bar, "compiling the target for several tokens (once per
        # session)" wrapped and was clipped at the window's default width
        self.stage = QLabel()
        self.stage.setWordWrap(True)
        self.stage.setVisible(False)
        self.info = QLabel("no model loaded")
        self.info.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow("target", _path_row(self.target, self, models=True))
        for key, edit in self.parts.items():
            form.addRow(key, _path_row(edit, self))
        form.addRow("device", self.device)
        form.addRow("dtype", self.dtype)
        form.addRow(self.allow_download)
        form.addRow(self.compile)
        form.addRow(self.load, self.busy)
        form.addRow(self.real)
        form.addRow(self.stage)
        form.addRow(self.info)

    def update_real_button(self) -> None:
        from engine.models.catalog import CATALOG

        entry = CATALOG[REAL_MODEL]
        ready = entry.name in installed()
        self.real.setText(f"Race {entry.name}" if ready else f"Install and race {entry.name}")
        self.real.setToolTip(entry.about)

    def set_compile_time(self, seconds: float | None) -> None:
        """Say what compiling costs: what it took on this machine last time, once known."""
        cost = f"took {seconds:.0f} s here" if seconds else "minutes on a small CPU"
        self.compile.setText(f"compile ({cost})")

    def part_paths(self) -> dict[str, str]:
        return {key: edit.text().strip() for key, edit in self.parts.items()}

    def set_busy(self, busy: bool) -> None:
        self.busy.setRange(0, 0)  # moving until the first progress report
        self.busy.setFormat("")
        self.busy.setVisible(busy)
        self.clock = PhaseClock()
        self.stage.clear()
        self.stage.setVisible(busy)
        self.load.setEnabled(not busy)

    def on_progress(self, done: int, total: int, what: str) -> None:
        """Which model or part is loading, and how many of the load's parts are done."""
        self.busy.setRange(0, total)
        self.busy.setValue(done)
        self.busy.setFormat(f"{done}/{total}")
        self.busy.setTextVisible(True)
        self.busy.setToolTip(what)
        left = self.clock.left("load", done, total) if total else ""
        self.stage.setText(f"{what} · {left}" if left else what)


class PromptPanel(QGroupBox):
    def __init__(self) -> None:
        super().__init__("Prompt")
        self.presets = QComboBox()
        narrow(self.presets)
        self.presets.addItem("(custom)", None)
        for rec in load_presets():
            self.presets.addItem(f"{rec['category']} · {rec['id']}", rec["prompt"])
        self.text = QPlainTextEdit(DEFAULT_PROMPT)
        self.text.setMinimumHeight(90)
        self.chat = QCheckBox("as a chat message")
        self.chat.setToolTip(
            "wrap the prompt in the model's chat template (only for models that have one); generation stops at its "
            "end of turn"
        )
        self.chat.setEnabled(False)
        self.presets.currentIndexChanged.connect(self._preset)
        lay = QVBoxLayout(self)
        lay.addWidget(self.presets)
        lay.addWidget(self.text)
        lay.addWidget(self.chat)

    def set_chat_available(self, available: bool) -> None:
        """A model loaded: chat is offered, and on by default, exactly when its tokenizer has a template; a prompt
        left at one default becomes the other's, so the first race asks what the model answers well."""
        self.chat.setEnabled(available)
        self.chat.setChecked(available)
        if self.text.toPlainText() in (DEFAULT_PROMPT, CHAT_PROMPT):
            self.text.setPlainText(CHAT_PROMPT if available else DEFAULT_PROMPT)

    def chat_wanted(self) -> bool:
        return self.chat.isEnabled() and self.chat.isChecked()

    def _preset(self, index: int) -> None:
        prompt = self.presets.itemData(index)
        if prompt:
            self.text.setPlainText(prompt)


class SettingsPanel(QGroupBox):
    """Sampling, length, which methods race, and every drafter's knobs (generated from the registry)."""

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
        self.budget = QComboBox()
        self.budget.addItem("cost-aware", "auto")
        self.budget.addItem("full", "full")
        self.budget.setToolTip(
            "cost-aware: each step drafts as deep as the measured step times and acceptance say pays (this run's, "
            "starting from the last run's of the same model and settings), down to a plain step (the chosen depth "
            "shows in the step inspector) · full: every step drafts as much as "
            "the drafter's settings allow, as in the papers"
        )
        self.methods: dict[str, QCheckBox] = {}
        for s in DRAFTERS:
            box = QCheckBox(s.name)
            box.setChecked(s.in_default_race)
            box.setToolTip(f"{s.label}: {s.summary}")
            box.setStyleSheet(f"QCheckBox {{ color: {s.color} }}")
            self.methods[s.name] = box
        self.knobs = DrafterKnobs()
        self.sequential = QCheckBox("one lane at a time")
        self.sequential.setToolTip("run the lanes one after another (benchmark mode) instead of interleaved steps")
        self.show_rejected = QCheckBox("show rejected drafts")
        self.show_rejected.setToolTip("draw rejected draft tokens struck through after the tokens that replaced them")
        self.run_one = QComboBox()
        self.run_one.addItems(list(METHODS))
        form = QFormLayout(self)
        form.addRow("max new tokens", self.max_new)
        form.addRow("temperature", self.temperature)
        form.addRow("top-p", self.top_p)
        form.addRow("seed", self.seed)
        form.addRow("draft size", self.budget)
        grid = QWidget()
        gl = QGridLayout(grid)
        gl.setContentsMargins(0, 0, 0, 0)
        for i, box in enumerate(self.methods.values()):
            gl.addWidget(box, i // 3, i % 3)
        form.addRow(QLabel("race these variants:"))
        form.addRow(grid)  # a full row: beside a label the three columns would widen the panel
        form.addRow(self.knobs)
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
    for key, path in models.part_paths().items():
        settings.setValue(key, path)
    settings.setValue("device", models.device.currentText())
    settings.setValue("dtype", models.dtype.currentText())
    settings.setValue("compile", models.compile.isChecked())
    settings.setValue("prompt", prompt.text.toPlainText())
    settings.setValue("max_new", gen.max_new.value())
    settings.setValue("temperature", gen.temperature.value())
    settings.setValue("top_p", gen.top_p.value())
    settings.setValue("seed", gen.seed.value())
    settings.setValue("draft_budget", gen.budget.currentData())
    for name, value in gen.knobs.values().items():
        settings.setValue(f"drafters/{name}", value)
    settings.setValue("sequential", gen.sequential.isChecked())
    settings.setValue("show_rejected", gen.show_rejected.isChecked())
    settings.setValue("methods", ",".join(gen.chosen_methods()))


def restore_settings(models: ModelPanel, prompt: PromptPanel, gen: SettingsPanel, settings: QSettings) -> str:
    """Put the saved settings into the panels through one schema (app/saved_settings.py); returns one line naming
    the values that did not fit and were left at their defaults ("" when all fit)."""
    from app.saved_settings import notice, restore

    problems: dict[str, str] = {}

    def put(key: str, widget, default=None) -> None:
        why = restore(widget, settings.value(key, default))
        if why is not None:
            problems[key] = why

    put("target", models.target, "")
    for key, edit in models.parts.items():
        put(key, edit, "")
    put("device", models.device, "auto")
    put("dtype", models.dtype, "auto")
    put("compile", models.compile, False)  # a first race in seconds; compiling is asked for
    try:
        seconds = float(settings.value("compile_seconds", 0.0))
    except (TypeError, ValueError, OverflowError):
        seconds = 0.0
    models.set_compile_time(seconds if math.isfinite(seconds) and 0 < seconds < 86_400 else None)
    prompt.text.setPlainText(DEFAULT_PROMPT)
    put("prompt", prompt.text)
    for key, widget in (
        ("max_new", gen.max_new),
        ("temperature", gen.temperature),
        ("top_p", gen.top_p),
        ("seed", gen.seed),
        ("sequential", gen.sequential),
        ("show_rejected", gen.show_rejected),
    ):
        put(key, widget)  # fmt: skip
    budget = gen.budget.findData(str(settings.value("draft_budget", "auto")))
    if budget < 0:
        problems["draft_budget"] = f"{str(settings.value('draft_budget'))[:40]!r} is not a budget"
    gen.budget.setCurrentIndex(max(0, budget))
    for name, widget in gen.knobs.widgets.items():
        put(f"drafters/{name}", widget)
    chosen = str(settings.value("methods", ",".join(s.name for s in DRAFTERS if s.in_default_race))).split(",")
    for m, box in gen.methods.items():
        box.setChecked(m in chosen)
    return notice(problems)
