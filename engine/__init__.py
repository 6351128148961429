"""Glance engine: speculative decoding over Hugging Face causal LMs, with no Qt dependency.

Public API:
    load_model(name, device, dtype)           -> LoadedModel (model, tokenizer)
    build_drafter(method, target, draft, ...) -> Drafter
    Decoder(target, drafter, sampling, max_new_tokens).stream(prompt_ids) -> StepEvent..., RunSummary
    Decoder(...).generate(prompt_ids)         -> GenerationResult(tokens, summary, events)
    SessionLogWriter(path) / read_session_log(path)
"""

from engine.decoder import Decoder, GenerationResult
from engine.errors import GlanceError
from engine.events import RunSummary, StepEvent
from engine.models import LoadedModel, check_same_vocabulary, load_model
from engine.sampling import SamplingConfig
from engine.session_log import SessionLogWriter, read_session_log
from engine.variants import METHODS, build_drafter

__all__ = [
    "Decoder",
    "GenerationResult",
    "GlanceError",
    "LoadedModel",
    "METHODS",
    "RunSummary",
    "SamplingConfig",
    "SessionLogWriter",
    "StepEvent",
    "build_drafter",
    "check_same_vocabulary",
    "load_model",
    "read_session_log",
]
