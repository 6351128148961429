"""Live charts, one color per variant on shared axes: accepted length per step, throughput over each lane's own
clock, histogram of accepted lengths, and acceptance by draft depth. Items are created once and fed by setData."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGridLayout, QWidget

from app.theme import variant_color
from engine import RunStats, StepEvent

CHARTS = {
    "accepted": ("Accepted length per step", "step", "tokens"),
    "throughput": ("Throughput", "lane clock (s)", "tokens/s"),
    "histogram": ("Accepted lengths", "tokens per step", "steps"),
    "depth": ("Acceptance by draft depth", "depth", "P(accept | reached)"),
}


@dataclass
class LaneSeries:
    steps: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    items: dict = field(default_factory=dict)
    dirty: bool = False  # data arrived that the plot items do not show yet

    def add(self, ev: StepEvent) -> None:
        self.dirty = True
        self.stats.add(ev)
        if ev.clock > 0:
            self.clocks.append(ev.clock)
            self.rates.append(self.stats.tokens_per_second)
        if ev.step == 0:
            return
        self.steps.append(ev.step)
        self.lengths.append(len(ev.tokens))


class ChartsWidget(QWidget):
    pointClicked = Signal(str, int)  # lane name, step

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, pg.PlotWidget] = {}
        grid = QGridLayout(self)
        for i, (key, (title, x, y)) in enumerate(CHARTS.items()):
            w = pg.PlotWidget(title=title)
            w.setLabel("bottom", x)
            w.setLabel("left", y)
            w.showGrid(x=True, y=True, alpha=0.2)
            w.addLegend(offset=(-10, 10))
            grid.addWidget(w, i // 2, i % 2)
            self.plots[key] = w
        self.series: dict[str, LaneSeries] = {}
        self.dirty = False

    def add_lane(self, name: str) -> None:
        color = variant_color(name)
        s = LaneSeries()
        pen = pg.mkPen(color, width=2)
        s.items["accepted"] = self.plots["accepted"].plot(
            [], [], pen=pen, symbol="o", symbolSize=6, symbolBrush=color, name=name
        )
        s.items["accepted"].sigPointsClicked.connect(lambda _item, pts, *a, n=name: self._clicked(n, pts))
        s.items["throughput"] = self.plots["throughput"].plot([], [], pen=pen, name=name)
        s.items["histogram"] = self.plots["histogram"].plot(
            [0, 1],
            [0],
            pen=pen,
            stepMode="center",
            fillLevel=0,
            fillBrush=pg.mkColor(color.red(), color.green(), color.blue(), 60),
            name=name,
        )
        s.items["depth"] = self.plots["depth"].plot([], [], pen=pen, symbol="s", symbolBrush=color, name=name)
        self.series[name] = s

    def _clicked(self, lane: str, points) -> None:
        if len(points):
            self.pointClicked.emit(lane, int(points[0].pos().x()))

    def add_event(self, lane: str, ev: StepEvent) -> None:
        self.series[lane].add(ev)
        self.dirty = True

    def refresh(self) -> None:
        """Push buffered data into the plot items (called at screen rate, only when something changed)."""
        if not self.dirty:
            return
        for s in self.series.values():
            if not s.dirty:
                continue
            s.dirty = False
            s.items["accepted"].setData(np.array(s.steps), np.array(s.lengths))
            s.items["throughput"].setData(np.array(s.clocks), np.array(s.rates))
            counts = Counter(s.lengths)
            top = max(counts, default=1)
            edges = np.arange(0.5, top + 1.5)
            s.items["histogram"].setData(edges, np.array([counts.get(k, 0) for k in range(1, top + 1)]))
            rates = s.stats.acceptance_by_depth
            s.items["depth"].setData(np.arange(1, len(rates) + 1), np.array(rates))
        self.dirty = False

    def clear(self) -> None:
        for s in self.series.values():
            for key, item in s.items.items():
                self.plots[key].removeItem(item)
        for p in self.plots.values():
            if p.plotItem.legend is not None:
                p.plotItem.legend.clear()
        self.series.clear()

    def export_png(self, folder) -> list[str]:
        from pyqtgraph.exporters import ImageExporter

        written = []
        for key, plot in self.plots.items():
            path = f"{folder}/chart_{key}.png"
            exporter = ImageExporter(plot.plotItem)
            exporter.parameters()["width"] = 800
            exporter.export(path)
            written.append(path)
        return written
