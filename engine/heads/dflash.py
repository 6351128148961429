"""The DFlash block drafter (Chen, Liang, Liu 2026): a few Qwen3-style layers that fill a whole block of mask tokens
in one forward, conditioned on hidden states taken from several target layers.

The target's outputs of layers `target_layer_ids` (Hugging Face's `hidden_states[l + 1]`: the input of layer l + 1)
are concatenated per position and projected, `hidden_norm(fc(.))` [.., H], into a *context*. Every draft layer reads
the context as extra keys and values (`k_norm(k_proj(ctx))`, `v_proj(ctx)`, rotary at the context's positions) in
front of the block's own. The block is [the pending token, mask x (block_size - 1)] at the positions after the
context; its attention is bidirectional, and output i + 1 read through the target's LM head drafts token i. The draft
has no embedding or LM head of its own: it reuses the target's.

Checkpoint folder (z-lab's published layout, as vLLM and SGLang read it): `config.json` (Qwen3-style, with
`block_size` and `dflash_config.{mask_token_id, target_layer_ids}`) and `model.safetensors`: `fc.weight`
[H, k H], `hidden_norm.weight`, `norm.weight`, and per layer `layers.i.{input_layernorm, post_attention_layernorm}`,
`layers.i.self_attn.{q,k,v,o}_proj`, `layers.i.self_attn.{q,k}_norm`, `layers.i.mlp.{gate,up,down}_proj`. An
optional `draft_vocab.safetensors` (Glance's, as for the vanilla draft) restricts the read-out to those target ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import GlanceError
from engine.heads.checkpoint import config_errors, read_tensors
from engine.heads.draft_vocab import read_draft_vocab, save_draft_vocab
from engine.heads.eagle3 import MLP, RMSNorm
from engine.inputs import number, read_json_object, whole
from engine.runtime.attention_precision import sdpa

WEIGHTS = "model.safetensors"
MAX_BLOCK = 64  # verifying more than this many tokens a step pays on no device Glance runs on


class DFlashLayer(nn.Module):
    """One draft layer: attention whose keys and values are [context ; block], then an MLP, both pre-normed."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, eps, d = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["head_dim"]
        self.heads, self.kv_heads, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], d
        bias = cfg.get("attention_bias", False)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = nn.Module()
        a = self.self_attn
        a.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        a.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        a.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        a.o_proj = nn.Linear(self.heads * d, h, bias=bias)
        a.q_norm = RMSNorm(d, eps)
        a.k_norm = RMSNorm(d, eps)
        self.mlp = MLP(h, cfg["intermediate_size"])

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values [B, nkv, S, d] of inputs x [B, S, H] at the positions of cos/sin."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, s, _ = x.shape
        a = self.self_attn
        k = a.k_norm(a.k_proj(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k.contiguous(), v.contiguous()  # one layout for every context: compiled graphs guard on strides

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """x [B, S, H] the block; ctx_k, ctx_v [B, nkv, L, d]; mask additive [B, 1, S, L + S] or None (all see all)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, s, _ = x.shape
        a = self.self_attn
        h = self.input_layernorm(x)
        q = a.q_norm(a.q_proj(h).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, v = self.keys_values(h, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        out = sdpa(q, k, v, mask, enable_gqa=self.kv_heads != self.heads)  # [B, nh, S, d]
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


def _rotary(cfg: dict):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = dict(cfg["rope_parameters"])
    lc = LlamaConfig(
        hidden_size=cfg["hidden_size"],
        num_attention_heads=cfg["num_attention_heads"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rope_parameters=rope,
    )
    return LlamaRotaryEmbedding(lc)


class DFlashHead(nn.Module):
    """`context(features [B, n, kH], positions [B, n])` -> per layer (keys, values) of those context positions;
    `block(ids [B, S], positions [B, S], per-layer context keys/values, mask)` -> outputs [B, S, H] (normed);
    `logits(out)` -> [.., V] through the target's LM head (or the draft vocabulary's rows of it)."""

    def __init__(self, cfg: dict, target: nn.Module) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        h = cfg["hidden_size"]
        self.target_layer_ids = tuple(cfg["target_layer_ids"])
        self.feature_layers = tuple(i + 1 for i in self.target_layer_ids)  # their outputs = the next layers' inputs
        self.block_size, self.mask_token_id = cfg["block_size"], cfg["mask_token_id"]
        self.fc = nn.Linear(len(self.target_layer_ids) * cfg["target_hidden_size"], h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.__dict__["rotary"] = _rotary(cfg)  # no weights: kept out of the state dict
        self.__dict__["target"] = target  # not a submodule: its embedding and LM head stay out of the state dict
        self.draft_ids: torch.Tensor | None = None  # read-out columns -> target ids (None: the whole vocabulary)
        self.__dict__["readout"] = None  # the LM head's rows for draft_ids [Vd, H] (None: the whole head)

    @property
    def embed(self) -> nn.Module:
        return self.target.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The target's LM head as it is now: compiling packs the target's linears (engine/runtime/packed.py)."""
        return self.target.get_output_embeddings()

    @classmethod
    def for_target(cls, target: nn.Module, layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
                   target_layer_ids: list[int] | None = None) -> DFlashHead:  # fmt: skip
        """A fresh draft of `layers` layers shaped like the target's, reading the target layers `spread_layers`
        picks unless told."""
        c = target.config
        heads = c.num_attention_heads
        n = c.num_hidden_layers
        vocab = target.get_output_embeddings().weight.shape[0]
        cfg = {
            "hidden_size": c.hidden_size,
            "target_hidden_size": c.hidden_size,
            "intermediate_size": getattr(c, "intermediate_size", 4 * c.hidden_size),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": getattr(c, "num_key_value_heads", None) or heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
            "rms_norm_eps": float(getattr(c, "rms_norm_eps", 1e-6)),
            "rope_parameters": _target_rope(c),
            "max_position_embeddings": getattr(c, "max_position_embeddings", 4096),
            "vocab_size": vocab,
            "num_target_layers": n,
            "block_size": block_size,
            "mask_token_id": vocab - 1 if mask_token_id is None else mask_token_id,
            "target_layer_ids": list(target_layer_ids or spread_layers(n, layers)),
        }
        head = cls(cfg, target)
        p = next(target.parameters())
        return head.to(device=p.device, dtype=p.dtype)

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Read out only the target ids `ids` (sorted) from now on; None: the whole vocabulary."""
        self.draft_ids = ids
        w = self.lm_head.weight
        self.__dict__["readout"] = None if ids is None else w[ids.to(w.device)].detach()

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features [B, n, kH] at text positions [B, n] -> per layer (keys, values) [B, nkv, n, d]."""
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))  # [B, n, H]
        cos, sin = self.rotary(ctx, positions)
        return [layer.keys_values(ctx, cos, sin) for layer in self.layers]

    def block(self, ids: torch.Tensor, positions: torch.Tensor, ctx: list, mask: torch.Tensor | None) -> torch.Tensor:
        """ids, positions [B, S]; ctx per layer (keys, values) [B, nkv, L, d] -> outputs [B, S, H], normed."""
        x = self.embed(ids).to(self.fc.weight.dtype)  # [B, S, H]
        cos, sin = self.rotary(x, positions)
        for layer, (k, v) in zip(self.layers, ctx):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[.., H] -> [.., V] (or [.., Vd] over the draft vocabulary: column j is target id draft_ids[j])."""
        if self.readout is None:
            return self.lm_head(out.to(self.lm_head.weight.dtype))
        return F.linear(out.to(self.readout.dtype), self.readout)

    def save(self, folder: str | Path) -> None:
        """The published layout (config.json and model.safetensors), plus the draft vocabulary where there is one."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        c = self.cfg
        cfg = {k: v for k, v in c.items() if k not in ("target_layer_ids", "mask_token_id")}
        cfg |= {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "dflash_config": {"mask_token_id": c["mask_token_id"], "target_layer_ids": list(self.target_layer_ids)},
            "rope_theta": c["rope_parameters"].get("rope_theta", 10000.0),
        }
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS))
        save_draft_vocab(folder, self.draft_ids)


