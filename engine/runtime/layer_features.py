"""Capture the inputs of chosen decoder layers during a target forward, without asking for every hidden state.

EAGLE-3 reads three layers' features (low, middle, high). Hugging Face's `hidden_states[i]` is the input of layer i
(0: the embeddings); a forward pre-hook on layer i sees the same tensor, so ids mean the same in both conventions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from engine.errors import GlanceError


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of decoder layers of a causal LM (Llama/Qwen/Mistral/Gemma `model.layers`, GPT-2 `transformer.h`,
    GPT-NeoX `gpt_neox.layers`)."""
    base = getattr(model, "base_model", model)
    for name in ("layers", "h"):
        layers = getattr(base, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise GlanceError(f"cannot find the decoder layers of {type(model).__name__}: no model.layers or transformer.h")


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default low/middle/high choice: the inputs of layers 2, L // 2 and L - 3."""
    return (min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3))


@contextmanager
def layer_inputs(model: nn.Module, layer_ids: Sequence[int]) -> Iterator[list[torch.Tensor]]:
    """Yields a list that a forward run inside the block fills with the input [B, S, H] of each layer in
    `layer_ids`, in that order. The hooks are removed on exit, so other lanes sharing the model see nothing."""
    if not layer_ids:  # most drafters: nothing to hook, nothing to look up on every forward
        yield []
        return
    layers = decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i < len(layers)]
    if bad:
        raise GlanceError(f"feature layers {bad} do not exist: the target has {len(layers)} layers")
    found: dict[int, torch.Tensor] = {}
    captured: list[torch.Tensor] = []

    def hook_for(i: int):
        def hook(module, args, kwargs):
            found[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = [layers[i].register_forward_pre_hook(hook_for(i), with_kwargs=True) for i in dict.fromkeys(layer_ids)]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
        captured.extend(found[i] for i in layer_ids if i in found)
