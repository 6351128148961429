"""Reference rows from transformers itself, same models, prompts and settings: plain `generate`, assisted generation
with the same draft, prompt lookup decoding, DFlash with the same draft (transformers' DFlash assistant class holding
the DFlash lane's weights), a target's own MTP layers and Gemma 4's assistant."""

from __future__ import annotations

import time

import torch

from engine.runtime.attention_precision import stock_attention
from engine.runtime.packed import unpacked

REFERENCE_LABELS = {
    "hf_generate": "transformers generate",
    "hf_assisted": "transformers assisted",
    "hf_prompt_lookup": "transformers prompt lookup",
    "hf_dflash": "transformers DFlash",
    "hf_mtp": "transformers MTP",
    "hf_assistant": "transformers Gemma 4 assistant",
}
REFERENCES = tuple(REFERENCE_LABELS)
PROMPT_LOOKUP_TOKENS = 3  # transformers' n-gram size for the prompt lookup row (its documented example uses 3..10)


@torch.no_grad()
def hf_generate(kind: str, target, ids: list[int], max_new_tokens: int, sampling, eos, draft=None) -> dict:
    """One transformers generate call of the given kind; tokens and wall seconds. `draft`: the assistant model
    (hf_assisted: the draft model; hf_dflash: transformers' DFlash assistant; hf_assistant: Gemma 4's assistant)."""
    extra: dict = {}
    if kind in ("hf_assisted", "hf_dflash", "hf_assistant"):
        if draft is None:
            raise ValueError(f"{kind} needs its assistant model")
        extra["assistant_model"] = draft
        if kind == "hf_dflash":
            extra["speculation_type"] = "dflash"
    elif kind == "hf_mtp":
        extra["use_mtp"] = True
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


def reference_available(kind: str, target, parts: dict) -> bool:
    """Whether transformers can run the row `kind` with what is loaded: assisted generation needs the draft model,
    DFlash the DFlash draft, MTP a target that ships its own MTP layers (transformers reads only those)."""
    if kind == "hf_assisted":
        return parts.get("draft") is not None
    if kind == "hf_dflash":
        return parts.get("dflash") is not None
    if kind == "hf_assistant":
        return parts.get("assistant") is not None
    if kind == "hf_mtp":
        from engine.heads.mtp import declared_layers

        return declared_layers(target.config) > 0
    return True


def reference_assistant(kind: str, parts: dict, options=None):
    """The assistant model the row `kind` passes to generate, or None; Gemma 4's drafts as many tokens a step as
    the lane's options say (engine.session.DrafterOptions)."""
    if kind == "hf_assisted" and parts.get("draft") is not None:
        return parts["draft"].model
    if kind == "hf_dflash" and parts.get("dflash") is not None:
        from engine.heads.dflash import transformers_assistant

        return transformers_assistant(parts["dflash"])
    if kind == "hf_assistant" and parts.get("assistant") is not None:
        model = parts["assistant"].model
        if options is not None:
            model.generation_config.num_assistant_tokens = options.for_method("assistant").tokens
        return model
    return None
