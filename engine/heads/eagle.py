"""The EAGLE head (Li et al. 2024): one decoder layer that predicts the target's next last-hidden-state ("feature").

Input at position i is the pair (token x_{i+1}, feature f_i): `fc` maps cat(embed(x_{i+1}), f_i) [2H] to H, a
Llama decoder layer without its input norm (and no final norm) turns that into f_{i+1}, and the target's own LM
head reads a token distribution from it. Embeddings and LM head are the target's, frozen, and not stored.

Checkpoint folder (published EAGLE layout): `config.json` (hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, rope_theta, rms_norm_eps, optional "bias") and `model.safetensors` or `pytorch_model.bin`
(loaded with weights_only=True): `fc.weight`, `fc.bias`, `layers.0.self_attn.{q,k,v,o}_proj.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight`, optional
`embed_tokens.weight` (ignored: the target's embeddings are used).

Optional `draft_vocab.safetensors` (Glance's, key `draft_ids`: sorted target ids): the head reads its candidates
from those rows of the target's LM head only, the most frequent tokens of its training text (FR-Spec's frequency-
ranked drafting, as EAGLE-3's own reduced vocabulary). The read-out is most of a drafting depth's arithmetic (the
bundled head: 4.2M of the LM head's weights against 3.7M in its layer; SmolLM2's: 28M against 3.6M), and the
draft stays a proposal that the target verifies, so output is unchanged. Without the file: the whole vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from engine.errors import GlanceError
from engine.heads.checkpoint import config_errors, read_tensors
from engine.heads.draft_vocab import DRAFT_VOCAB, check_draft_ids, read_draft_vocab, rows_of, save_draft_vocab
from engine.inputs import read_json_object

__all__ = ["DRAFT_VOCAB", "EagleHead", "load_eagle_head", "read_draft_vocab"]

WEIGHTS_SAFE = "model.safetensors"
WEIGHTS_BIN = "pytorch_model.bin"


def _llama_config(cfg: dict):
    from transformers import LlamaConfig

    from engine.runtime.attention_precision import register as register_glance_sdpa

    lc = LlamaConfig(
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        num_hidden_layers=1,
        rope_theta=cfg.get("rope_theta", 10000.0),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        vocab_size=cfg.get("vocab_size", 32000),
    )
    lc._attn_implementation = register_glance_sdpa()  # sdpa, one row in float32 (engine/runtime/attention_precision.py)
    return lc


class EagleHead(nn.Module):
    """forward(tokens [B, S], features [B, S, H], position_ids [B, S], cache, mask) -> predicted features [B, S, H]."""

    def __init__(self, cfg: dict, target: nn.Module) -> None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        self.cfg = dict(cfg)
        self.llama_config = _llama_config(cfg)
        h = cfg["hidden_size"]
        self.fc = nn.Linear(2 * h, h, bias=cfg.get("bias", True))
        self.layers = nn.ModuleList([LlamaDecoderLayer(self.llama_config, 0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE's first layer has no input norm
        self.rotary = LlamaRotaryEmbedding(self.llama_config)
        # the target, not a submodule: its frozen embeddings and LM head stay out of the head's state dict
        self.__dict__["target"] = target
        self.readout: nn.Linear | None = None  # the LM head's draft-vocabulary rows (set_draft_vocab)
        # [draft_vocab] sorted target ids, or None: the whole vocabulary (a buffer: it follows .to(), and is not
        # saved with the weights but in its own file)
        self.register_buffer("draft_ids", None, persistent=False)

    @property
    def embed(self) -> nn.Module:
        return self.target.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The target's LM head as it is now, not as it was when the head was built: compiling packs the target's
        linears (engine/runtime/packed.py), and a head holding the old one read a second 8 MB copy of it every depth,
        which
        pushed the target's own weights out of the cache."""
        return self.target.get_output_embeddings()

    @classmethod
    def for_target(cls, target: nn.Module, bias: bool = True) -> EagleHead:
        """A fresh head shaped like one layer of the target (Llama-style config fields)."""
        c = target.config
        cfg = {
            "hidden_size": c.hidden_size,
            "intermediate_size": getattr(c, "intermediate_size", 4 * c.hidden_size),
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            "rope_theta": float(getattr(c, "rope_theta", None) or 10000.0),
            "rms_norm_eps": float(getattr(c, "rms_norm_eps", 1e-6)),
            "vocab_size": target.get_output_embeddings().weight.shape[0],
            "bias": bias,
        }
        head = cls(cfg, target)
        p = next(target.parameters())
        return head.to(device=p.device, dtype=p.dtype)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.llama_config)

    def forward(self, tokens, features, position_ids, cache=None, attention_mask=None) -> torch.Tensor:
        x = self.fc(torch.cat([self.embed(tokens).to(features.dtype), features], dim=-1))  # [B, S, H]
        pos = self.rotary(x, position_ids)
        return self.layers[0](
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=pos,
        )

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Draft over the target ids `ids` only (sorted, unique, inside the vocabulary), None: the whole vocabulary.
        The read-out becomes a copy of those rows of the target's LM head, in the head's dtype and device."""
        if ids is None:
            self.readout, self.draft_ids = None, None
            return
        p = next(self.fc.parameters())
        ids = check_draft_ids(ids, self.lm_head.weight.shape[0])
        self.readout = rows_of(self.lm_head, ids, p)
        self.draft_ids = ids.to(p.device)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., V] over the target's vocabulary, or [..., draft_vocab] over the draft vocabulary."""
        return self.lm_head(features) if self.readout is None else self.readout(features)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """The target ids of the head's output ids (the same ids without a draft vocabulary)."""
        return ids if self.draft_ids is None else self.draft_ids[ids]

    def feature_widths(self) -> tuple[int, ...]:
        """The widths of the features drafting feeds: the target's last hidden state, then the head's own."""
        return (self.cfg["hidden_size"],)

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = dict(self.cfg, architectures=["EagleHead"])
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {
            k: v.detach().to(torch.bfloat16).contiguous().cpu()
            for k, v in self.state_dict().items()
            if not k.startswith(("rotary.", "readout."))  # the read-out is the target's, copied at load
        }
        save_file(state, str(folder / WEIGHTS_SAFE))
        save_draft_vocab(folder, self.draft_ids)


