"""A head's draft vocabulary (`draft_vocab.safetensors`, key `draft_ids`: sorted target ids): EAGLE and Medusa heads
read their candidates from those rows of the LM head only (engine/heads/eagle.py, medusa.py). Safetensors only."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.errors import GlanceError

DRAFT_VOCAB = "draft_vocab.safetensors"


def check_draft_ids(ids: torch.Tensor, vocab: int, where: str = "the draft vocabulary") -> torch.Tensor:
    """`ids` as sorted int64 target ids; GlanceError unless they are a non-empty 1-D set inside [0, vocab)."""
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or not len(ids) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise GlanceError(f"{where} must be a non-empty list of token ids (got shape {tuple(ids.shape)}, {ids.dtype})")
    ids = ids.long().sort().values
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab:
        raise GlanceError(f"{where} holds token ids outside the target's {vocab} tokens: made for another model")
    if len(ids) > 1 and bool((ids[1:] == ids[:-1]).any()):
        raise GlanceError(f"{where} repeats token ids")
    return ids


def read_draft_vocab(folder: Path, vocab: int) -> torch.Tensor | None:
    """The head folder's draft vocabulary (sorted target ids), None where it has none; safetensors only."""
    path = Path(folder) / DRAFT_VOCAB
    if not path.exists():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        ids = load_file(str(path)).get("draft_ids")
    except (SafetensorError, OSError) as exc:
        raise GlanceError(f"{path} is not a readable safetensors file ({exc})") from None
    if ids is None:
        raise GlanceError(f"{path} has no tensor draft_ids")
    return check_draft_ids(ids, vocab, str(path))


def save_draft_vocab(folder: Path, ids: torch.Tensor | None) -> None:
    """Write `ids` beside a head's weights, or remove an older file where the head has none (it must not pick up
    another head's)."""
    from safetensors.torch import save_file

    path = Path(folder) / DRAFT_VOCAB
    if ids is not None:
        save_file({"draft_ids": ids.long().cpu().contiguous()}, str(path))
    elif path.exists():
        path.unlink()


def rows_of(linear: nn.Module, ids: torch.Tensor, like: torch.Tensor) -> nn.Linear:
    """A frozen nn.Linear holding rows `ids` of `linear`'s weight (and bias), in `like`'s dtype and device: the
    read-out over the draft vocabulary (a packed LM head keeps its `weight`)."""
    weight = linear.weight.detach()
    bias = getattr(linear, "bias", None)
    out = nn.Linear(weight.shape[1], len(ids), bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight[ids.to(weight.device)])
        if bias is not None:
            out.bias.copy_(bias.detach()[ids.to(weight.device)])
    return out.to(device=like.device, dtype=like.dtype).requires_grad_(False)


def narrow_lm_head(model: nn.Module, ids: torch.Tensor) -> None:
    """A causal LM's head cut to the rows `ids` (frozen): its logits' column i is then target id ids[i]."""
    head = model.get_output_embeddings()
    model.set_output_embeddings(rows_of(head, ids, head.weight))
