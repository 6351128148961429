"""The "Why" tab: what verifying k tokens at once costs this target on this device, against one token, with where
each lane's verification forwards sat on that curve, and, after a batch sweep, the batch size at which each method
stopped paying. Decoding is memory bound while the curve stays flat; a lane's speedup comes from there."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

from app.theme import variant_color
from engine.bench.report import LABELS
from engine.bench.sweep import break_even

WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)  # tokens a row per forward, timed on demand


class WhyView(QWidget):
    timeRequested = Signal()  # the user asked to time the target's forwards over WIDTHS

    def __init__(self) -> None:
        super().__init__()
        self.costs: dict[int, float] = {}
        self.lanes: dict[str, float] = {}  # lane -> its mean tokens verified per forward
        self.device = ""
        self.intro = QLabel(
            "Verifying k drafted tokens costs one forward over k + 1 tokens. While that costs about as much as one "
            "token (a flat curve: decoding reads every weight once per forward, memory bound), each accepted draft "
            "token is nearly free; where the curve climbs (a compute-bound device, or a large batch) the win goes."
        )
        self.intro.setWordWrap(True)
        self.time_button = QPushButton(f"Time the target's forwards ({WIDTHS[0]}-{WIDTHS[-1]} tokens)")
        self.time_button.clicked.connect(self.timeRequested)
        self.plot = pg.PlotWidget()
        self.plot.setLabel("bottom", "tokens verified per forward")
        self.plot.setLabel("left", "forward time / one-token forward")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.plot.addLegend(offset=(10, 10))
        self.note = QLabel("")
        self.note.setWordWrap(True)
        lay = QVBoxLayout(self)
        for w in (self.intro, self.time_button, self.plot, self.note):
            lay.addWidget(w)

    def set_costs(self, costs: dict[int, float], device: str) -> None:
        """The target's forward seconds by tokens per forward, measured on `device` (a description)."""
        self.costs, self.device = dict(sorted(costs.items())), device
        self.redraw()

    def set_lanes(self, widths: dict[str, float]) -> None:
        """Each finished lane's mean tokens per verification forward."""
        self.lanes = dict(widths)
        self.redraw()

    def set_sweep(self, sweep: dict) -> None:
        parts = [
            f"{LABELS.get(m, m)}: " + (f"no faster than plain from batch {b}" if b else "paid at every batch size")
            for m, b in break_even(sweep).items()
        ]
        self.note.setText("Batch sweep: " + "; ".join(parts) if parts else "")

    def redraw(self) -> None:
        self.plot.clear()
        if not self.costs or 1 not in self.costs:
            return
        one = self.costs[1]
        xs = list(self.costs)
        ys = [self.costs[k] / one for k in xs]
        self.plot.plot(xs, ys, pen=pg.mkPen("#90a4ae", width=2), symbol="o", name=f"target on {self.device}")
        for i, (lane, width) in enumerate(sorted(self.lanes.items(), key=lambda x: x[1])):
            color = variant_color(lane)
            line = pg.InfiniteLine(pos=width, angle=90, pen=pg.mkPen(color, width=2, style=pg.QtCore.Qt.DashLine))
            line.setToolTip(f"{lane}: {width:.1f} tokens verified per forward on average")
            self.plot.addItem(line)
            label = pg.TextItem(LABELS.get(lane, lane), color=color, anchor=(0, 1))
            label.setPos(width, max(ys) - i * (max(ys) - 1) / max(8, len(self.lanes)))  # staggered: lanes sit close
            self.plot.addItem(label)
