"""The main window: panels on the left, one lane per variant, charts and the step inspector below.

The window never calls the engine on the GUI thread: loading and racing are jobs on the worker thread, whose
events arrive by queued signals, are written to the autosaved session log, and are rendered once per frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths, Qt, QTimer
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.bench_tab import BenchmarkTab
from app.charts import ChartsWidget
from app.controller import Controller
from app.controls import (
    REAL_MODEL,
    ModelPanel,
    PromptPanel,
    SettingsPanel,
    restore_settings,
    save_settings,
    watch_changes,
)
from app.export import export_session
from app.inspector import StepInspector
from app.jobs import Job
from app.method_card import card_html
from app.race_view import RaceView
from app.theme import app_icon, style_sheet
from app.why_view import WIDTHS as WHY_WIDTHS
from app.why_view import WhyView
from engine import (
    DrafterOptions,
    GlanceError,
    RaceSettings,
    SamplingConfig,
    installed,
    read_target_top,
    render_serving,
    write_text_checked,
)

LEFT_MIN_WIDTH = 360  # the left column's width: every control fits in it (tests check at 1280 x 800)
SETTINGS_SAVE_MS = 400  # save settings this long after the last change (a crash or kill then loses nothing)


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings | None = None, autosave_dir: Path | None = None, autoload: bool = True):
        super().__init__()
        self.setWindowTitle("Glance — speculative decoding playground")
        self.setWindowIcon(app_icon())
        self.settings = settings or QSettings("Glance", "Glance")
        self.autosave_dir = Path(
            autosave_dir
            or os.environ.get("GLANCE_AUTOSAVE_DIR")
            or Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "autosave"
        )
        self.controller = Controller(self.autosave_dir)
        self.opened_log: Path | None = None  # a log opened with File > Open, while it is what the screen shows
        self.log_offsets: dict[tuple[str, int], int] = {}  # (lane, step) -> its line in the opened log
        self.opened_run = -1  # which run of that file the screen shows
        self.opening: tuple[Path, bool] = (Path(), False)  # the log being read, and whether to replay it in time

        self.model_panel, self.prompt_panel, self.gen_panel = ModelPanel(), PromptPanel(), SettingsPanel()
        settings_notice = restore_settings(self.model_panel, self.prompt_panel, self.gen_panel, self.settings)
        self.race_button = QPushButton("Race")
        self.race_button.setObjectName("race")
        self.run_one_button = QPushButton("Run one")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop")
        self.stop_button.setEnabled(False)
        self.banner = QLabel("")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("color: #ef5350; font-weight: bold")
        self.banner.setVisible(False)
        self.legend = QLabel(
            "<span style='background:rgba(140,155,181,0.45)'>&nbsp;drafted and accepted&nbsp;</span> (shaded in its "
            "lane's colour, fainter = deeper in the draft) &nbsp; target's own token: plain text &nbsp; "
            "<s style='color:#7b8394'>rejected␣draft</s> &nbsp; ✓ matches plain decoding &nbsp; hover a token for "
            "step, depth and p; click it to inspect the step"
        )
        self.legend.setWordWrap(True)

        left = QWidget()
        ll = QVBoxLayout(left)
        for w in (self.model_panel, self.prompt_panel, self.gen_panel):
            ll.addWidget(w)
        ll.addStretch(1)
        left_scroll = QScrollArea()
        left_scroll.setWidget(left)
        left_scroll.setWidgetResizable(True)
        left_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # fields shrink instead
        left_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.left_scroll = left_scroll
        button_bar = QWidget()  # outside the scroll area: Race and Stop stay visible at every size
        buttons = QHBoxLayout(button_bar)
        buttons.setContentsMargins(8, 4, 8, 4)
        for b in (self.race_button, self.run_one_button, self.stop_button):
            buttons.addWidget(b)
        left_column = QWidget()
        lc = QVBoxLayout(left_column)
        lc.setContentsMargins(0, 0, 0, 0)
        lc.setSpacing(0)
        lc.addWidget(left_scroll, 1)
        lc.addWidget(button_bar)
        left_column.setMinimumWidth(LEFT_MIN_WIDTH)
        self.race_button.setShortcut("Ctrl+R")
        self.race_button.setToolTip("race the ticked variants on the prompt (Ctrl+R)")
        self.stop_button.setShortcut("Esc")

        self.charts = ChartsWidget()
        self.race_view = RaceView(self.charts)
        self.inspector = StepInspector()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.charts, "Charts")
        self.tabs.addTab(self.inspector, "Step inspector")
        self.bench = BenchmarkTab()
        self.tabs.addTab(self.bench, "Benchmark")
        self.why = WhyView()
        self.why.timeRequested.connect(self.time_forwards)
        self.tabs.addTab(self.why, "Why")
        right = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.banner)
        tl.addWidget(self.legend)
        tl.addWidget(self.race_view, 1)
        right.addWidget(top)
        right.addWidget(self.tabs)
        right.setSizes([420, 380])
        split = QSplitter()
        split.addWidget(left_column)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        self.setCentralWidget(split)
        self._menus()
        self.statusBar().showMessage("ready")
        self._fit_to_screen(split)

        c = self.controller
        c.event.connect(self.race_view.show_item)
        c.batch.connect(self.race_view.render_frame)
        c.done.connect(self._on_done)
        c.failed.connect(self._on_failed)
        c.warning.connect(self.show_error)
        c.progress.connect(self._on_progress)
        self.bench.runRequested.connect(self.run_benchmark)
        self.settings_timer = QTimer(self)
        self.settings_timer.setSingleShot(True)
        self.settings_timer.setInterval(SETTINGS_SAVE_MS)
        self.settings_timer.timeout.connect(self.save_settings)
        watch_changes((self.model_panel, self.prompt_panel, self.gen_panel), self.settings_timer.start)

        self.model_panel.load.clicked.connect(lambda: self.load_models())
        self.model_panel.real.clicked.connect(self.race_real_model)
        self.race_button.clicked.connect(lambda: self.race())
        self.run_one_button.clicked.connect(lambda: self.race([self.gen_panel.run_one.currentText()]))
        self.stop_button.clicked.connect(self.stop)
        self.race_view.show_rejected = self.gen_panel.show_rejected.isChecked()
        self.gen_panel.show_rejected.toggled.connect(self.race_view.set_show_rejected)
        self.race_view.stepClicked.connect(self.inspect)
        self.race_view.guideRequested.connect(self.show_guide)
        # Stop (Esc) also ends a replay at recorded speed, which runs on a timer rather than as a job
        self.race_view.replaying.connect(lambda on: self.stop_button.setEnabled(on or bool(self.job)))
        self.apply_theme(str(self.settings.value("theme", "dark")))
        if autoload:
            self.load_models()
        if settings_notice:  # after the load starts (which clears the banner), so it stays until the next action
            self.show_error(settings_notice)

    def _fit_to_screen(self, split: QSplitter) -> None:
        """Open at up to 1500 x 920, never larger than the screen's free area, the left column at its minimum."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        free = screen.availableGeometry() if screen is not None else None
        width = min(1500, free.width() - 20) if free else 1500
        height = min(920, free.height() - 40) if free else 920
        self.resize(width, height)
        split.setSizes([LEFT_MIN_WIDTH + 20, max(400, width - LEFT_MIN_WIDTH - 20)])

    # ---- menus, theme, messages -------------------------------------------------------------------------------
    def _menus(self) -> None:
        file = self.menuBar().addMenu("&File")
        for text, slot in (
            ("&Open log (instant)…", lambda: self._ask_open(False)),
            ("&Replay log at recorded speed…", lambda: self._ask_open(True)),
            ("&Export…", self._ask_export),
            ("Export &serving config…", self._ask_serving),
            ("&Quit", self.close),
        ):
            act = QAction(text, self)
            act.triggered.connect(slot)
            file.addAction(act)
        view = self.menuBar().addMenu("&View")
        group = QActionGroup(self)
        for theme in ("dark", "light"):
            act = QAction(f"{theme.title()} theme", self, checkable=True)
            act.triggered.connect(lambda _=False, t=theme: self.apply_theme(t))
            group.addAction(act)
            view.addAction(act)

    def apply_theme(self, theme: str) -> None:
        self.theme = theme if theme in ("dark", "light") else "dark"
        self.setStyleSheet(style_sheet(self.theme))
        self.charts.set_theme(self.theme)
        self.race_view.set_theme(self.theme)
        self.settings.setValue("theme", self.theme)

    def show_error(self, message: str) -> None:
        self.banner.setText(message)
        self.banner.setVisible(True)
        self.statusBar().showMessage(message, 10000)

    def clear_error(self) -> None:
        self.banner.setVisible(False)
        self.banner.setText("")

    # ---- loading ----------------------------------------------------------------------------------------------
    # ---- state the tests and views read ----------------------------------------------------------------------
    @property
    def lanes(self) -> dict:
        return self.race_view.lanes

    @property
    def frame(self):
        return self.race_view.frame

    @property
    def replay_timer(self):
        return self.race_view.replay_timer

    def _render_frame(self) -> None:
        self.race_view.render_frame()

    @property
    def job(self) -> Job | None:
        return self.controller.job

    @property
    def thread(self):
        return self.controller.thread

    @property
    def log_path(self) -> Path | None:
        return self.controller.log_path

    @property
    def models(self) -> dict | None:
        """The loaded target and parts by key ({"target": ..., and one per part key}), or None."""
        session = self.controller.session
        return None if session is None else {"target": session.target, **session.parts}

    def race_real_model(self) -> None:
        """The real model in one click: installed first where it is not (on the worker thread, with progress), then
        loaded with the parts trained for it."""
        from engine.models.catalog import CATALOG

        entry = CATALOG[REAL_MODEL]
        self.model_panel.target.setText(entry.name)
        for edit in self.model_panel.parts.values():
            edit.setText("")  # its own parts come with it
        self.load_models(install=None if entry.name in installed() else entry.key)

    def load_models(self, install: str | None = None) -> None:
        if self.job:
            self.show_error(f"busy ({self.job}): press Stop or wait before loading models")
            return
        mp = self.model_panel
        target = mp.target.text().strip()
        self.clear_error()
        mp.set_busy(True)
        mp.info.setText(f"loading {Path(target).name if target else 'the bundled demo models'} …")
        self._set_running(Job.LOAD)
        self.controller.load(
            target,
            mp.part_paths(),
            mp.device.currentText(),
            mp.dtype.currentText(),
            mp.allow_download.isChecked(),
            mp.compile.isChecked(),
            install,
        )

    # ---- racing -----------------------------------------------------------------------------------------------
    def available_methods(self) -> list[str]:
        """Chosen methods whose parts are loaded (vanilla needs a draft, medusa and eagle heads)."""
        session = self.controller.session
        return [m for m in self.gen_panel.chosen_methods() if session is not None and session.available(m)]

    def _ready_to_run(self) -> bool:
        """No job running and models loaded; otherwise say which, in the banner."""
        if self.job:
            self.show_error(f"a {self.job} is already running: press Stop first")
            return False
        if self.controller.session is None:
            self.show_error("no model is loaded: press Load first")
            return False
        return True

    def _sampling(self) -> SamplingConfig:
        g = self.gen_panel
        return SamplingConfig(g.temperature.value(), g.top_p.value(), g.seed.value())

    def _drafter_options(self) -> DrafterOptions:
        return DrafterOptions(**self.gen_panel.knobs.values())

    def race(self, methods: list[str] | None = None) -> None:
        if not self._ready_to_run():
            return
        methods = methods or self.available_methods()
        if not methods:
            self.show_error("no variant selected (vanilla needs a draft model, medusa and eagle need heads)")
            return
        g = self.gen_panel
        try:
            settings = RaceSettings(
                methods,
                g.max_new.value(),
                self._sampling(),
                self._drafter_options(),
                not g.sequential.isChecked(),
                chat=self.prompt_panel.chat_wanted(),
                draft_budget=g.budget.currentData(),
            )
            self.controller.race(self.prompt_panel.text.toPlainText(), settings)
        except GlanceError as exc:
            self.show_error(str(exc))
            return
        self.clear_error()
        self.opened_log = None  # the screen shows this race now: Export writes its log
        self.inspector.clear()
        target = self.controller.session.target
        compiled = any(r.compiled for r in self.controller.session.compiled)
        self.race_view.reset(
            methods,
            settings.describe()
            | {"dtype": str(target.dtype).removeprefix("torch."), "forward": "compiled" if compiled else "eager"}
            | {"plain_step": self.controller.session.plain_step_seconds()},
        )
        self._set_running(Job.RACE)

    def run_benchmark(self) -> None:
        """The Benchmark tab's suite or sweep on the loaded models, as a worker job."""
        if not self._ready_to_run():
            return
        from app.controls import load_presets

        try:
            sizes = self.bench.sweep_sizes()
            sampling = self.bench.sampling()
            options = self._drafter_options()
        except GlanceError as exc:
            self.show_error(str(exc))
            return
        suite = load_presets()
        n = self.bench.prompts.value()
        prompts = suite[:: max(1, len(suite) // n)][:n]
        session = self.controller.session
        methods = self.bench.methods(self.available_methods(), session)
        b = self.bench
        chat = self.prompt_panel.chat_wanted()
        self.controller.benchmark(
            prompts,
            methods,
            b.repeats.value(),
            sizes,
            b.max_new.value(),
            options,
            sampling,
            chat,
            draft_budget=b.draft_budget(),
            continuous=b.continuous(),
        )
        self.clear_error()
        self.bench.set_running(True)
        self.tabs.setCurrentWidget(self.bench)
        self._set_running(Job.BENCHMARK)

    def stop(self) -> None:
        self.controller.stop()
        self.race_view.stop_replay()
        self.statusBar().showMessage("stopping after the current step …")

    def _set_running(self, name: Job) -> None:
        self.race_button.setEnabled(False)
        self.run_one_button.setEnabled(False)
        self.stop_button.setEnabled(name.stoppable)
        self.charts.set_live(name.live_charts)
        self.statusBar().showMessage(f"{name} running …")

    def _finish_job(self) -> None:
        self.race_button.setEnabled(True)
        self.run_one_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.model_panel.set_busy(False)
        self.bench.set_running(False)
        self.charts.set_live(False)

    # ---- events from the worker ---------------------------------------------------------------------------------
    def _on_progress(self, done: int, total: int, what: str) -> None:
        if self.job is Job.OPEN:
            self.statusBar().showMessage(f"{what}: {100 * done // max(total, 1)}%")
            return
        (self.model_panel if self.job is Job.LOAD else self.bench).on_progress(done, total, what)

    def _on_done(self, name: Job, result) -> None:
        if name is Job.OPEN:  # the window is free again before the log's lanes are drawn
            self._finish_job()
            self._show_log(result)
            return
        handlers = {Job.LOAD: self._loaded, Job.RACE: self._raced, Job.BENCHMARK: self._benchmarked}
        handlers[Job.TIMING] = self._timed
        handlers[name](result)
        self._finish_job()

    def _loaded(self, session) -> None:
        self.model_panel.info.setText("\n".join(session.summary_lines()))
        self.model_panel.update_real_button()
        seconds = sum(r.seconds for r in session.compiled)
        if seconds:
            self.settings.setValue("compile_seconds", seconds)
            self.model_panel.set_compile_time(seconds)
        self.prompt_panel.set_chat_available(session.has_chat_template)
        self.statusBar().showMessage("models loaded")

    def _raced(self, how: str) -> None:
        self._render_frame()
        self.why.set_lanes(
            {n: lane.stats.verify_tokens / lane.stats.steps for n, lane in self.lanes.items() if lane.stats.steps}
        )
        self.statusBar().showMessage(f"race {how}; log: {self.log_path}")

    def _timed(self, costs: dict[int, float]) -> None:
        self.why.set_costs(costs, self.controller.session.device_name)
        self.statusBar().showMessage("timed the target's forwards: see the Why tab")

    def _benchmarked(self, results) -> None:
        self.bench.show_results(results)
        if "sweep" in results:
            self.why.set_sweep(results["sweep"])
        if results.get("stopped"):
            self.statusBar().showMessage(f"benchmark stopped during the {results['stopped']}: the runs it finished "
                                         "are shown")  # fmt: skip
            return
        self.statusBar().showMessage("benchmark finished")

    def _on_failed(self, name: Job, message: str) -> None:
        self._finish_job()
        if name is Job.OPEN:
            message = f"cannot open {self.opening[0]}: {message}"
        if name is Job.LOAD:  # the previous models stay loaded; say so instead of "loading …"
            kept = self.controller.session
            self.model_panel.info.setText(
                "load failed: no model loaded"
                if kept is None
                else "load failed; still loaded:\n" + "\n".join(kept.summary_lines())
            )
        self.show_error(message)

    # ---- inspecting ------------------------------------------------------------------------------------------
    def inspect(self, lane: str, step: int) -> None:
        ev = self.race_view.event_for(lane, step)
        if ev is None:
            return
        offset = self.log_offsets.get((lane, step))
        if not ev.target_top and offset is not None and self.opened_log is not None:
            # an opened log keeps its steps' top tokens on disk (most of a large log's memory): read this one back
            ev = dataclasses.replace(ev, target_top=read_target_top(self.opened_log, offset))
        tok = self.models["target"].tokenizer if self.models else None
        self.inspector.show_step(lane, ev, (lambda t: token_text(tok, t)) if tok else str)
        self.tabs.setCurrentWidget(self.inspector)

    # ---- session log, export, replay --------------------------------------------------------------------------
    def _ask_export(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export session to folder", str(Path.home()))
        if folder:
            self.export_to(Path(folder))

    def export_to(self, folder: Path) -> list[Path]:
        """Export what is on screen: the opened log when one was opened since the last race, else the last race's."""
        shown = self.opened_log or self.log_path
        if shown is None or not shown.exists():
            self.show_error("nothing to export yet: run a race first")
            return []
        try:
            run = self.opened_run if self.opened_log else -1
            written = export_session(shown, folder, self.charts, run)
        except GlanceError as exc:
            self.show_error(str(exc))
            return []
        self.statusBar().showMessage(f"exported {len(written)} files to {folder}")
        return written

    def show_guide(self, method: str) -> None:
        """The method's card (app/method_card.py), in a dialog that does not block the race."""
        from PySide6.QtWidgets import QMessageBox

        box = QMessageBox(self)
        box.setWindowTitle(f"Glance: {method}")
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setText(card_html(method))
        box.setModal(False)
        box.show()
        self.guide = box  # kept for tests and so the dialog is not collected

    def time_forwards(self) -> None:
        """The "Why" tab's button: time the target's forwards from 1 to 64 tokens on the worker thread."""
        if not self._ready_to_run():
            return
        self.controller.time_forwards(WHY_WIDTHS)
        self._set_running(Job.TIMING)

    def _ask_serving(self) -> None:
        from PySide6.QtWidgets import QInputDialog

        if self.controller.session is None:
            self.show_error("load a model first: the serving config names the loaded target and parts")
            return
        settings = self.controller.race_settings
        methods = settings.methods if settings else self.available_methods()
        method, ok = QInputDialog.getItem(self, "Export serving config", "lane:", methods, 0, False)
        if not ok:
            return
        start = str(Path.home() / f"serve-{method}.md")
        path, _ = QFileDialog.getSaveFileName(self, "Export serving config", start, "Markdown (*.md)")
        if path:
            self.export_serving(method, Path(path))

    def export_serving(self, method: str, path: Path) -> Path | None:
        """Write how vLLM, SGLang and transformers would run `method` with the last race's settings (the panel's
        before any race) and the loaded parts."""
        session, settings = self.controller.session, self.controller.race_settings
        options = settings.options if settings else self._drafter_options()
        try:
            text = render_serving(method, session.sources[0], session.serving(method, options))
            write_text_checked(path, text)
        except GlanceError as exc:
            self.show_error(str(exc))
            return None
        self.statusBar().showMessage(f"wrote the serving config of {method} to {path}")
        return path

    def _ask_open(self, recorded_speed: bool) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open session log", str(self.autosave_dir), "Logs (*.jsonl)")
        if path:
            self.open_log(Path(path), recorded_speed)

    def open_log(self, path: Path, recorded_speed: bool = False) -> None:
        """Read a saved log on the worker thread, then replay the chosen run into fresh lanes and charts, instantly
        or on the recorded clocks."""
        if self.job:
            self.show_error(f"a {self.job} is running: press Stop before opening a log")
            return
        self.opening = (Path(path), recorded_speed)
        self.controller.read_log(Path(path))
        self._set_running(Job.OPEN)

    def choose_run(self, path: Path, runs: list) -> int | None:
        """Which run of a file that holds several to show (None: none); the newest is offered first."""
        from PySide6.QtWidgets import QInputDialog

        labels = [run_label(i, log) for i, log in enumerate(runs)][::-1]
        choice, ok = QInputDialog.getItem(self, "Open session log", f"{path.name} holds {len(runs)} runs:", labels, 0)
        return len(runs) - 1 - labels.index(choice) if ok else None

    def _show_log(self, runs: list) -> None:
        path, recorded_speed = self.opening
        index = len(runs) - 1 if len(runs) == 1 else self.choose_run(path, runs)
        if index is None:
            return
        log = runs[index]
        self.clear_error()
        self.opened_log = Path(path)
        self.opened_run = index
        self.inspector.clear()
        names = list(dict.fromkeys([e.variant for e in log.steps] + [s.variant for s in log.summaries]))
        self.race_view.reset(names, log.header.get("settings", {}))
        items: list[tuple[float, str, object, object]] = [
            (e.clock, e.variant, e, text) for e, text in zip(log.steps, log.texts)
        ]
        items += [(s.wall_seconds, s.variant, s, None) for s in log.summaries]
        self.log_offsets = {(e.variant, e.step): at for e, at in zip(log.steps, log.offsets)}
        self.race_view.play(items, recorded_speed)
        notes = [n for n in (log.skipped_note(), "the file ends in a cut line" if log.truncated else "") if n]
        which = f" (run {index + 1} of {len(runs)})" if len(runs) > 1 else ""
        self.statusBar().showMessage(
            f"opened {path.name}{which}: {len(log.steps)} steps" + (f" ({'; '.join(notes)})" if notes else "")
        )
        if log.skipped:
            self.show_error(f"{path.name}: {log.skipped_note()}")

    # ---- shutdown ---------------------------------------------------------------------------------------------
    def save_settings(self) -> None:
        save_settings(self.model_panel, self.prompt_panel, self.gen_panel, self.settings)
        self.settings.sync()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        self.settings_timer.stop()
        self.save_settings()
        self.race_view.stop()
        self.controller.close()
        super().closeEvent(event)


def token_text(tokenizer, token: int) -> str:
    """A token's text, or its id where this tokenizer has no such token (a log from another model)."""
    try:
        return tokenizer.decode([token])
    except (OverflowError, ValueError, TypeError, IndexError):
        return f"<{token}>"


def run_label(index: int, log) -> str:
    """One line naming a run of a log: its number, variants and prompt."""
    settings = log.header.get("settings", {})
    prompt = " ".join(str(settings.get("prompt", "")).split())[:40]
    methods = ", ".join(settings.get("methods", [])) or "no methods"
    return f"run {index + 1}: {methods} · {len(log.steps)} steps · {prompt!r}"


def launch(splash: QWidget | None = None) -> int:
    """Open the window on Qt's event loop with asyncio running on it (qasync); close the start-up splash."""
    import qasync

    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Glance")
    app.setOrganizationName("Glance")
    app.setWindowIcon(app_icon())
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow()
    window.show()
    if splash is not None:
        splash.close()
    exit_after = os.environ.get("GLANCE_EXIT_AFTER_MS")  # smoke tests: open, load, then quit by themselves
    if exit_after:
        QTimer.singleShot(int(exit_after), window.close)
        QTimer.singleShot(int(exit_after), app.quit)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    return 0