def read_state(folder: Path) -> dict:
    """A head's tensors from model.safetensors, else pytorch_model.bin (weights_only: never unpickles code)."""
    return read_tensors(folder, WEIGHTS_SAFE, WEIGHTS_BIN)


def load_eagle_head(folder: str | Path, target: nn.Module) -> EagleHead:
    """Load a head in the published layout, checking shapes against the target."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"EAGLE head folder not found: {folder}")
    cfg = read_json_object(folder / "config.json", "an EAGLE head's config")
    state = read_state(folder)
    hidden = target.get_output_embeddings().weight.shape[1]
    fc = state.get("fc.weight")
    if fc is None:
        raise GlanceError(f"{folder}: no key fc.weight: not the EAGLE key layout")
    if fc.shape != (hidden, 2 * hidden) or cfg.get("hidden_size", hidden) != hidden:
        raise GlanceError(
            f"the EAGLE head works on hidden size {fc.shape[0]}, the target has {hidden}: "
            "this head was trained for another model"
        )
    cfg.setdefault("hidden_size", hidden)
    cfg["bias"] = "fc.bias" in state
    state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
    with config_errors(folder, "EAGLE layer", "hidden_size, intermediate_size and num_attention_heads"):
        head = EagleHead(cfg, target)
        missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if missing or unexpected:
        raise GlanceError(
            f"{folder}: the checkpoint does not fit an EAGLE layer of this shape "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    p = next(target.parameters())
    head = head.to(device=p.device, dtype=p.dtype).eval()
    head.set_draft_vocab(read_draft_vocab(folder, target.get_output_embeddings().weight.shape[0]))
    return head
