"""Prompt lookup decoding (Saxena 2023): no model at all. The newest n-gram of the committed text (the longest of
`max_ngram` down to 1 tokens that occurred before) is found earlier in the prompt or output, and the tokens that
followed it there are proposed as a chain. Candidates are a deterministic function of the context, so verification
is exact (greedy, or the deterministic-candidate rule when sampling), as for lookahead's n-grams."""

from __future__ import annotations

from dataclasses import dataclass

from engine.decoding.tree import Draft
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, knob

DEFAULT_MAX_NGRAM = 3
DEFAULT_TOKENS = 8


def lookup(tokens: list[int], max_ngram: int, count: int) -> list[int]:
    """Up to `count` tokens that followed the latest earlier occurrence of the longest matching tail n-gram."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # newest occurrence first, never the tail itself
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + count]
    return []


class PromptLookupDrafter(Drafter):
    name = "prompt_lookup"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, tokens: int = DEFAULT_TOKENS) -> None:
        self.max_ngram, self.tokens = max_ngram, tokens

    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        """Each row's chain: a lookup in its own text, on the host (nothing to batch)."""
        return [
            Draft.chain(lookup(s.tokens, self.max_ngram, min(self.tokens, m))) if s is not None else Draft()
            for s, m in zip(states, max_tokens)
        ]

    def settings(self) -> dict:
        return {"max_ngram": self.max_ngram, "tokens": self.tokens}


@dataclass
class PromptLookupOptions:
    ngram: int = knob(DEFAULT_MAX_NGRAM, "longest n-gram matched against the context", lo=1, hi=8)
    tokens: int = knob(DEFAULT_TOKENS, "tokens proposed after a match", lo=1, hi=32)


def build(ctx: BuildContext) -> PromptLookupDrafter:
    return PromptLookupDrafter(ctx.options.ngram, ctx.options.tokens)


def serve(o: PromptLookupOptions, part: str | None) -> Serving:
    return Serving(
        vllm={
            "method": "ngram",
            "num_speculative_tokens": o.tokens,
            "prompt_lookup_max": o.ngram,
            "prompt_lookup_min": 1,
        },
        transformers={"prompt_lookup_num_tokens": o.tokens, "max_matching_ngram_size": o.ngram},
        notes=["SGLang's NGRAM algorithm matches a cache of past requests, with knobs of its own: see its docs"],
    )


SPEC = DrafterSpec(
    name="prompt_lookup",
    reference="hf_prompt_lookup",
    label="prompt lookup",
    color="#ffd54f",
    summary="the tokens that followed the newest n-gram earlier in the prompt or output (Saxena 2023)",
    build=build,
    options=PromptLookupOptions,
    serve=serve,
    in_default_race=False,  # lookahead already pools the context's n-grams; tick it to compare
    # In a batch of two or more rows a verified token costs the target real arithmetic, and the cost-aware cap
    # shortens the chain to what pays; at one row a longer chain costs next to nothing, and a cap only lost tokens.
    budget=BudgetTraits(depth_cap="batches"),
)
