"""Live charts, one colour per variant on shared axes. First the race itself: tokens generated against each lane's own
clock, the finish marked. Then accepted length per step, the histogram of accepted lengths (bars side by side) and
acceptance by draft depth; plain decoding is left out of those three (it always accepts one token and would only
stretch their axes). Items are created once and fed by setData."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGraphicsView, QGridLayout, QWidget

from app.theme import variant_color
from engine import BASELINE, RunStats, RunSummary, StepEvent

MIN_DEPTH_SAMPLES = 5  # acceptance at a depth from fewer steps than this is not plotted: one or two read as 0 or 1
CHARTS = {
    "race": ("The race: tokens generated", "lane clock (s)", "tokens"),
    "accepted": ("Accepted length per step", "step", "tokens"),
    "histogram": ("Accepted lengths", "tokens per step", "steps"),
    "depth": (f"Acceptance by draft depth ({MIN_DEPTH_SAMPLES}+ steps; hover: counts)", "depth", "P(accept | reached)"),
}
SPECULATIVE_ONLY = ("accepted", "histogram", "depth")  # charts where plain decoding carries no information
THEMES = {"dark": ("#14161c", "#c8ccd4"), "light": ("#ffffff", "#30343c")}  # background, axes and text


@dataclass
class LaneSeries:
    steps: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    items: dict = field(default_factory=dict)
    dirty: bool = False  # data arrived that the plot items do not show yet

    def add(self, ev: StepEvent) -> None:
        """Buffer the step's points; `stats` is the lane's own, already updated by the lane."""
        self.dirty = True
        self.clocks.append(ev.clock)
        self.tokens.append(ev.new_tokens)
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
            for axis in ("bottom", "left"):
                w.getAxis(axis).enableAutoSIPrefix(False)  # no "(x0.001)" scale notes on the axes
            w.setMinimumSize(160, 120)
            grid.addWidget(w, i // 2, i % 2)
            self.plots[key] = w
        # One legend, on the race chart, in columns so that every lane fits; the other charts share its colours.
        self.legend = self.plots["race"].addLegend(offset=(8, 8), colCount=3, labelTextSize="8pt")
        self.plots["histogram"].getAxis("bottom").setTickSpacing(1, 1)
        self.plots["depth"].getAxis("bottom").setTickSpacing(1, 1)
        self.plots["depth"].setYRange(0, 1)
        self.series: dict[str, LaneSeries] = {}
        self.dirty = False

    def set_theme(self, theme: str) -> None:
        """Chart background, axes and titles for the dark or light theme."""
        background, ink = THEMES.get(theme, THEMES["dark"])
        for key, w in self.plots.items():
            w.setBackground(background)
            w.setTitle(CHARTS[key][0], color=ink)
            for axis in ("bottom", "left"):
                ax = w.getAxis(axis)
                ax.setPen(ink)
                ax.setTextPen(ink)
            w.setLabel("bottom", CHARTS[key][1], color=ink)
            w.setLabel("left", CHARTS[key][2], color=ink)
        self.legend.setLabelTextColor(ink)
        for _, label in self.legend.items:  # the labels already shown too, not only the next race's
            label.setText(label.text, color=ink)

    def add_lane(self, name: str, stats: RunStats) -> None:
        """Series for one lane, reading the lane's running statistics (not a second copy fed the same events)."""
        color = variant_color(name)
        s = LaneSeries(stats=stats)
        pen = pg.mkPen(color, width=2)
        s.items["race"] = self.plots["race"].plot([], [], pen=pen, name=name)
        s.items["finish"] = pg.ScatterPlotItem([], [], symbol="star", size=14, brush=color, pen=pg.mkPen(color))
        self.plots["race"].addItem(s.items["finish"])
        if name != BASELINE:
            s.items["accepted"] = self.plots["accepted"].plot(
                [], [], pen=pen, symbol="o", symbolSize=5, symbolBrush=color
            )
            s.items["accepted"].sigPointsClicked.connect(lambda _item, pts, *a, n=name: self._clicked(n, pts))
            s.items["histogram"] = pg.BarGraphItem(x=[], height=[], width=0.2, brush=color, pen=pg.mkPen(None))
            self.plots["histogram"].addItem(s.items["histogram"])
            s.items["depth"] = self.plots["depth"].plot([], [], pen=pen, symbol="s", symbolSize=6, symbolBrush=color)
        self.series[name] = s

    def _clicked(self, lane: str, points) -> None:
        if len(points):
            self.pointClicked.emit(lane, int(points[0].pos().x()))

    def add_event(self, lane: str, ev: StepEvent) -> None:
        self.series[lane].add(ev)
        self.dirty = True

    def finish(self, lane: str, summary: RunSummary) -> None:
        """Mark where a lane crossed the line: its last token count at its last clock."""
        s = self.series.get(lane)
        if s is not None:
            s.items["finish"].setData([summary.wall_seconds], [summary.new_tokens])

    def set_live(self, live: bool) -> None:
        """While a race runs, each chart repaints once per refresh, not once per item change: pyqtgraph's own
        updates repainted every chart three or four times per refresh, most of what the window cost the engine
        (app/bench_window.py). Afterwards the charts repaint on their own again (hover, zoom, pan)."""
        mode = QGraphicsView.ViewportUpdateMode
        for w in self.plots.values():
            w.setViewportUpdateMode(mode.NoViewportUpdate if live else mode.MinimalViewportUpdate)
            if not live:
                w.viewport().update()

    def refresh(self) -> None:
        """Push buffered data into the plot items (called at screen rate, only when something changed)."""
        if not self.dirty:
            return
        for w in self.plots.values():
            w.viewport().update()  # one repaint each, whatever the update mode
        speculative = [n for n in self.series if n != BASELINE]
        width = 0.8 / max(1, len(speculative))
        for name, s in self.series.items():
            if not s.dirty:
                continue
            s.dirty = False
            s.items["race"].setData(np.array(s.clocks), np.array(s.tokens))
            if name == BASELINE:
                continue
            s.items["accepted"].setData(np.array(s.steps), np.array(s.lengths))
            counts = Counter(s.lengths)
            lengths = sorted(counts)
            offset = (speculative.index(name) - (len(speculative) - 1) / 2) * width  # bars side by side per length
            s.items["histogram"].setOpts(
                x=np.array(lengths, dtype=float) + offset, height=[counts[k] for k in lengths], width=width
            )
            by_depth = s.stats.by_depth
            shown = [d for d, n in enumerate(by_depth.reached) if n >= MIN_DEPTH_SAMPLES]  # too few: no point
            rates = [by_depth.accepted[d] / by_depth.reached[d] for d in shown]
            s.items["depth"].setData(np.array(shown, dtype=float) + 1, np.array(rates))
            s.items["depth"].setToolTip(
                f"{name}: "
                + ", ".join(f"depth {d + 1}: {n} steps" for d, n in enumerate(by_depth.reached))
                + f" (points need {MIN_DEPTH_SAMPLES})"
            )
        self.dirty = False

    def clear(self) -> None:
        for s in self.series.values():
            for key, item in s.items.items():
                self.plots["race" if key == "finish" else key].removeItem(item)
        self.legend.clear()
        self.series.clear()

    def export_png(self, folder) -> list[str]:
        """Each chart as a PNG in `folder`, rendered in memory and written whole or not at all (a full disk gives
        a GlanceError, never a truncated image)."""
        from pyqtgraph.exporters import ImageExporter
        from PySide6.QtCore import QBuffer, QIODevice

        from engine.records.files import write_bytes_checked

        written = []
        for key, plot in self.plots.items():
            exporter = ImageExporter(plot.plotItem)
            exporter.parameters()["width"] = 800
            image = exporter.export(toBytes=True)
            buffer = QBuffer()
            buffer.open(QIODevice.OpenModeFlag.WriteOnly)
            image.save(buffer, "PNG")
            written.append(str(write_bytes_checked(f"{folder}/chart_{key}.png", bytes(buffer.data()))))
        return written