def spread_layers(num_target_layers: int, count: int) -> list[int]:
    """The target layers a fresh draft reads (the DFlash paper's choice): the middle one for one, else `count` spread
    evenly from layer 1 to layer L - 3 (0 to L - 2 on a target of fewer than five layers)."""
    last = num_target_layers - 2  # the last whose output is a layer's input (engine/runtime/layer_features.py)
    if count == 1:
        return [max(0, min(last, num_target_layers // 2))]
    start, end = (1, num_target_layers - 3) if num_target_layers >= 5 else (0, max(0, last))
    return sorted({round(start + i * (end - start) / (count - 1)) for i in range(count)})


def _target_rope(c) -> dict:
    rope = getattr(c, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_theta"):
        return dict(rope)
    return {"rope_type": "default", "rope_theta": float(getattr(c, "rope_theta", None) or 10000.0)}


def _config(raw: dict, target: nn.Module, where: str) -> dict:
    """The head's config from a published config.json, each field checked against the target (one GlanceError)."""
    c = target.config
    n = c.num_hidden_layers
    vocab = target.get_input_embeddings().weight.shape[0]
    nested = raw.get("dflash_config", {})
    if not isinstance(nested, dict):
        raise GlanceError(f"{where}: dflash_config is {type(nested).__name__}, not an object")
    if "target_layer_ids" not in nested or "mask_token_id" not in nested:
        raise GlanceError(f"{where}: dflash_config needs target_layer_ids and mask_token_id: not a DFlash draft")
    ids = nested["target_layer_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= n:
        raise GlanceError(f"{where}: target_layer_ids is {str(ids)[:80]}, not a list of 1 to {n} layer ids")
    ids = [whole(i, "target_layer_ids", where, 0, 10**6) for i in ids]
    if max(ids) > n - 2:
        raise GlanceError(
            f"{where}: target_layer_ids {ids} do not fit a {n}-layer target: DFlash reads the output of layer l, "
            f"which Glance takes as the input of layer l + 1, so ids run from 0 to {n - 2} (a draft for another "
            "model?)"
        )
    block = nested.get("block_size", raw.get("block_size"))
    block = whole(block, "block_size", where, 2, MAX_BLOCK)
    mask_id = whole(nested["mask_token_id"], "mask_token_id", where, 0, 10**9)
    if mask_id >= vocab:
        raise GlanceError(
            f"{where}: mask_token_id {mask_id} is outside the target's {vocab}-token embedding: a draft for "
            "another model?"
        )
    h = whole(raw["hidden_size"], "hidden_size", where)
    heads = whole(raw["num_attention_heads"], "num_attention_heads", where, 1, h)
    kv = whole(raw.get("num_key_value_heads") or heads, "num_key_value_heads", where, 1, heads)
    if heads % kv:
        raise GlanceError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise GlanceError(f"{where}: rope_parameters is {type(rope).__name__}, not an object")
    rope = dict(rope)
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope["rope_theta"] = number(rope.get("rope_theta", raw.get("rope_theta", 10000.0)), "rope_theta", where)
    types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in types if isinstance(t, str)) and raw.get("use_sliding_window", False):
        raise GlanceError(f"{where}: sliding-window draft layers are not supported (layer_types {types[:4]})")
    return {
        "hidden_size": h,
        "target_hidden_size": whole(raw.get("target_hidden_size", h), "target_hidden_size", where),
        "intermediate_size": whole(raw["intermediate_size"], "intermediate_size", where),
        "num_hidden_layers": whole(raw["num_hidden_layers"], "num_hidden_layers", where, 1, 64),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": whole(raw.get("head_dim") or h // heads, "head_dim", where, 1, 4096),
        "rms_norm_eps": number(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps", where),
        "attention_bias": bool(raw.get("attention_bias", False)),
        "rope_parameters": rope,
        "max_position_embeddings": whole(raw.get("max_position_embeddings", 4096), "max_position_embeddings", where),
        "vocab_size": vocab,
        "num_target_layers": n,
        "block_size": block,
        "mask_token_id": mask_id,
        "target_layer_ids": ids,
    }


def load_dflash_head(folder: str | Path, target: nn.Module) -> DFlashHead:
    """Load a DFlash draft in the published layout, every field and shape checked against the target; one
    GlanceError names what does not fit."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"DFlash draft folder not found: {folder}")
    where = f"{folder}/config.json"
    raw = read_json_object(folder / "config.json", "a DFlash draft's config")
    state = read_tensors(folder, WEIGHTS, "pytorch_model.bin")
    if "fc.weight" not in state or "layers.0.self_attn.q_norm.weight" not in state:
        hint = " (an EAGLE-3 head? pick it under EAGLE-3)" if "midlayer.self_attn.q_proj.weight" in state else ""
        raise GlanceError(f"{folder}: no fc.weight or layers.0.self_attn.q_norm.weight: not the DFlash layout{hint}")
    with config_errors(folder, "DFlash draft", "hidden_size, intermediate_size, num_hidden_layers and heads"):
        cfg = _config(raw, target, where)
    hidden = target.get_input_embeddings().weight.shape[1]
    if cfg["hidden_size"] != hidden:
        raise GlanceError(f"{folder}: the draft's hidden size {cfg['hidden_size']} differs from the target's {hidden}")
    want_fc = [cfg["hidden_size"], len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]]
    if list(state["fc.weight"].shape) != want_fc:
        raise GlanceError(
            f"{folder}: fc.weight is {list(state['fc.weight'].shape)}, {len(cfg['target_layer_ids'])} target layers "
            f"of width {cfg['target_hidden_size']} need {want_fc}: a draft for another model?"
        )
    state = {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "lm_head.", "rotary_emb."))}
    with config_errors(folder, "DFlash draft", "hidden_size, intermediate_size, num_hidden_layers and heads"):
        head = DFlashHead(cfg, target)
    own = head.state_dict()
    for key, value in state.items():
        if key in own and tuple(own[key].shape) != tuple(value.shape):
            raise GlanceError(f"{folder}: {key} is {list(value.shape)}, this config needs {list(own[key].shape)}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise GlanceError(f"{folder}: {key} holds NaN or infinite weights: a damaged draft")
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise GlanceError(
            f"{folder}: the weights do not fit a {cfg['num_hidden_layers']}-layer DFlash draft (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})"
        )
    head.load_state_dict(state)
    p = next(target.parameters())
    head = head.to(device=p.device, dtype=p.dtype).eval()
    head.set_draft_vocab(read_draft_vocab(folder, cfg["vocab_size"]))
    return head


def transformers_assistant(head: DFlashHead):
    """transformers' own DFlash draft class (`MuseGlimmerAssistantModel`, which its `generate` runs with
    `speculation_type="dflash"`) holding this head's weights: the bench's reference row. Made once per head."""
    cached = head.__dict__.get("_transformers")
    if cached is not None:
        return cached
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    c = head.cfg
    cfg = MuseGlimmerAssistantConfig(
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"], head_dim=c["head_dim"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], rms_norm_eps=c["rms_norm_eps"],
        rope_parameters=dict(c["rope_parameters"]), max_position_embeddings=c["max_position_embeddings"],
        layer_types=["full_attention"] * c["num_hidden_layers"], block_size=c["block_size"],
        mask_token_id=c["mask_token_id"], target_layer_ids=list(head.target_layer_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    names = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
    p = next(head.parameters())
    model = MuseGlimmerAssistantModel(cfg).to(device=p.device, dtype=p.dtype).eval()
    model.load_state_dict({names.get(k, k): v for k, v in head.state_dict().items()})
    head.__dict__["_transformers"] = model
    return model
