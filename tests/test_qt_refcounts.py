"""PySide6 must not leak away references to None or True: PySide6 6.12.0 on Python 3.11 drops one reference to None
per Qt call that returns nothing and one to True per signal emit, and a long session then aborts in `none_dealloc`.
The probe runs in a child process so that an affected install fails this test instead of aborting the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gui

CALLS = 100  # an affected build falls by about this much per call kind; True starts near 600 on 3.11

PROBE = f"""
import gc, json, sys
from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication, QLabel

class Emitter(QObject):
    fired = Signal(str, object)

app = QApplication([])
emitter, label, timer, seen = Emitter(), QLabel(), QTimer(), []
emitter.fired.connect(lambda name, item: seen.append(item))
gc.collect()
none0, true0 = sys.getrefcount(None), sys.getrefcount(True)
for i in range({CALLS}):
    label.setText(str(i))       # returns nothing: None's count
    timer.setInterval(5 + i % 3)
    emitter.fired.emit("lane", i)  # True's count
    app.processEvents()
gc.collect()
print(json.dumps(dict(none=sys.getrefcount(None) - none0, true=sys.getrefcount(True) - true0, seen=len(seen))))
"""


def test_qt_calls_and_emits_keep_references_to_none_and_true():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"the probe died before reporting (exit {proc.returncode}): {proc.stderr[-2000:]}"
    deltas = json.loads(lines[-1])
    assert deltas["seen"] == CALLS
    # Immortal objects (Python 3.12+) report a constant; on 3.11 a healthy build moves by a handful at most.
    assert deltas["none"] > -CALLS // 10, f"Qt calls lost {-deltas['none']} references to None ({CALLS} calls)"
    assert deltas["true"] > -CALLS // 10, f"signal emits lost {-deltas['true']} references to True ({CALLS} emits)"
    assert proc.returncode == 0, f"the probe aborted at exit: {proc.stderr[-2000:]}"
