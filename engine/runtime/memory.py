"""How much memory a batch of decoding rows asks for, against what the device has free: what lets a benchmark
refuse a batch size before allocating it (4096 rows of a 49k-vocabulary model ask for tens of GB)."""

from __future__ import annotations

import torch

VERIFY_WIDTH = 64  # tokens a tree step verifies per row at most (the drafters' defaults stay under it)


def batch_bytes(model: torch.nn.Module, rows: int, positions: int) -> int:
    """KV cache for `rows` x `positions`, plus one verification step's float32 logits."""
    c = model.config
    layers = getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", 1)
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    hidden = getattr(c, "hidden_size", None) or getattr(c, "n_embd", 1)
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    item = next(model.parameters()).element_size()
    vocab = model.get_output_embeddings().weight.shape[0]
    return rows * (positions * layers * 2 * kv_heads * head_dim * item + VERIFY_WIDTH * vocab * 4)


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device` (None where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)
