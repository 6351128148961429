"""Which drafter each method name means, built from loaded models and per-method options."""

from __future__ import annotations

from engine.drafters.autoregressive import AutoregressiveDrafter
from engine.drafters.base import Drafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from engine.models import LoadedModel

METHODS = ("ar", "vanilla")
NEEDS_DRAFT_MODEL = {"vanilla"}


def build_drafter(
    method: str, target: LoadedModel, draft: LoadedModel | None = None, gamma: int = 4, adaptive: bool = False
) -> Drafter:
    """A fresh drafter for `method`; raises GlanceError for unknown methods or missing parts."""
    if method == "ar":
        return AutoregressiveDrafter()
    if method == "vanilla":
        if draft is None:
            raise GlanceError("method 'vanilla' needs a draft model: pass --draft")
        if gamma < 1:
            raise GlanceError(f"gamma must be at least 1 (got {gamma})")
        return VanillaDrafter(draft.model, gamma=gamma, adaptive=adaptive, target_vocab=target.vocab_size)
    raise GlanceError(f"unknown method '{method}': choose one of {', '.join(METHODS)}")
