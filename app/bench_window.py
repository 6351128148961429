"""What the window costs: the same race in the window and in the engine alone (as the CLI runs it), interleaved
round by round, then the window's CPU use while idle. A benchmark, not a test: run it with nothing else running.

    QT_QPA_PLATFORM=offscreen python -m app.bench_window --rounds 3
    xvfb-run -a env QT_QPA_PLATFORM=xcb python -m app.bench_window    # under a real X server
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication


def _wait(app: QApplication, done, timeout: float) -> None:
    """Run Qt's own event loop until `done()` holds, as a user's window does (`app.exec`): no polling, which would
    wake the GUI thread hundreds of times a second and charge the window for the benchmark's own loop."""
    from PySide6.QtCore import QEventLoop, QTimer

    end = time.time() + timeout
    loop = QEventLoop()
    check = QTimer()
    check.setInterval(250)  # four checks a second, far fewer wake-ups than the window's own frames

    def tick() -> None:
        if done() or time.time() > end:
            loop.quit()

    check.timeout.connect(tick)
    check.start()
    if not done():
        loop.exec()
    check.stop()
    if not done():
        raise TimeoutError("the window did not finish in time")


GUI_CPU = {"seconds": 0.0, "wall": 0.0}  # the GUI thread's own CPU time during window races, and their wall time


def window_race(app, win, methods: list[str]) -> dict[str, float]:
    c0, w0 = time.thread_time(), time.perf_counter()  # this (GUI) thread only: rendering, not the engine
    win.race(methods)
    _wait(app, lambda: win.job is None, 600)
    win._render_frame()
    GUI_CPU["seconds"] += time.thread_time() - c0
    GUI_CPU["wall"] += time.perf_counter() - w0
    return {m: win.lanes[m].stats.summary.tokens_per_second for m in methods}


def engine_race(win, methods: list[str]) -> dict[str, float]:
    """The same race through the engine only, on this thread, as `python main.py` commands run it."""
    from engine import RunSummary

    session = win.controller.session
    settings = win.controller.race_settings
    ids = session.encode(win.prompt_panel.text.toPlainText(), settings.chat)
    out = {}
    for lane, item in session.race(ids, settings):
        if isinstance(item, RunSummary):
            out[lane] = item.tokens_per_second
    return {m: out[m] for m in methods}


def idle_cpu(app: QApplication, seconds: float) -> float:
    """Percent of one core the process uses while the window sits idle with a finished race on screen (Qt's own
    event loop runs meanwhile, as it does for a user; nothing polls it)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    t0, c0 = time.time(), time.process_time()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    return 100 * (time.process_time() - c0) / (time.time() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="ar,vanilla,medusa,eagle,lookahead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    app = QApplication.instance() or QApplication(sys.argv)
    from app.main_window import MainWindow

    home = Path(tempfile.mkdtemp(prefix="glance-bench-window-"))
    settings = QSettings(str(home / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("max_new", args.max_new_tokens)
    win = MainWindow(settings=settings, autosave_dir=home / "autosave")
    win.show()
    _wait(app, lambda: win.job is None, 600)
    if win.controller.session is None:
        print(f"glance: error: models did not load: {win.banner.text()}", file=sys.stderr)
        return 2
    methods = [m for m in methods if win.controller.session.available(m)]
    window_race(app, win, methods)  # warm-up: first-call costs land here, not in a measured round
    GUI_CPU.update(seconds=0.0, wall=0.0)
    rows: dict[str, dict[str, list[float]]] = {m: {"window": [], "engine": []} for m in methods}
    for i in range(args.rounds):  # interleaved, the order alternating, so drift in the machine's speed hits both
        order = ("window", "engine") if i % 2 == 0 else ("engine", "window")
        for where in order:
            race = window_race(app, win, methods) if where == "window" else engine_race(win, methods)
            for m, v in race.items():
                rows[m][where].append(v)
    idle = idle_cpu(app, args.idle_seconds)
    result = {
        "methods": {
            m: {
                "window_tok_s": round(statistics.median(r["window"]), 2),
                "engine_tok_s": round(statistics.median(r["engine"]), 2),
                # The median of the rounds' own ratios: a round's two races ran seconds apart, on one machine state.
                "ratio": round(statistics.median(w / e for w, e in zip(r["window"], r["engine"])), 3),
                "window_rounds": [round(v, 1) for v in r["window"]],
                "engine_rounds": [round(v, 1) for v in r["engine"]],
            }
            for m, r in rows.items()
        },
        "idle_cpu_percent": round(idle, 3),
        "gui_thread_cpu_percent_racing": round(100 * GUI_CPU["seconds"] / GUI_CPU["wall"], 2),
        "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "platform": QApplication.platformName(),
    }
    print(f"{'method':10s} {'window tok/s':>13s} {'engine tok/s':>13s} {'window/engine':>14s}")
    for m, r in result["methods"].items():
        print(f"{m:10s} {r['window_tok_s']:13.1f} {r['engine_tok_s']:13.1f} {r['ratio']:14.2f}")
    print(f"GUI thread while racing: {result['gui_thread_cpu_percent_racing']:.1f}% of one core")
    print(f"idle window: {idle:.3f}% of one core over {args.idle_seconds:.0f} s ({result['platform']})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    win.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
