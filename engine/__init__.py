"""Glance engine: speculative decoding over Hugging Face causal LMs, with no Qt dependency (docs/ARCHITECTURE.md).

Public API:
    Session.load(target, paths, methods, device, dtype) -> Session (target + the parts its drafters need)
    Session.race(prompt_ids, RaceSettings(methods, ...)) -> (lane, StepEvent | RunSummary)...
    Session.decoder(method, settings).stream(prompt_ids) -> StepEvent..., RunSummary
    DRAFTERS / METHODS: the drafter registry; DrafterOptions(**knobs): every drafter's options, checked
    load_model(name, device, dtype) -> LoadedModel; build_drafter(method, target, parts, options) -> Drafter
    RunStats: every metric, fed by events; SessionLogWriter(path) / read_session_log(path)
"""

from engine.decoder import Decoder, GenerationResult
from engine.errors import GlanceError
from engine.events import RunSummary, StepEvent
from engine.models import LoadedModel, check_same_vocabulary, load_model
from engine.registry import BASELINE, DRAFTERS, METHODS
from engine.sampling import SamplingConfig
from engine.session import RaceSettings, Session
from engine.session_log import SessionLogWriter, read_session_log, read_session_logs
from engine.stats import RunStats
from engine.variants import DrafterOptions, build_drafter

__all__ = [
    "BASELINE",
    "DRAFTERS",
    "Decoder",
    "DrafterOptions",
    "GenerationResult",
    "GlanceError",
    "LoadedModel",
    "METHODS",
    "RaceSettings",
    "RunStats",
    "RunSummary",
    "SamplingConfig",
    "Session",
    "SessionLogWriter",
    "StepEvent",
    "build_drafter",
    "check_same_vocabulary",
    "load_model",
    "read_session_log",
    "read_session_logs",
]
