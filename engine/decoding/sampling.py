"""Logits to probabilities under the run's sampling settings, applied alike to target and drafts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import GlanceError

MIN_TEMPERATURE = 1e-3  # below it, logits / T overflow to inf in float32 (found by tests/test_fuzz_cli.py)
MAX_TEMPERATURE = 1e3


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_p 1.0 disables nucleus filtering."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise GlanceError(
                f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE:g} "
                f"(got {self.temperature}): logits divided by less overflow"
            )
        if not 0 < self.top_p <= 1:
            raise GlanceError(f"top-p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.seed < 2**63:  # what torch.Generator.manual_seed takes
            raise GlanceError(f"the seed must be an integer from 0 to 2**63 - 1 (got {self.seed})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature and top-p (one-hot argmax when greedy)."""
    logits = logits.float()
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop = sorted_p.cumsum(-1) - sorted_p >= cfg.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a [V] distribution."""
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator).item())
