"""Attention over the live part of a static KV cache, not its whole capacity.

A `StaticKVCache` holds [B, H, capacity, D] buffers and a compiled forward attended over all of them, entries past
the length masked. Capacities are rounded up (256 positions, doubled when a run outgrows them), so a step read up to
2.5x the keys it needed: on the bundled target at 300 cached tokens in a 768-entry cache, a one-token forward took
6.2-7.0 ms over the capacity and 5.9-6.0 over a 320-entry window; two tokens 7.3 against 5.8-6.4.

The compiled forward now passes a mask only `window` columns wide (the entries and the new tokens, rounded up to
WINDOW_STEP so that a run's steps share shapes), and the model's attention, wrapped here, slices the keys and values
to the mask's width before calling the implementation the model was loaded with. The width is a symbolic size in
the graph: one graph serves every window.
"""

from __future__ import annotations

import inspect
import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

WINDOW_STEP = 64  # window widths are multiples of this (at most the capacity)
PREFIX = "glance_window_"


def window(needed: int, capacity: int) -> int:
    """Columns a mask over `needed` live entries (cached plus new) takes: rounded up to WINDOW_STEP, at most the
    capacity; `needed` itself when the cache must grow first."""
    if needed > capacity:
        return needed
    return min(capacity, -(-needed // WINDOW_STEP) * WINDOW_STEP)


def _windowed(name: str):
    """An attention function that reads keys and values up to the mask's width, then runs implementation `name`."""

    def attend(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None:
            width = attention_mask.shape[-1]  # [B, 1, S, width]: the window, at most the cache's capacity
            key, value = key[:, :, :width], value[:, :, :width]  # [B, H, width, D]: views, no copy
        inner = ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS else _eager(module)
        return inner(module, query, key, value, attention_mask, **kwargs)

    return attend


def _eager(module):
    """The model's own eager attention (transformers keeps it out of the registry, in the model's module)."""
    return sys.modules[type(module).__module__].eager_attention_forward


def dispatches(model: torch.nn.Module) -> bool:
    """Whether the model's attention picks its function from transformers' registry (what the wrapper relies on),
    with an eager fallback in its own module."""
    module = sys.modules.get(type(model).__module__)
    if module is None:
        return False
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source and hasattr(module, "eager_attention_forward")


def wrap_attention(model: torch.nn.Module) -> bool:
    """Run `model`'s attention through the window wrapper of its current implementation. False (nothing changed)
    where the model does not dispatch through the registry: its masks must then span the whole capacity."""
    config = model.config
    name = config._attn_implementation or "eager"
    if name.startswith(PREFIX):
        return True
    if not dispatches(model):
        return False
    AttentionInterface.register(PREFIX + name, _windowed(name))
    if name in ALL_MASK_ATTENTION_FUNCTIONS:
        # and the masks transformers builds for it (its own generate, an eager forward without a mask): unregistered,
        # a name gets no mask at all, and sdpa then aligned a causal run of several tokens after a cache to its
        # top-left corner (transformers' prompt lookup and assisted rows matched plain decoding on 0 of 82 prompts)
        AttentionMaskInterface.register(PREFIX + name, ALL_MASK_ATTENTION_FUNCTIONS[name])
    config._attn_implementation = PREFIX + name
    return True


def unwrap_attention(model: torch.nn.Module) -> None:
    """Give `model` back the attention implementation it was loaded with."""
    name = model.config._attn_implementation or ""
    if name.startswith(PREFIX):
        model.config._attn_implementation = name[len(PREFIX) :]
