"""Glance engine: speculative decoding over Hugging Face causal LMs, with no Qt dependency (docs/ARCHITECTURE.md).

Public API (what the app and scripts import; everything else is the engine's own):
    Session.load(target, paths, methods, device, dtype) -> Session (target + the parts its drafters need)
    Session.race(prompt_ids, RaceSettings(methods, ...)) -> (lane, StepEvent | RunSummary)...
    Session.decoder(method, settings).run(prompt_ids) -> StepEvent..., RunSummary; .stream(prompts, rows): a batch
    DRAFTERS / METHODS: the drafter registry; DrafterOptions(**knobs): every drafter's options, checked
    load_model(name, device, dtype) -> LoadedModel; build_drafter(method, target, parts, options) -> Drafter
    RunStats: every metric, fed by events; SessionLogWriter(path) / read_session_log(path); the export tables
    Session.serving(method, options) -> Serving; render_serving(method, target, serving): vLLM / SGLang /
        transformers settings for a drafter (engine/drafters/serving.py)
    engine.bench: the benchmark suite and sweep (run_benchmark, BenchSetup, reports)
"""

from engine.decoding.loop import BatchResult, Decoder, GenerationResult
from engine.decoding.sampling import SamplingConfig
from engine.decoding.tree import is_chain, node_depths
from engine.drafters.build import DrafterOptions, build_drafter
from engine.drafters.serving import Serving
from engine.drafters.serving import render as render_serving
from engine.drafters.spec import DrafterSpec, KnobField
from engine.errors import GlanceError
from engine.models.catalog import installed
from engine.models.loading import LoadedModel, check_same_vocabulary, load_model
from engine.records.events import BudgetNote, DraftNotes, RunSummary, StepEvent
from engine.records.files import write_text_checked
from engine.records.session_log import (
    SessionLogWriter,
    StepText,
    copy_run,
    read_session_log,
    read_session_logs,
    read_target_top,
)
from engine.records.stats import Decomposition, RunStats, Speedup, compare, decompose
from engine.records.tables import markdown_report, write_runs_csv, write_steps_csv
from engine.registry import BASELINE, DRAFTERS, METHODS, parts
from engine.session import RaceSettings, Session

__all__ = [
    "BASELINE",
    "DRAFTERS",
    "Decomposition",
    "BatchResult",
    "BudgetNote",
    "Decoder",
    "DraftNotes",
    "DrafterOptions",
    "DrafterSpec",
    "GenerationResult",
    "GlanceError",
    "KnobField",
    "LoadedModel",
    "METHODS",
    "RaceSettings",
    "RunStats",
    "RunSummary",
    "SamplingConfig",
    "Session",
    "SessionLogWriter",
    "StepEvent",
    "StepText",
    "Serving",
    "Speedup",
    "build_drafter",
    "check_same_vocabulary",
    "compare",
    "copy_run",
    "decompose",
    "installed",
    "is_chain",
    "load_model",
    "markdown_report",
    "node_depths",
    "parts",
    "read_session_log",
    "read_session_logs",
    "read_target_top",
    "render_serving",
    "write_runs_csv",
    "write_steps_csv",
    "write_text_checked",
]
