"""The one worker thread that runs the engine; it talks to widgets only through queued signals.

Jobs are plain callables run on the worker thread under torch.inference_mode. A job reports through `wake` (a
lane's events wait in the controller's inbox), its return value (`done`) or an exception (`failed`, as a message for
the window).
"""

from __future__ import annotations

import gc
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.jobs import Job
from engine import GlanceError


class EngineWorker(QObject):
    submitted = Signal(object, object)  # Job, callable(worker) -> result
    wake = Signal()  # events wait in the controller's inbox: collect them
    done = Signal(object, object)  # Job, result
    failed = Signal(object, str)  # Job, message
    progress = Signal(int, int, str)  # done, total, what (benchmarks)

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()
        self.busy = False
        self.submitted.connect(self._run)

    @Slot(object, object)
    def _run(self, name: Job, job: Callable[[EngineWorker], Any]) -> None:
        # No cyclic garbage collection while a job runs: a collection triggered by the job's allocations would run
        # here and could destroy a widget left in a reference cycle on this thread. That deadlocked once (py-spy: a
        # QObject destructor waiting for the interpreter lock inside gc, on this thread, while reading a large log).
        # The GUI thread collects and turns collection back on when the job's end reaches it (`resume_gc`).
        gc.disable()
        try:
            with torch.inference_mode():
                result = job(self)
        except GlanceError as exc:
            self.failed.emit(name, str(exc))
        except Exception as exc:  # an engine bug must reach the user, not kill the thread silently
            traceback.print_exc()
            self.failed.emit(name, f"{type(exc).__name__}: {exc}")
        else:
            self.done.emit(name, result)


def resume_gc() -> None:
    """On the GUI thread, once a job has ended: collect what the job left in reference cycles, here, where widgets
    may be destroyed, then let automatic collection run again."""
    gc.collect()
    gc.enable()


class WorkerThread:
    """Owns the QThread and the worker living on it."""

    def __init__(self) -> None:
        self.thread = QThread()
        self.thread.setObjectName("glance-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def submit(self, name: Job, job: Callable[[EngineWorker], Any]) -> None:
        self.worker.cancel.clear()
        self.worker.submitted.emit(name, job)

    def stop(self) -> None:
        """Cancel the running job and end the thread, waiting as long as the job takes to notice: a QThread
        destroyed while it runs aborts the process (jobs check the cancel flag between steps, loads between parts)."""
        self.worker.cancel.set()
        self.thread.quit()
        self.thread.wait()
