"""Attention for one query row on a CPU in bfloat16 or float16 runs in float32.

PyTorch's CPU attention kernel (torch 2.13, `scaled_dot_product_attention`) is slow for a single query row in reduced
precision: on the bf16 EPYC, 8 heads of 64 over 320 cached keys took 150-170 us in bfloat16 against 50 us for two
rows, and 50-80 us for the same row in float32, casts included (2-4x at 128 to 2048 keys, with or without grouped
heads). A plain decoding step, a draft model's chain and a spine's drafting all attend one row per forward. Cast to
float32 (keys and values only up to the window, engine/runtime/attention_window.py), the bundled target's one-token
forward
went from 4.68 to 4.04 ms (compiled, interleaved, 300 cached tokens). Two rows and more stay in the model's dtype:
there float32 is no faster (often slower). The float32 result is the more exact one: greedy choices stay the model's,
and float32 models are untouched.

`glance_sdpa` is transformers' sdpa implementation under that rule, registered under its own name (`use_glance_sdpa`
sets it on a loaded model), so that eager and compiled forwards and the EAGLE head's layer share it; `sdpa` is the
same rule around torch's function, for heads that call it themselves (EAGLE-3's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engine.runtime.attention_window import dispatches

NAME = "glance_sdpa"
REDUCED = (torch.bfloat16, torch.float16)


def in_float32(query: torch.Tensor) -> bool:
    """Whether attention for `query` [B, H, S, D] runs in float32: one row (S = 1), reduced precision, on a CPU."""
    return query.shape[2] == 1 and query.dtype in REDUCED and query.device.type == "cpu"


def _float32(query, key, value, mask):
    """The inputs of the float32 path: query, keys, values and an additive mask cast (a boolean mask as it is)."""
    if mask is not None and mask.is_floating_point():
        mask = mask.float()
    return query.float(), key.float(), value.float(), mask


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, **kwargs):
    """torch's scaled_dot_product_attention [B, H, S, D] under the rule above (the output in the query's dtype)."""
    if not in_float32(query):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, **kwargs)
    q, k, v, mask = _float32(query, key, value, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs).to(query.dtype)


def glance_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention function, under the rule above: (output [B, S, H, D], None)."""
    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if not in_float32(query):
        return inner(module, query, key, value, attention_mask, **kwargs)
    out, weights = inner(module, *_float32(query, key, value, attention_mask), **kwargs)
    return out.to(query.dtype), weights


def register() -> str:
    """Register `glance_sdpa` (and sdpa's masks under its name: a name without them gets no mask at all) once."""
    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, glance_sdpa)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME


def use_glance_sdpa(model: torch.nn.Module) -> bool:
    """Run a model loaded with sdpa through `glance_sdpa`; False (nothing changed) for any other implementation, or
    where its attention does not pick its function from transformers' registry."""
    if model.config._attn_implementation != "sdpa" or not dispatches(model):
        return False
    model.config._attn_implementation = register()
    return True


@contextmanager
def stock_attention(*models: torch.nn.Module | None) -> Iterator[None]:
    """transformers' own sdpa for these models inside (the bench's transformers rows: stock transformers, not
    Glance's attention), the implementation they had after."""
    saved = [(m.config, m.config._attn_implementation) for m in models if m is not None]
    for config, name in saved:
        if name is not None and name.endswith(NAME):  # glance_sdpa, or the compiled forward's window around it
            config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        for config, name in saved:
            config._attn_implementation = name
