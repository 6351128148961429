"""Take the README's screenshots from the real app: a race on the bundled models at 1600x1000 and 1280x800, the step
inspector (an EAGLE-3 step with its draft-vocabulary ids, a lookahead step), the Benchmark tab showing the batch
sweep of docs/results/sweep/results.json and the Why tab, written into docs/; with --real, the same race and Why tab
on SmolLM2.

QT_QPA_PLATFORM=offscreen python -m app.screenshot
QT_QPA_PLATFORM=offscreen python -m app.screenshot --real   # race_smollm2.png: SmolLM2 with a chat prompt
"""

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.main_window import MainWindow  # noqa: E402

PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):'


REAL_PROMPT = "Explain in two sentences why the sky is blue."


def real() -> None:
    """A race on SmolLM2-135M-Instruct (python main.py models install smollm2) with a chat prompt."""
    app = QApplication([])
    tmp = Path(tempfile.mkdtemp())
    settings = QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat)
    settings.setValue("target", "SmolLM2-135M-Instruct")
    settings.setValue("max_new", 64)
    settings.setValue("dtype", "bfloat16")
    settings.setValue("prompt", REAL_PROMPT)
    settings.setValue("methods", "ar,vanilla,medusa,eagle,eagle3,dflash,mtp,lookahead")
    win = MainWindow(settings=settings, autosave_dir=tmp)
    win.resize(1600, 1000)
    win.show()
    end = time.time() + 300
    while win.job is not None and time.time() < end:
        app.processEvents()
        time.sleep(0.01)
    win.race()
    while win.job is not None and time.time() < end + 300:
        app.processEvents()
        time.sleep(0.01)
    win._render_frame()
    app.processEvents()
    win.grab().save(str(DOCS / "race_smollm2.png"))
    win.resize(1280, 800)
    settle(app)
    win.grab().save(str(DOCS / "race_smollm2_1280.png"))
    win.resize(1600, 1000)
    why(app, win, "why_smollm2.png")
    win.close()


def settle(app, seconds: float = 1.0) -> None:
    """Let the layout settle at a new size."""
    end = time.time() + seconds
    while time.time() < end:
        app.processEvents()
        time.sleep(0.01)


def why(app, win, name: str) -> None:
    """The Why tab after timing the target's forwards, with the race's lanes marked on the curve."""
    win.time_forwards()
    end = time.time() + 300
    while win.job is not None and time.time() < end:
        app.processEvents()
        time.sleep(0.01)
    win.tabs.setCurrentWidget(win.why)
    settle(app)
    win.grab().save(str(DOCS / name))


def main() -> None:
    if "--real" in sys.argv:
        return real()
    app = QApplication([])
    tmp = Path(tempfile.mkdtemp())
    settings = QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat)
    settings.setValue("max_new", 96)
    settings.setValue("dtype", "bfloat16")
    settings.setValue("prompt", PROMPT)
    win = MainWindow(settings=settings, autosave_dir=tmp)
    win.resize(1600, 1000)
    win.show()

    def wait(cond, seconds=300):
        end = time.time() + seconds
        while not cond() and time.time() < end:
            app.processEvents()
            time.sleep(0.01)

    wait(lambda: win.job is None)
    win.gen_panel.show_rejected.setChecked(True)
    win.race()
    wait(lambda: win.job is None)
    win._render_frame()
    app.processEvents()
    out = DOCS
    win.grab().save(str(out / "race.png"))
    win.resize(1280, 800)
    wait(lambda: False, 1.0)  # let the layout settle at the smaller size
    win._render_frame()
    win.grab().save(str(out / "race_1280.png"))
    win.resize(1600, 1000)
    wait(lambda: False, 1.0)
    # the lane that drafted the widest trees: the inspector shows a tree, its accepted path and the rejected nodes
    lane = max(win.lanes.values(), key=lambda lane: max((len(e.draft_tokens) for e in lane.events), default=0))
    step = next((e.step for e in lane.events if len(e.accepted_nodes) >= 2), 3)
    win.inspect(lane.name, step)
    app.processEvents()
    win.grab().save(str(out / "inspector.png"))
    # a lane with a Jacobi window (lookahead): the inspector shows the window and the n-grams a step verified
    look = next((lane for lane in win.lanes.values() if any(e.notes.window for e in lane.events)), None)
    if look is not None:
        step = next((e.step for e in look.events if e.notes.ngrams and e.accepted_nodes), 1)
        win.inspect(look.name, step)
        app.processEvents()
        win.grab().save(str(out / "inspector_lookahead.png"))
    sweep = DOCS / "results" / "sweep" / "results.json"
    if sweep.exists():
        import json

        results = json.loads(sweep.read_text())
        results["sweep"]["rows"] = {int(k): v for k, v in results["sweep"]["rows"].items()}
        win.bench.show_results(results)
        win.tabs.setCurrentWidget(win.bench)
        app.processEvents()
        win.grab().save(str(out / "benchmark.png"))
        win.why.set_sweep(results["sweep"])
    why(app, win, "why.png")
    win.close()


if __name__ == "__main__":
    main()
