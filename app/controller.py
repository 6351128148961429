"""The window's controller: runs engine jobs (load, race, benchmark) on the worker thread through the engine's
`Session` facade, writes the autosaved session log, and hands the views ready-to-draw events. No widgets here."""

from __future__ import annotations

import os
import time
import uuid
from collections import deque
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QObject, QTimer, Signal

from app.jobs import Job
from app.worker import EngineWorker, WorkerThread, resume_gc
from engine import (
    DrafterOptions,
    GlanceError,
    RaceSettings,
    SamplingConfig,
    Session,
    SessionLogWriter,
    StepEvent,
    StepText,
    read_session_logs,
)
from engine.records.step_text import PieceDecoder

INBOX_MS = 100  # the GUI thread collects a race's events at most ten times a second


class Controller(QObject):
    """One job at a time on the engine thread; `event` carries each lane's events with their text pieces attached.

    A race's events do not cross threads one signal each: the worker appends them to `inbox` and wakes the GUI thread
    once, which collects everything queued `INBOX_MS` later and then emits `batch`. A wake-up per event preempted the
    engine's OpenMP threads on every token (measured by app/bench_window.py)."""

    event = Signal(str, object, object)  # lane, StepEvent | RunSummary, its StepText (or None)
    batch = Signal()  # a collected batch of events was emitted: time to draw
    done = Signal(object, object)  # Job, result (a Session for Job.LOAD)
    failed = Signal(object, str)  # Job, message
    progress = Signal(int, int, str)  # done, total, what: of a load or a benchmark
    warning = Signal(str)  # something went wrong that does not stop the job (the log could not be written)

    def __init__(self, autosave_dir: Path) -> None:
        super().__init__()
        self.autosave_dir = Path(autosave_dir)
        self.session: Session | None = None
        self.job: Job | None = None
        self.log: SessionLogWriter | None = None
        self.log_path: Path | None = None
        self.race_settings: RaceSettings | None = None
        self.decoders: dict[str, PieceDecoder] = {}
        # (lane, item, text): appended on the worker thread, drained on the GUI thread
        self.inbox: deque[tuple[str, object, object]] = deque()
        self._woken = False  # a wake-up is on its way: the worker does not send another
        self.collect = QTimer(self)
        self.collect.setSingleShot(True)
        self.collect.setInterval(INBOX_MS)
        self.collect.timeout.connect(self.drain)
        self.thread = WorkerThread()
        w = self.thread.worker
        w.wake.connect(self._on_wake)
        w.done.connect(self._on_done)
        w.failed.connect(self._on_failed)
        w.progress.connect(self.progress)

    # ---- jobs ---------------------------------------------------------------------------------------------------
    def _start(self, name: Job, job) -> None:
        self.job = name
        self.thread.submit(name, job)

    def load(
        self,
        target: str,
        paths: dict[str, str],
        device: str,
        dtype: str,
        allow_download: bool,
        compile: bool = False,
        install: str | None = None,
    ) -> None:
        """Load on the worker thread; `install`: a catalog key to install first (`models install`), with progress."""

        def job(worker: EngineWorker) -> Session:
            if install:
                from engine.models.convert import install as install_model

                install_model(install, log=lambda line: worker.progress.emit(0, 0, line))
            return Session.load(
                target or None,
                paths,
                device=device,
                dtype=dtype,
                allow_download=allow_download,
                cancel=worker.cancel.is_set,
                progress=worker.progress.emit,
                compile=compile,
                time_forwards=True,
            )

        self._start(Job.LOAD, job)

    def race(self, prompt: str, settings: RaceSettings) -> None:
        """Start a race on the loaded session; bad settings raise GlanceError here, before anything runs."""
        session = self.session
        if session is None:
            raise GlanceError("no model is loaded: press Load first")
        if not prompt.strip():
            raise GlanceError("the prompt is empty: give some text")
        for m in settings.methods:  # a bad option or a missing part fails now, with its message
            session.decoder(m, settings)
        self.race_settings = settings
        self.decoders = {m: PieceDecoder(session.tokenizer) for m in settings.methods}

        def job(worker: EngineWorker) -> str:
            # the chat template runs here, off the window's thread and within its time limit (engine/models/chat.py)
            prompt_ids = session.encode(prompt, settings.chat)
            for m in settings.methods:  # a run too long for the context fails before anything runs or is logged
                session.decoder(m, settings).check_fits(len(prompt_ids))
            self._open_log(session, settings, prompt, prompt_ids)
            for name, item in session.race(prompt_ids, settings, worker.cancel):
                text = self._record(name, item)  # here, between steps and outside every lane's clock, as the CLI does
                self._post(worker, name, item, text)
            return "cancelled" if worker.cancel.is_set() else "finished"

        self._start(Job.RACE, job)

    def benchmark(
        self,
        prompts: list[dict],
        methods: list[str],
        repeats: int,
        batch_sizes: list[int] | None,
        max_new_tokens: int,
        options: DrafterOptions,
        sampling: SamplingConfig,
        chat: bool = False,
        draft_budget: str | None = None,
        continuous: bool = False,
    ) -> None:
        """The benchmark suite (or, with batch sizes, the sweep) on the loaded session, as a job. draft_budget: "auto",
        "full" or None (the benchmark's default); continuous: the sweep's finished rows take waiting prompts."""
        from engine.bench.run import run_benchmark
        from engine.bench.suite import BenchSetup

        session = self.session
        if session is None:
            raise GlanceError("no model is loaded: press Load first")
        setup = BenchSetup(
            session.target, session.parts, options, sampling, max_new_tokens, chat=chat, draft_budget=draft_budget
        )

        def job(worker: EngineWorker) -> dict:
            return run_benchmark(
                setup, prompts, methods, repeats, batch_sizes, worker.progress.emit, worker.cancel.is_set, continuous
            )

        self._start(Job.BENCHMARK, job)

    def time_forwards(self, widths) -> None:
        """Time the loaded target's forwards over `widths` tokens on the worker thread (the "Why" tab)."""
        session = self.session
        if session is None:
            raise GlanceError("no model is loaded: press Load first")
        self._start(Job.TIMING, lambda worker: session.forward_costs(widths, worker.cancel.is_set))

    def read_log(self, path: Path) -> None:
        """Read a session log on the worker thread, with progress in KB (a 120 MB log of 130k steps: about 15 s)."""

        def job(worker: EngineWorker) -> list:
            def progress(done: int, total: int) -> None:
                worker.progress.emit(done // 1024, max(1, total // 1024), f"reading {Path(path).name}")

            return read_session_logs(path, progress, worker.cancel.is_set, keep_top=False)  # top tokens: on demand

        self._start(Job.OPEN, job)

    def stop(self) -> None:
        self.thread.worker.cancel.set()

    def close(self) -> None:
        """Cancel and wait for the job, deliver the events it queued before it ended (the log keeps every step and
        summary already produced), then close the log."""
        self.thread.stop()
        QCoreApplication.sendPostedEvents(self)
        self.drain()
        self._close_log()

    # ---- session log --------------------------------------------------------------------------------------------
    def _open_log(self, session: Session, settings: RaceSettings, prompt: str, prompt_ids: list[int]) -> None:
        """Autosave under a name no other race shares (time, process, and a random suffix)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = self.autosave_dir / f"session-{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}.jsonl"
        try:
            self.log = session.open_log(self.log_path, settings, prompt, prompt_ids)
        except GlanceError as exc:
            self.log = None
            self.warning.emit(f"{exc}; racing without an autosaved log")

    def _close_log(self) -> None:
        if self.log is not None:
            try:
                self.log.close()
            except OSError:
                pass
            self.log = None

    # ---- from the worker ------------------------------------------------------------------------------------------
    def _record(self, lane: str, item) -> StepText | None:
        """Decode the event's text pieces (kept beside the event, never in it) and append both to the log. Runs on the
        worker thread: on the GUI thread this Python work held the interpreter lock against the engine and slowed
        every lane (measured by app/bench_window.py)."""
        text = None
        if isinstance(item, StepEvent) and lane in self.decoders:
            text = self.decoders[lane].step_text(item)
        log = self.log
        if log is not None:
            try:
                log.event(item, text)
            except GlanceError as exc:  # a full disk: keep racing on screen, say the log stopped
                self.log = None
                try:
                    log.close()
                except OSError:
                    pass
                self.warning.emit(f"{exc}; the race continues without a log")
        return text

    def _post(self, worker: EngineWorker, lane: str, item, text: StepText | None) -> None:
        """Queue an event for the GUI thread (worker side); only the first event since the last collection wakes it."""
        self.inbox.append((lane, item, text))
        if not self._woken:
            self._woken = True
            worker.wake.emit()

    def _on_wake(self) -> None:
        if not self.collect.isActive():
            self.collect.start()

    def drain(self) -> None:
        """Emit every queued event in order, then `batch` once. The flag drops first: an event appended while this
        runs is either emitted here or wakes the GUI thread again."""
        self.collect.stop()
        self._woken = False
        if not self.inbox:
            return
        while self.inbox:
            self.event.emit(*self.inbox.popleft())
        self.batch.emit()

    def _on_done(self, name: Job, result) -> None:
        resume_gc()
        self.drain()  # the job's last events were queued before it returned
        self.job = None
        if name is Job.LOAD:
            self.session = result
        if name is Job.RACE:
            self._close_log()
        self.done.emit(name, result)

    def _on_failed(self, name: Job, message: str) -> None:
        resume_gc()
        self.drain()
        self.job = None
        self._close_log()
        self.failed.emit(name, message)
