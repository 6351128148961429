"""Vanilla speculative decoding: a small draft model proposes a chain (Leviathan et al. 2023; Chen et al. 2023).

The draft keeps its own KV cache over the committed tokens; after verification it is cropped back to the longest
prefix that is still committed, and the next proposal feeds whatever the draft has not seen yet.

With `confidence` > 0 the chain also stops early once the draft's own probability (temperature 1) of its latest
token falls below it, as transformers' `assistant_confidence_threshold` does: a draft forward whose token would
likely be rejected is skipped. The stopping rule reads only the draft's side, so every verified token still goes
through the same exact rule.

A draft folder with a draft vocabulary (draft_vocab.safetensors) gets an LM head over those target ids only, as
FR-Spec (Zhao et al. 2025) cuts a draft's read-out: on a small draft the full LM head is most of its forward. Its q
is zero outside them; Leviathan's rule is exact for any q, so output does not change, only what gets accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.decoding.sampling import logits_to_probs, sample
from engine.decoding.tree import Draft, additive_mask
from engine.drafters.base import HINDSIGHT_ROWS, DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BuildContext, DrafterSpec, PartSpec, knob
from engine.heads.draft_vocab import DRAFT_VOCAB, narrow_lm_head, read_draft_vocab
from engine.models.loading import BUNDLED_DRAFT, LoadedModel, check_same_vocabulary, load_model
from engine.runtime.cache import cache_length, check_editable, check_window, new_cache, pack_columns
from engine.runtime.forward import COMPILE_STEPS, compile_model, forward_for, greedy_ids

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
    """A draft model's chains for every row of a run, one draft-model forward per depth for all rows.

    Rows feed different numbers of tokens (each catches up on what it has not seen: one token, or several after a
    long acceptance), so the draft cache holds every row's entries at columns tracked per row; a forward's mask lets
    a row see its own columns only, and before each draft the cache is packed so that row b's seen tokens sit at
    columns 0..seen_b - 1. One row needs no mask: its columns are the cache."""

    name = "vanilla"

    def __init__(
        self,
        draft_model: torch.nn.Module,
        gamma: int = DEFAULT_GAMMA,
        adaptive: bool = False,
        target_vocab: int | None = None,
        max_gamma: int = MAX_GAMMA,
        confidence: float = 0.0,
        draft_ids: torch.Tensor | None = None,
    ):
        if gamma < 1:
            raise ValueError("gamma must be >= 1")
        check_editable(new_cache(draft_model.config))  # a draft with recurrent state: refused now, in one line
        if not 0.0 <= confidence < 1.0:
            raise ValueError("the draft confidence threshold must be in [0, 1)")
        self.confidence = confidence
        self.model = draft_model
        self.initial_gamma = gamma
        self.adaptive = adaptive
        self.max_gamma = max(max_gamma, gamma)
        self.target_vocab = target_vocab
        self.device = next(draft_model.parameters()).device
        self.dtype = next(draft_model.parameters()).dtype
        self.draft_ids = None if draft_ids is None else draft_ids.to(self.device)  # logits' column -> target id
        self.context = DRAFT_CONTEXT
        self.positions = 0  # the most positions a run may need (check_context), to size the cache
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.cache = None  # made by the first draft, once the run's positions are known
        self.gamma = [self.initial_gamma] * rows
        self.seen: list[list[int]] = [[] for _ in range(rows)]  # per row: the text up to where the cache reaches
        self.skipped = [0] * rows  # per row: tokens of `seen` with no cache entry (DRAFT_CONTEXT): later ones sit on
        self.cols: list[list[int]] = [[] for _ in range(rows)]  # per row: the cache columns of its seen tokens

    def begin(self, row: int, state: DecodeState) -> None:
        self.gamma[row], self.seen[row], self.skipped[row], self.cols[row] = self.initial_gamma, [], 0, []

    def check_context(self, positions: int) -> None:
        check_window(self.model.config, positions + self.max_gamma, "the draft model")
        self.positions = positions

    def _rewind(self, b: int, tokens: list[int]) -> int:
        """Row b's `seen` and columns cut back to the longest prefix of its committed `tokens` they share (at least
        one token is left to feed); the length kept."""
        seen = self.seen[b]
        keep, limit = 0, min(len(seen), len(tokens) - 1)
        while keep < limit and seen[keep] == tokens[keep]:
            keep += 1
        del seen[keep:]
        self.cols[b] = self.cols[b][: keep - self.skipped[b]]
        return keep

    def _leave_out(self, b: int, tokens: list[int], keep: int) -> int:
        """Where row b's catch-up of `tokens` from `keep` starts feeding: past its oldest tokens beyond `context`,
        which join `seen` without entries (`skipped`)."""
        gap = max(0, len(tokens) - keep - self.context)
        self.seen[b] += tokens[keep : keep + gap]
        self.skipped[b] += gap
        return keep + gap

    def _forward(self, feeds: list[list[int]], read: list[int], greedy: bool):
        """Feed row b the tokens `feeds[b]` after its seen ones. Returns the logits [B, V] after each row's last fed
        token (meaningless for a row fed nothing) and, when `greedy`, each row's argmax after its fed tokens from
        `read[b]` on, as lists."""
        B, S = len(feeds), max(1, max(map(len, feeds)))
        width = cache_length(self.cache)
        lasts = [max(len(f), 1) - 1 for f in feeds]
        at = sorted({c for b in range(B) for c in range(min(read[b], lasts[b]), lasts[b] + 1)})  # LM-head rows
        if B == 1 and len(self.cols[0]) == width:  # one row whose columns are the cache: causal, no mask
            return self._one_row(feeds[0], width, at, greedy)
        ids = torch.zeros(B, S, dtype=torch.long)
        visible = torch.zeros(B, S, width + S, dtype=torch.bool)
        positions = torch.zeros(B, S, dtype=torch.long)
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        for b, feed in enumerate(feeds):
            n = len(feed)
            if n:
                ids[b, :n] = torch.tensor(feed)
                visible[b, :n, width : width + n] = causal[:n, :n]
            visible[b, :n, self.cols[b]] = True
            visible[b, n:, width + n :] = torch.eye(S - n, dtype=torch.bool)  # padding sees itself only
            first = len(self.seen[b])  # the text position of the first token fed
            positions[b, :n] = torch.arange(first, first + n)
            positions[b, n:] = first
            self.cols[b] += range(width, width + n)
            self.seen[b].extend(feed)
        mask = additive_mask(visible, self.dtype, self.device)  # [B, 1, S, width + S]
        out = self.forward(ids.to(self.device), self.cache, mask, positions.to(self.device), logits_at=at)
        rows = torch.arange(B, device=out.logits.device)
        last = torch.tensor([at.index(n) for n in lasts], device=out.logits.device)
        if not greedy:
            return out.logits[rows, last], None
        best = self._target_ids(greedy_ids(out)).tolist()  # [B][len(at)]: every read row's argmax, one transfer
        reads = [[row[at.index(c)] for c in range(read[b], lasts[b] + 1)] for b, row in enumerate(best)]
        return out.logits[rows, last], reads  # [B, V]

    def _one_row(self, feed: list[int], width: int, at: list[int], greedy: bool):
        """`_forward` for one row: its feed after its whole cache, the LM head on rows `at` (its read rows)."""
        positions = None  # right after the cache's entries, unless some were left out: the text's positions
        if self.skipped[0]:
            first = len(self.seen[0])
            positions = torch.arange(first, first + len(feed), device=self.device)[None]
        self.cols[0] += range(width, width + len(feed))
        self.seen[0].extend(feed)
        out = self.forward(torch.tensor([feed], device=self.device), self.cache, positions=positions, logits_at=at)
        return out.logits[:, -1], ([self._target_ids(greedy_ids(out)[0]).tolist()] if greedy else None)  # [1, V]

    def _target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """The target ids of the draft's logits' `columns` (the same, without a draft vocabulary)."""
        return columns if self.draft_ids is None else self.draft_ids[columns]

    def _greedy_token(self, logits: torch.Tensor, best: int) -> int:
        """The greedy draft token: the forward's argmax, unless a larger draft vocabulary must be cut to the
        target's first (what `_pad` does to the distribution)."""
        if self.target_vocab is not None and logits.shape[-1] > self.target_vocab:
            return int(logits[: self.target_vocab].float().argmax())
        return best

    def _pad(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft distribution over the target's vocabulary (a smaller draft vocabulary gets zero mass beyond it)."""
        if self.draft_ids is not None:
            full = probs.new_zeros(self.target_vocab or int(self.draft_ids[-1]) + 1)
            return full.index_copy_(0, self.draft_ids, probs)
        if self.target_vocab is None or probs.shape[-1] == self.target_vocab:
            return probs
        if probs.shape[-1] > self.target_vocab:
            probs = probs[..., : self.target_vocab]
            return probs / probs.sum(-1, keepdim=True)
        return torch.nn.functional.pad(probs, (0, self.target_vocab - probs.shape[-1]))

    def _own_probability(self, logits: torch.Tensor, token: int) -> float:
        """The draft's probability (temperature 1) of target id `token`, from its logits `[V]`."""
        column = token if self.draft_ids is None else int(torch.searchsorted(self.draft_ids, token))
        return float(torch.softmax(logits.float(), -1)[column])

    def _catch_up(self, b: int, state: DecodeState) -> tuple[list[int], int]:
        """Row b's tokens to feed before it drafts, and the first of them whose guess is read: the one whose next
        token is the first generated one, or the latest HINDSIGHT_ROWS' (hindsight, greedy only), else the last."""
        keep = self._leave_out(b, state.tokens, self._rewind(b, state.tokens))
        fed = state.tokens[keep:]
        read = max(0, state.prompt_len - 1 - keep, len(fed) - 1 - HINDSIGHT_ROWS)
        return fed, read if state.sampling.greedy and len(fed) - read > 1 else len(fed) - 1

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        B = len(states)
        want = [min(self.gamma[b], max_tokens[b]) if s is not None else 0 for b, s in enumerate(states)]
        if not any(want):
            return [Draft() for _ in states]
        feeds: list[list[int]] = [[] for _ in range(B)]
        read = [0] * B
        for b in range(B):
            if want[b]:
                feeds[b], read[b] = self._catch_up(b, states[b])
        if self.cache is None:
            self.forward = forward_for(self.model)  # eager, or compiled when compile_model compiled the draft
            longest = max(len(s.tokens) for s in states if s is not None)
            self.cache = self.forward.new_cache(max(self.positions, longest) + self.max_gamma)
        self.cols = pack_columns(self.cache, self.cols)  # each row's entries at columns 0..n_b - 1
        tokens: list[list[int]] = [[] for _ in range(B)]
        qs: list[list[torch.Tensor]] = [[] for _ in range(B)]
        live = [w > 0 for w in want]
        greedy = any(s is not None and s.sampling.greedy for s in states)
        logits, reads = self._forward(feeds, read, greedy)  # [B, V]; per row its read rows' argmax
        for b in range(B):
            if reads and len(reads[b]) > 1 and (self.target_vocab is None or logits.shape[-1] <= self.target_vocab):
                fed = feeds[b]  # a catch-up: the draft's guess after each fed token, against the target's next one
                self.note_hindsight([g == t for g, t in zip(reads[b], fed[len(fed) - len(reads[b]) + 1 :])])
        while True:
            feeds = [[] for _ in range(B)]
            for b in range(B):
                if not live[b]:
                    continue
                sampling = states[b].sampling
                if sampling.greedy:  # no distribution needed: greedy verification compares tokens
                    x = self._greedy_token(logits[b], reads[b][-1])
                else:
                    q = self._pad(logits_to_probs(logits[b], sampling))  # [V]
                    if not bool(torch.isfinite(q).all()):  # a broken draft (NaN weights) proposes nothing more
                        live[b] = False
                        continue
                    x = sample(q, states[b].generator)
                    qs[b].append(q)
                tokens[b].append(x)
                doubt = self.confidence and self._own_probability(logits[b], x) < self.confidence
                if doubt or len(tokens[b]) == want[b]:
                    live[b] = False  # the draft doubts this token, or the chain is long enough
                else:
                    feeds[b] = [x]
            if not any(live):
                break
            logits, reads = self._forward(feeds, [max(len(f), 1) - 1 for f in feeds], greedy)
        return [
            Draft.chain(t, None if states[b].sampling.greedy or not t else torch.stack(qs[b])) if t else Draft()
            for b, t in enumerate(tokens)
        ]

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        if self.adaptive and len(draft):
            # transformers' heuristic schedule: +2 after a fully accepted draft, -1 otherwise
            if len(accepted) == len(draft):
                self.gamma[row] = min(self.max_gamma, self.gamma[row] + 2)
            else:
                self.gamma[row] = max(1, self.gamma[row] - 1)

    def settings(self) -> dict:
        return {"gamma": self.initial_gamma, "adaptive": self.adaptive, "confidence": self.confidence}


@dataclass
class VanillaOptions:
    gamma: int = knob(DEFAULT_GAMMA, "draft tokens per step", lo=1, hi=MAX_GAMMA, flag="--gamma")
    # Measured like gamma above: gamma 3 alone 1.30x; with a stop: gamma 4 at 0.3 1.34x, at 0.5 1.34x; gamma 6 at 0.3
    # 1.37x, at 0.5 1.30x; gamma 8 at 0.6 1.33x: within this machine's noise of each other, so it stays off.
    confidence: float = knob(
        0.0,
        "stop drafting when the draft's probability of its token falls below this (0 = never)",
        lo=0.0,
        hi=0.99,
        label="stop below p",
        flag="--draft-confidence",
    )
    adaptive: bool = knob(
        False, "adapt gamma (+2 after a fully accepted draft, -1 otherwise)", label="adaptive gamma", flag="--adaptive"
    )


def load_draft(path: str, target: LoadedModel, access: dict) -> LoadedModel:
    """A draft model on the target's device and dtype, with the target's vocabulary; its LM head cut to its draft
    vocabulary where its folder has one."""
    draft = load_model(path, device=target.device, dtype=target.dtype, **access)
    check_same_vocabulary(target, draft)
    folder = Path(path)
    ids = read_draft_vocab(folder, target.vocab_size) if folder.is_dir() else None
    if ids is not None:
        narrow_lm_head(draft.model, ids)
        draft.draft_ids = ids
    return draft


def build(ctx: BuildContext) -> VanillaDrafter:
    o = ctx.options
    return VanillaDrafter(
        ctx.part.model,
        gamma=o.gamma,
        adaptive=o.adaptive,
        target_vocab=ctx.target.vocab_size,
        confidence=o.confidence,
        draft_ids=ctx.part.draft_ids,
    )


def serve(o: VanillaOptions, draft: str | None) -> Serving:
    hf = {"assistant_model": draft, "num_assistant_tokens": o.gamma}
    hf["num_assistant_tokens_schedule"] = "heuristic" if o.adaptive else "constant"
    if o.confidence:
        hf["assistant_confidence_threshold"] = o.confidence
    notes = ["vLLM and SGLang keep gamma fixed: `adaptive` and the confidence stop are transformers' only"]
    if draft and (Path(draft) / DRAFT_VOCAB).exists():
        notes.append("the draft's draft vocabulary is Glance's: these engines read its full LM head")
    return Serving(
        vllm={
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": o.gamma,
            "draft_tensor_parallel_size": 1,
        },
        sglang={
            "speculative-algorithm": "STANDALONE",
            "speculative-draft-model-path": draft,
            "speculative-num-steps": o.gamma,
            "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": o.gamma + 1,
        },
        transformers=hf,
        notes=notes,
    )


SPEC = DrafterSpec(
    name="vanilla",
    reference="hf_assisted",  # transformers' assisted generation, with this drafter's draft model
    label="vanilla speculative",
    color="#4fc3f7",
    summary="a separate small draft model proposes a chain (Leviathan et al. 2023, Chen et al. 2023)",
    build=build,
    options=VanillaOptions,
    serve=serve,
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
