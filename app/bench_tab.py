"""The Benchmark tab: run the prompt suite or the batch sweep on the loaded models, show the table and the
speedup chart, export results.json, the Markdown table and PNG charts. The run itself is a worker job."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.estimate import PhaseClock
from app.theme import variant_color
from engine import GlanceError, SamplingConfig
from engine.bench.reference import REFERENCES
from engine.bench.report import LABELS, markdown, write


class BenchmarkTab(QWidget):
    runRequested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.mode = QComboBox()
        self.mode.addItems(["prompt suite", "batch sweep"])
        self.prompts = QSpinBox()
        self.prompts.setRange(1, 1000)
        self.prompts.setValue(8)
        self.prompts.setToolTip("prompts taken evenly from the bundled suite")
        self.repeats = QSpinBox()
        self.repeats.setRange(1, 20)
        self.max_new = QSpinBox()
        self.max_new.setRange(1, 4096)
        self.max_new.setValue(48)
        self.batch_sizes = QLineEdit("1,2,4,8")
        self.batching = QComboBox()
        self.batching.addItem("static", "static")
        self.batching.addItem("continuous", "continuous")
        self.batching.setToolTip(
            "static: each batch of prompts runs until its slowest row ends, finished rows idle\n"
            "continuous: finished rows take the next waiting prompts, as servers batch"
        )
        self.budget = QComboBox()
        self.budget.addItem("default", None)
        self.budget.addItem("cost-aware", "auto")
        self.budget.addItem("full", "full")
        self.budget.setToolTip(
            "how much each step drafts (default: cost-aware for the suite, full drafts for the sweep,\n"
            "so the sweep shows where batching kills the win undamped)"
        )
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setToolTip("0 = greedy (the benchmark's own setting, not the race panel's)")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.references = QCheckBox("transformers' rows")
        self.references.setToolTip(
            "add transformers' generate, assisted generation and prompt lookup as reference rows"
        )
        self.references.setChecked(True)
        self.run = QPushButton("Run benchmark")
        self.export = QPushButton("Export…")
        self.export.setEnabled(False)
        self.clock = PhaseClock()
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m  %p%")
        self.table = QTextBrowser()
        self.plot = pg.PlotWidget()
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.addLegend(offset=(-10, 10))  # top right: the sweep curves fall to the right
        self.results: dict | None = None

        # Controls in two rows on top, so the table gets the tab's full width (beside a form it squeezed its headers).
        controls = QGridLayout()
        rows = [
            [("run", self.mode), ("prompts", self.prompts), ("repeats", self.repeats)],
            [("max new", self.max_new), ("temperature", self.temperature), ("seed", self.seed)],
            [("batch sizes", self.batch_sizes)],
        ]
        for r, row in enumerate(rows):
            for c, (label, widget) in enumerate(row):
                controls.addWidget(QLabel(label), r, 2 * c)
                controls.addWidget(widget, r, 2 * c + 1)
        # The sweep's and suite's switches in a row of their own beside the reference rows' box: in the grid's
        # columns they widened the window past 1024 pixels.
        switches = QHBoxLayout()
        switches.addWidget(self.references)
        for label, combo in (("batching", self.batching), ("draft size", self.budget)):
            switches.addSpacing(12)
            switches.addWidget(QLabel(label))
            switches.addWidget(combo)
        switches.addStretch(1)
        controls.addLayout(switches, 3, 0, 1, 7)
        controls.addWidget(self.run, 0, 7)
        controls.addWidget(self.export, 1, 7)
        self.mode.setMinimumContentsLength(6)
        self.mode.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        controls.setColumnStretch(6, 1)
        self.table.setMinimumWidth(300)
        split = QSplitter()
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setSizes([700, 400])
        lay = QVBoxLayout(self)
        lay.addLayout(controls)
        lay.addWidget(self.progress)
        lay.addWidget(split, 1)
        self.run.clicked.connect(self.runRequested.emit)
        self.export.clicked.connect(self._ask_export)

    def sweep_sizes(self) -> list[int] | None:
        """Batch sizes when the sweep is chosen, else None; raises GlanceError on bad input."""
        if self.mode.currentText() != "batch sweep":
            return None
        try:
            sizes = [int(x) for x in self.batch_sizes.text().split(",") if x.strip()]
        except ValueError:
            raise GlanceError(f"batch sizes are comma-separated integers (got {self.batch_sizes.text()!r})") from None
        if not sizes or min(sizes) < 1:
            raise GlanceError("give at least one positive batch size, e.g. 1,2,4,8")
        return sizes

    def continuous(self) -> bool:
        """Whether the sweep batches continuously (finished rows take waiting prompts)."""
        return self.batching.currentData() == "continuous"

    def draft_budget(self) -> str | None:
        """The draft budget: "auto", "full", or None for the default (auto for the suite, full for the sweep)."""
        return self.budget.currentData()

    def methods(self, available: list[str], session) -> list[str]:
        """The ticked lanes, and with `references` transformers' rows that can run with what `session` loaded."""
        from engine.bench.reference import reference_available

        ok = [r for r in REFERENCES if reference_available(r, session.target.model, session.parts)]
        refs = ok if self.references.isChecked() else []
        return available + (refs if self.mode.currentText() == "prompt suite" else [])

    def sampling(self) -> SamplingConfig:
        """The benchmark's own sampling settings (shown in its controls, recorded in its results)."""
        return SamplingConfig(self.temperature.value(), 1.0, self.seed.value())

    def set_running(self, running: bool) -> None:
        self.run.setEnabled(not running)
        if running:
            self.clock = PhaseClock()
            self.progress.setRange(0, 1)
            self.progress.setValue(0)

    def on_progress(self, done: int, total: int, what: str) -> None:
        """The phase by name in the bar itself (the cost model's phase restarts the count), with an estimate."""
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        phase = next((p for p in ("cost model", "warm-up", "compiling") if what.startswith(p)), "runs")
        left = self.clock.left(phase, done, total)
        self.progress.setFormat(f"{phase}: %v / %m" + (f" · {left}" if left else ""))
        self.progress.setToolTip(what)

    def show_results(self, results: dict) -> None:
        self.results = results
        self.table.setMarkdown(markdown(results))
        self.export.setEnabled(True)
        self.plot.clear()
        if "sweep" in results:
            sw = results["sweep"]
            self.mode.setCurrentText("batch sweep")  # the controls show what produced the results
            self.batch_sizes.setText(",".join(str(b) for b in sw["batch_sizes"]))
            self.batching.setCurrentIndex(1 if sw.get("continuous") else 0)
            self.plot.getAxis("left").setTicks(None)
            self.plot.setLogMode(x=True, y=False)  # batch sizes double: equal steps on the axis
            self.plot.getAxis("bottom").setTicks([[(math.log10(b), str(b)) for b in sw["batch_sizes"]]])
            self.plot.setLabel("bottom", "batch size (log scale; dashed: predicted)")
            self.plot.setLabel("left", "speedup over batched plain decoding")
            for m in sw["methods"]:
                if m == "ar":
                    continue
                ys = [(sw["rows"].get(b) or sw["rows"][str(b)])[m]["speedup"] for b in sw["batch_sizes"]]  # JSON: str
                self.plot.plot(
                    sw["batch_sizes"],
                    ys,
                    pen=pg.mkPen(variant_color(m), width=2),
                    symbol="o",
                    symbolBrush=variant_color(m),
                    symbolPen=None,
                    name=LABELS.get(m, m),
                )
                pred = sw.get("predictions", {}).get(m, {}).get("predicted_speedup", {})
                pred = {int(b): v for b, v in pred.items() if v is not None}
                xs = [b for b in sw["batch_sizes"] if b in pred]
                if xs:  # the cost model's forecast, dashed in the method's colour
                    dashed = pg.mkPen(variant_color(m), width=1, style=pg.QtCore.Qt.PenStyle.DashLine)
                    self.plot.plot(xs, [pred[b] for b in xs], pen=dashed)
            self.plot.addLine(y=1.0, pen=pg.mkPen("#888", style=pg.QtCore.Qt.PenStyle.DashLine))
        elif "suite" in results:
            self.mode.setCurrentText("prompt suite")
            self.plot.setLogMode(x=False, y=False)
            methods = [m for m, r in results["suite"]["methods"].items() if r.get("speedup") is not None]
            # Horizontal bars: the method names sit one per row on the left axis and never overlap.
            self.plot.setLabel("bottom", "speedup over plain decoding")
            self.plot.setLabel("left", "")
            speedups = [results["suite"]["methods"][m]["speedup"] for m in methods]
            brushes = [variant_color(m) for m in methods]
            rows = list(range(len(methods)))
            self.plot.addItem(pg.BarGraphItem(x0=0, y=rows, width=speedups, height=0.6, brushes=brushes))
            # whiskers: the lowest and highest speedup of one prompt's run against the plain runs beside it
            spread = [(i, results["suite"]["methods"][m].get("speedup_per_prompt")) for i, m in enumerate(methods)]
            spread = [(i, s) for i, s in spread if s]
            if spread:
                self.plot.addItem(
                    pg.ErrorBarItem(
                        x=np.array([s[1] for _, s in spread]),
                        y=np.array([i for i, _ in spread], dtype=float),
                        left=np.array([s[1] - s[0] for _, s in spread]),
                        right=np.array([s[2] - s[1] for _, s in spread]),
                        beam=0.2,
                        pen=pg.mkPen("#ddd", width=1),
                    )
                )
            self.plot.getAxis("left").setTicks([[(i, LABELS.get(m, m)) for i, m in enumerate(methods)]])
            self.plot.getAxis("bottom").setTicks(None)
            self.plot.addLine(x=1.0, pen=pg.mkPen("#888", style=pg.QtCore.Qt.PenStyle.DashLine))

    def export_to(self, folder: Path) -> list[Path]:
        if self.results is None:
            raise GlanceError("no benchmark results yet: run one first")
        try:
            return write(self.results, Path(folder))
        except OSError as exc:
            raise GlanceError(f"cannot write the benchmark to {folder}: {exc.strerror or exc}") from None

    def _ask_export(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export benchmark to folder", str(Path.home()))
        if folder:
            try:
                paths = self.export_to(Path(folder))
                self.progress.setToolTip("wrote " + ", ".join(p.name for p in paths))
            except GlanceError as exc:
                self.table.append(f"\n{exc}")
