"""Reference rows from transformers itself, same models, prompts and settings: plain `generate`, assisted generation
with the same draft, and prompt lookup decoding."""

from __future__ import annotations

import time

import torch

from engine.runtime.attention_precision import stock_attention
from engine.runtime.packed import unpacked

REFERENCE_LABELS = {
    "hf_generate": "transformers generate",
    "hf_assisted": "transformers assisted",
    "hf_prompt_lookup": "transformers prompt lookup",
}
REFERENCES = tuple(REFERENCE_LABELS)
PROMPT_LOOKUP_TOKENS = 3  # transformers' n-gram size for the prompt lookup row (its documented example uses 3..10)


@torch.no_grad()
def hf_generate(kind: str, target, ids: list[int], max_new_tokens: int, sampling, eos, draft=None) -> dict:
    """One transformers generate call of the given kind; tokens and wall seconds."""
    extra: dict = {}
    if kind == "hf_assisted":
        if draft is None:
            raise ValueError("hf_assisted needs the draft model")
        extra["assistant_model"] = draft
    elif kind == "hf_prompt_lookup":
        extra["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    if sampling.greedy:
        extra["do_sample"] = False
    else:
        torch.manual_seed(sampling.seed)
        extra |= {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p}
    device = next(target.parameters()).device
    inputs = torch.tensor([ids], device=device)
    t0 = time.perf_counter()
    # stock transformers: the model's own linear layers, not Glance's packed ones, and its own attention
    with unpacked(), stock_attention(target, draft):
        out = target.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=(eos[0] if isinstance(eos, list) and eos else eos) if eos not in (None, []) else 0,
            **extra,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return {"tokens": out[0, len(ids) :].tolist(), "wall_seconds": wall}
