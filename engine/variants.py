"""Which drafter each method name means, built from loaded parts and per-method options."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.autoregressive import AutoregressiveDrafter
from engine.drafters.base import Drafter
from engine.drafters.eagle import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL, EagleDrafter
from engine.drafters.lookahead import DEFAULT_GUESSES, DEFAULT_NGRAM, DEFAULT_WINDOW, LookaheadDrafter
from engine.drafters.medusa import DEFAULT_TREE, MedusaDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.errors import GlanceError
from engine.models import LoadedModel, check_same_vocabulary, load_model

DEFAULT_GAMMA = 3
METHODS = ("ar", "vanilla", "medusa", "eagle", "lookahead")
NEEDS = {"vanilla": "draft", "medusa": "medusa", "eagle": "eagle"}  # the part each method needs besides the target


@dataclass
class DrafterOptions:
    # Vanilla's gamma, by measurement on this CPU (bundled pair, bf16, 12 suite prompts x 48 tokens, greedy, 2 repeats
    # interleaved; tau, speedup): 1: 1.66 1.32x, 2: 2.04 1.37x, 3: 2.27 1.35x, 4: 2.36 1.30x, 6: 2.56 1.16x,
    # adaptive from 3: 2.24 1.39x. 2 and 3 tie within noise; 3 keeps the longer accepted runs.
    gamma: int = DEFAULT_GAMMA
    # Vanilla: stop the chain when the draft's p(token) falls below this. Measured like gamma above: gamma 3 alone
    # 1.30x; with a stop: gamma 4 at 0.3 1.34x, at 0.5 1.34x; gamma 6 at 0.3 1.37x, at 0.5 1.30x; gamma 8 at 0.6
    # 1.33x: within this machine's noise of each other, so it stays off by default.
    draft_confidence: float = 0.0
    adaptive: bool = False
    medusa_tree: str = DEFAULT_TREE
    acceptance: str = "exact"  # medusa: exact | typical (greedy at temperature 0 either way)
    eagle_mode: str = "dynamic"  # dynamic (EAGLE-2) | static (EAGLE-1)
    eagle_top_k: int = DEFAULT_TOP_K
    eagle_depth: int = DEFAULT_DEPTH
    eagle_total_tokens: int = DEFAULT_TOTAL
    lookahead_window: int = DEFAULT_WINDOW
    lookahead_ngram: int = DEFAULT_NGRAM
    lookahead_guesses: int = DEFAULT_GUESSES
    lookahead_context: bool = True  # also pool the n-grams of the prompt and committed text


def build_drafter(
    method: str, target: LoadedModel, parts: dict | None = None, options: DrafterOptions | None = None
) -> Drafter:
    """A fresh drafter for `method`. `parts` maps "draft" to a LoadedModel and "medusa" to MedusaHeads."""
    parts = parts or {}
    opt = options or DrafterOptions()
    if method not in METHODS:
        raise GlanceError(f"unknown method '{method}': choose one of {', '.join(METHODS)}")
    need = NEEDS.get(method)
    if need and parts.get(need) is None:
        flag = {"draft": "--draft", "medusa": "--medusa", "eagle": "--eagle"}[need]
        raise GlanceError(f"method '{method}' needs {need} weights: pass {flag}")
    if method == "ar":
        return AutoregressiveDrafter()
    if method == "vanilla":
        if opt.gamma < 1:
            raise GlanceError(f"gamma must be at least 1 (got {opt.gamma})")
        if not 0.0 <= opt.draft_confidence < 1.0:
            raise GlanceError(f"the draft confidence threshold must be in [0, 1) (got {opt.draft_confidence})")
        return VanillaDrafter(
            parts["draft"].model,
            gamma=opt.gamma,
            adaptive=opt.adaptive,
            target_vocab=target.vocab_size,
            confidence=opt.draft_confidence,
        )
    if method == "medusa":
        return MedusaDrafter(parts["medusa"], tree=opt.medusa_tree, acceptance=opt.acceptance)
    if method == "lookahead":
        return LookaheadDrafter(
            window=opt.lookahead_window,
            ngram=opt.lookahead_ngram,
            guesses=opt.lookahead_guesses,
            context_ngrams=opt.lookahead_context,
        )
    if opt.eagle_mode not in ("dynamic", "static"):
        raise GlanceError(f"unknown EAGLE mode '{opt.eagle_mode}': use dynamic (EAGLE-2) or static (EAGLE-1)")
    return EagleDrafter(
        parts["eagle"],
        dynamic=opt.eagle_mode == "dynamic",
        top_k=opt.eagle_top_k,
        depth=opt.eagle_depth,
        total_tokens=opt.eagle_total_tokens,
    )


def load_parts(
    target: LoadedModel,
    methods,
    draft: str | None = None,
    medusa: str | None = None,
    eagle: str | None = None,
    allow_download: bool = False,
    trust_remote_code: bool = False,
) -> dict:
    """Load what the methods need besides the target: a draft model (same device, dtype and vocabulary), Medusa
    heads and an EAGLE head (shapes checked against the target)."""
    parts: dict = {}
    needs = {NEEDS[m] for m in methods if m in NEEDS}
    if "draft" in needs and draft:
        parts["draft"] = load_model(
            draft,
            device=target.device,
            dtype=target.dtype,
            allow_download=allow_download,
            trust_remote_code=trust_remote_code,
        )
        check_same_vocabulary(target, parts["draft"])
    if "medusa" in needs and medusa:
        from engine.heads.medusa import load_medusa_heads

        parts["medusa"] = load_medusa_heads(medusa, target.model)
    if "eagle" in needs and eagle:
        from engine.heads.eagle import load_eagle_head

        parts["eagle"] = load_eagle_head(eagle, target.model)
    return parts
