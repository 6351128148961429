"""Vanilla speculative decoding: a small draft model proposes a chain (Leviathan et al. 2023; Chen et al. 2023).

The draft keeps its own KV cache over the committed tokens; after verification it is cropped back to the longest
prefix that is still committed, and the next proposal feeds whatever the draft has not seen yet.

With `confidence` > 0 the chain also stops early once the draft's own probability (temperature 1) of its latest
token falls below it, as transformers' `assistant_confidence_threshold` does: a draft forward whose token would
likely be rejected is skipped. The stopping rule reads only the draft's side, so every verified token still goes
through the same exact rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cache import cache_length, check_window, crop
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.spec import BuildContext, DrafterSpec, PartSpec, knob
from engine.drafters.vanilla_batch import BatchedChains
from engine.forward import COMPILE_STEPS, compile_model, forward_for, greedy_ids
from engine.models import BUNDLED_DRAFT, LoadedModel, check_same_vocabulary, load_model
from engine.sampling import logits_to_probs, sample
from engine.tree import Draft

MAX_GAMMA = 16
# By measurement on this CPU (bundled pair, bf16, 12 suite prompts x 48 tokens, greedy, 2 repeats interleaved; tau,
# speedup): 1: 1.66 1.32x, 2: 2.04 1.37x, 3: 2.27 1.35x, 4: 2.36 1.30x, 6: 2.56 1.16x, adaptive from 3: 2.24 1.39x.
# 2 and 3 tie within noise; 3 keeps the longer accepted runs.
DEFAULT_GAMMA = 3
# The most tokens one catch-up feeds the draft model: of a run's prompt, or of a stretch of plain steps since it last
# drafted (the oldest are left out, later tokens keep their text positions). Fed every token, a probe from plain steps
# ran the draft model over the whole prompt or stretch: 10-20 ms of drafting off the suite where a plain step costs
# 4.8. As EAGLE's head context (engine/drafters/eagle.py), for the same reason.
DRAFT_CONTEXT = 64


class VanillaDrafter(Drafter):
    name = "vanilla"

    def __init__(
        self,
        draft_model: torch.nn.Module,
        gamma: int = DEFAULT_GAMMA,
        adaptive: bool = False,
        target_vocab: int | None = None,
        max_gamma: int = MAX_GAMMA,
        confidence: float = 0.0,
    ):
        if gamma < 1:
            raise ValueError("gamma must be >= 1")
        if not 0.0 <= confidence < 1.0:
            raise ValueError("the draft confidence threshold must be in [0, 1)")
        self.confidence = confidence
        self.model = draft_model
        self.initial_gamma = gamma
        self.gamma = gamma
        self.adaptive = adaptive
        self.max_gamma = max(max_gamma, gamma)
        self.target_vocab = target_vocab
        self.device = next(draft_model.parameters()).device
        self.cache = None
        self.seen: list[int] = []  # the text's tokens up to where the draft cache reaches (`skipped` of them left out)
        self.skipped = 0  # tokens of `seen` the cache holds no entry for (DRAFT_CONTEXT): later ones sit that far on
        self.context = DRAFT_CONTEXT
        self.matches: list[bool] = []  # the latest catch-up's hindsight (see `hindsight`)
        self.positions = 0  # the most positions a run may need (check_context), to size a static cache

    def reset(self) -> None:
        self.cache, self.seen, self.gamma, self.matches, self.skipped = None, [], self.initial_gamma, [], 0

    def begin(self, state: DecodeState) -> None:
        self.reset()
        self.forward = forward_for(self.model)  # eager, or compiled when compile_model compiled the draft
        self.cache = self.forward.new_cache(max(self.positions, len(state.tokens)) + self.max_gamma)

    def check_context(self, positions: int) -> None:
        check_window(self.model.config, positions + self.max_gamma, "the draft model")
        self.positions = positions

    def _step(
        self, new_tokens: list[int], greedy: bool, from_row: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed tokens the draft has not seen; return the logits [V] after the last one and, when `greedy`, the
        argmax after each fed token from `from_row` on, or after the last only (None): [rows]. The argmax comes free
        from a compiled graph (a pass over the logits otherwise, so not when sampling)."""
        ids = torch.tensor([new_tokens], device=self.device)
        last = len(new_tokens) - 1
        rows = [last] if from_row is None else list(range(from_row, last + 1))
        positions = None  # right after the cache's entries, unless some were left out: the text's positions
        if self.skipped:
            positions = torch.arange(len(self.seen), len(self.seen) + len(new_tokens), device=self.device)[None]
        out = self.forward(ids, self.cache, positions=positions, logits_at=rows)  # the LM head on those rows only
        self.seen.extend(new_tokens)
        return out.logits[0, -1], greedy_ids(out)[0] if greedy else None

    def rewind(self, tokens: list[int]) -> int:
        """`seen` cut back to the longest prefix of the committed `tokens` it shares (at least one token is left to
        feed); its length. The cache is the caller's to cut (`skipped` fewer entries). One row and a batch alike."""
        keep, limit = 0, min(len(self.seen), len(tokens) - 1)
        while keep < limit and self.seen[keep] == tokens[keep]:
            keep += 1
        self.seen = self.seen[:keep]
        return keep

    def leave_out(self, tokens: list[int], keep: int) -> int:
        """Where a catch-up of `tokens` from `keep` (the prefix the cache reaches) starts feeding: past its oldest
        tokens beyond `context`, which join `seen` without entries (`skipped`). One row and a batch alike."""
        gap = max(0, len(tokens) - keep - self.context)
        self.seen += tokens[keep : keep + gap]
        self.skipped += gap
        return keep + gap

    def greedy_token(self, logits: torch.Tensor, best: torch.Tensor) -> int:
        """The greedy draft token: the forward's argmax, unless a larger draft vocabulary must be cut to the
        target's first (what `_pad` does to the distribution)."""
        if self.target_vocab is not None and logits.shape[-1] > self.target_vocab:
            return int(logits[: self.target_vocab].float().argmax())
        return int(best)

    def _pad(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft distribution over the target's vocabulary (a smaller draft vocabulary gets zero mass beyond it)."""
        if self.target_vocab is None or probs.shape[-1] == self.target_vocab:
            return probs
        if probs.shape[-1] > self.target_vocab:
            probs = probs[..., : self.target_vocab]
            return probs / probs.sum(-1, keepdim=True)
        return torch.nn.functional.pad(probs, (0, self.target_vocab - probs.shape[-1]))

    @torch.no_grad()
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        n = min(self.gamma, max_tokens)
        if n < 1:
            return Draft()
        keep = self.rewind(state.tokens)
        if cache_length(self.cache) > keep - self.skipped:  # (never into a gap: only drafted tokens roll back)
            crop(self.cache, keep - self.skipped)
        greedy = state.sampling.greedy
        keep = self.leave_out(state.tokens, keep)
        fed = state.tokens[keep:]
        # Catching up on tokens the target committed in plain steps: the draft's guess after each one before a
        # generated token is what a greedy chain drafted there would have proposed (no draft ever guessed there).
        # Compared with what the target chose, it tells the budget the acceptance it missed, for one transfer.
        # the first fed row whose guess is checked: the one whose next token is the first generated one, or the
        # latest `hindsight_rows`' (the LM head runs on each checked row)
        first = max(0, state.prompt_len - 1 - keep, len(fed) - 1 - self.hindsight_rows)
        hindsight = greedy and len(fed) - first > 1
        logits, best = self._step(fed, greedy, first if hindsight else None)
        if hindsight and (self.target_vocab is None or logits.shape[-1] <= self.target_vocab):
            guesses = best.tolist()  # [len(fed) - first]: the last is this step's first draft token
            self.matches = [g == t for g, t in zip(guesses, fed[first + 1 :])]
        tokens, qs = [], []
        for i in range(n):
            if greedy:  # no distribution needed: greedy verification compares tokens
                x = self.greedy_token(logits, best[-1])
            else:
                q = self._pad(logits_to_probs(logits, state.sampling))  # [V]
                x = sample(q, state.generator)
                qs.append(q)
            tokens.append(x)
            if self.confidence and float(torch.softmax(logits.float(), -1)[x]) < self.confidence:
                break  # the draft doubts this token: verify what we have rather than draft on
            if i + 1 < n:
                logits, best = self._step([x], greedy)
        q_probs = None if greedy else torch.stack(qs)  # [n, V]
        return Draft.chain(tokens, q_probs)

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        if self.adaptive and len(draft):
            # transformers' heuristic schedule: +2 after a fully accepted draft, -1 otherwise
            if len(accepted) == len(draft):
                self.gamma = min(self.max_gamma, self.gamma + 2)
            else:
                self.gamma = max(1, self.gamma - 1)

    @classmethod
    def batch_drafting(cls, drafters: list[Drafter]) -> BatchedChains:
        """One draft-model forward per depth for every row of a batch (engine/drafters/vanilla_batch.py)."""
        return BatchedChains(drafters)

    def settings(self) -> dict:
        return {"gamma": self.initial_gamma, "adaptive": self.adaptive, "confidence": self.confidence}


@dataclass
class VanillaOptions:
    gamma: int = knob(DEFAULT_GAMMA, "draft tokens per step", lo=1, hi=MAX_GAMMA)
    # Measured like gamma above: gamma 3 alone 1.30x; with a stop: gamma 4 at 0.3 1.34x, at 0.5 1.34x; gamma 6 at 0.3
    # 1.37x, at 0.5 1.30x; gamma 8 at 0.6 1.33x: within this machine's noise of each other, so it stays off.
    draft_confidence: float = knob(
        0.0,
        "stop drafting when the draft's probability of its token falls below this (0 = never)",
        lo=0.0,
        hi=0.99,
        label="stop below p",
    )
    adaptive: bool = knob(False, "adapt gamma (+2 after a fully accepted draft, -1 otherwise)", label="adaptive gamma")


def load_draft(path: str, target: LoadedModel, access: dict) -> LoadedModel:
    """A draft model on the target's device and dtype, with the target's vocabulary."""
    draft = load_model(path, device=target.device, dtype=target.dtype, **access)
    check_same_vocabulary(target, draft)
    return draft


def build(ctx: BuildContext) -> VanillaDrafter:
    o = ctx.options
    return VanillaDrafter(
        ctx.part.model,
        gamma=o.gamma,
        adaptive=o.adaptive,
        target_vocab=ctx.target.vocab_size,
        confidence=o.draft_confidence,
    )


SPEC = DrafterSpec(
    name="vanilla",
    reference="hf_assisted",  # transformers' assisted generation, with this drafter's draft model
    label="vanilla speculative",
    color="#4fc3f7",
    summary="a separate small draft model proposes a chain (Leviathan et al. 2023, Chen et al. 2023)",
    build=build,
    options=VanillaOptions,
    part=PartSpec(
        "draft",
        "draft model for vanilla: hub id or local folder",
        load=load_draft,
        describe=lambda draft: draft.describe(),
        bundled=BUNDLED_DRAFT,
        brief=lambda draft: f"{Path(draft.name).name} · {draft.parameters / 1e6:.1f}M",
        compile=lambda draft, progress: compile_model(draft.model, "the draft model", progress),
        compile_steps=COMPILE_STEPS,
    ),
)
