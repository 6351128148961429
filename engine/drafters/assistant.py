"""Gemma 4's assistant drafting (engine/heads/assistant.py): a chain of K tokens, each from the assistant's previous
token and projected state, all attending to the target's committed keys and values at the pending token's position.

Per row the drafter keeps one hidden state: the target's last hidden state at the position that predicted the pending
token (the prompt's last, then the verification row of the last accepted token). The target's keys and values come
from the loop (`Drafter.context_layers`, `DecodeState.context`), so nothing is copied or kept here. Each draft is
the argmax (greedy) or a sample of the assistant's own distribution q at its depth (Leviathan's rule stays exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.decoding.sampling import logits_to_probs, sample
from engine.decoding.tree import Draft, additive_mask
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BuildContext, DrafterSpec, PartSpec, knob
from engine.heads.assistant import AssistantHead, load_assistant_head

DEFAULT_TOKENS = 4  # vLLM's example for Gemma 4's assistants (num_speculative_tokens)


class AssistantDrafter(Drafter):
    name = "assistant"
    needs_hidden_states = True  # the target's final (normed) hidden state, as transformers' generator reads it

    def __init__(self, head: AssistantHead, tokens: int = DEFAULT_TOKENS) -> None:
        self.head = head
        self.tokens = tokens
        self.context_layers = head.context_layers
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.hidden: list[torch.Tensor | None] = [None] * rows  # per row: [Hb], what predicted the pending token

    def begin(self, row: int, state: DecodeState) -> None:
        self.hidden[row] = state.target_out.hidden_states[-1][0, -1]

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        self.hidden[row] = state.target_out.hidden_states[-1][0, state.rows[-1]]

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        drafts = [Draft() for _ in states]
        live = [b for b, s in enumerate(states) if s is not None and max_tokens[b] >= 1]
        if not live:
            return drafts
        want = [min(self.tokens, max_tokens[b]) for b in live]
        lengths = [states[b].context[0][0].shape[2] for b in live]  # the target's entries: every token but the pending
        context, mask = self._batch_context([states[b].context for b in live], lengths)
        tokens = torch.tensor([states[b].tokens[-1] for b in live], device=self.device)
        hidden = torch.stack([self.hidden[b] for b in live]).to(self.device)  # [n, Hb]
        positions = torch.tensor(lengths, device=self.device)  # the pending token's position, for every depth
        chains: list[list[int]] = [[] for _ in live]
        qs: list[list[torch.Tensor]] = [[] for _ in live]
        for depth in range(max(want)):
            logits, hidden = self.head.step(tokens, hidden, positions, context, mask)  # [n, V], [n, Hb]
            picked = []
            for r, b in enumerate(live):
                s = states[b]
                if s.sampling.greedy:
                    picked.append(int(logits[r].argmax()))
                    continue
                q = logits_to_probs(logits[r : r + 1].float(), s.sampling)[0]  # [V]
                qs[r].append(q)
                picked.append(sample(q, s.generator) if bool(torch.isfinite(q).all()) else 0)
            for r, token in enumerate(picked):
                if depth < want[r]:
                    chains[r].append(token)
            tokens = torch.tensor(picked, device=self.device)
        for r, b in enumerate(live):
            m = want[r]
            if states[b].sampling.greedy:
                drafts[b] = Draft.chain(chains[r][:m])
            elif all(bool(torch.isfinite(q).all()) for q in qs[r][:m]):  # a broken assistant proposes nothing
                drafts[b] = Draft.chain(chains[r][:m], torch.stack(qs[r][:m]))
        return drafts

    def _batch_context(self, contexts: list, lengths: list[int]):
        """Per kind the rows' (keys, values) [n, h, L, d], right-padded to the longest, and the additive mask
        [n, 1, 1, L] hiding the padding (None when no row is padded)."""
        if len(contexts) == 1:
            return contexts[0], None
        longest = max(lengths)
        kinds = []
        for i in range(len(contexts[0])):
            pad = [
                (
                    torch.nn.functional.pad(c[i][0], (0, 0, 0, longest - n)),
                    torch.nn.functional.pad(c[i][1], (0, 0, 0, longest - n)),
                )
                for c, n in zip(contexts, lengths)
            ]
            kinds.append((torch.cat([k for k, _ in pad]), torch.cat([v for _, v in pad])))
        if min(lengths) == longest:
            return kinds, None
        visible = torch.ones(len(contexts), 1, longest, dtype=torch.bool)
        for r, n in enumerate(lengths):
            visible[r, :, n:] = False
        return kinds, additive_mask(visible, self.dtype, self.device)

    def settings(self) -> dict:
        return {"tokens": self.tokens, **{k: v for k, v in self.head.cfg.items() if k != "target_layers"}}


@dataclass
class AssistantOptions:
    tokens: int = knob(DEFAULT_TOKENS, "tokens the assistant drafts a step (a chain)", lo=1, hi=16)


def build(ctx: BuildContext) -> AssistantDrafter:
    return AssistantDrafter(ctx.part, tokens=ctx.options.tokens)


def serve(o: AssistantOptions, folder: str | None) -> Serving:
    return Serving(
        vllm={"model": folder, "num_speculative_tokens": o.tokens},
        sglang=None,
        transformers={"assistant_model": folder},
        notes=[
            "vLLM runs Gemma 4's assistant with its Gemma 4 proposer (the target's KV shared with the assistant)",
            "SGLang has no Gemma 4 assistant path: serve another drafter there",
            f"transformers drafts the assistant's generation_config num_assistant_tokens a step: set it to {o.tokens}",
        ],
    )


def describe(head: AssistantHead) -> dict:
    return dict(head.cfg)


SPEC = DrafterSpec(
    name="assistant",
    reference="hf_assistant",  # transformers' generate with the same assistant (its single-position generator)
    label="Gemma 4 assistant",
    color="#4db6ac",
    summary="Gemma 4's assistant drafts a chain from the target's last hidden state, attending to the target's own "
    "keys and values",
    in_default_race=False,  # only for Gemma 4 targets, with an assistant folder named
    build=build,
    options=AssistantOptions,
    serve=serve,
    explain=lambda o: f"a chain of {o.tokens}",
    part=PartSpec(
        "assistant",
        "Gemma 4 assistant folder (Gemma4AssistantForCausalLM), for a Gemma 4 target",
        load=lambda path, target, access: load_assistant_head(path, target.model),
        describe=describe,
        brief=lambda head: f"{head.cfg['layers']} layers reading target layers {list(head.context_layers)}",
    ),
)
