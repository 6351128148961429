"""The EAGLE-3 head (Li et al. 2025): one decoder layer that drafts tokens straight from fused target features.

Input at position i is (token x_{i+1}, feature g_i). At the first drafting depth g_i is `fc` over the concatenated
low/middle/high target features [3H] -> [H]; deeper depths feed the head's own output (its pre-norm residual
stream). The layer's attention reads [input_layernorm(embed(x)) ; hidden_norm(g)] of width 2H, and its residual is
g. Logits come from `lm_head(norm(out))` over a reduced draft vocabulary; `d2t` maps a draft id d to the target id
d + d2t[d], and `t2d` marks which target ids the draft vocabulary holds.

Checkpoint folder (the layout SafeAILab/EAGLE, SpecForge and vLLM's speculators write): `config.json` (Llama-style,
with `draft_vocab_size`; optional `eagle_config.eagle_aux_hidden_state_layer_ids` or
`eagle_aux_hidden_state_layer_ids`, `target_hidden_size`) and `model.safetensors` or `pytorch_model.bin` (loaded
with weights_only=True): `fc.weight` [H, 3H], `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}`,
`midlayer.self_attn.{q,k,v,o}_proj.weight`, `midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`,
`lm_head.weight` [draft_vocab, H], `d2t` [draft_vocab], `t2d` [vocab]; `embed_tokens.weight` is ignored (the
target's embeddings are used).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import GlanceError
from engine.heads.checkpoint import config_errors
from engine.heads.eagle import WEIGHTS_SAFE, read_state
from engine.inputs import number, read_json_object, whole, whole_list
from engine.runtime.attention_precision import sdpa
from engine.runtime.layer_features import default_feature_layers


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read a [B, S, 2H] input; rotary positions as in Llama."""

    def __init__(self, h: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * h, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, h, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B, nh, S, d], k and v [B, nkv, S, d], rotary applied."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B, nh, S, d] over k, v [B, nkv, L, d] under an additive mask [B, 1, S, L] -> [B, S, H]."""
        out = sdpa(q, k, v, mask, enable_gqa=self.kv_heads != self.heads)  # one row in float32 (see sdpa)
        b, _, s, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MidLayer(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = Attention(h, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
        self.mlp = MLP(h, cfg["intermediate_size"])

    def project(self, embeds, hidden, cos, sin):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, S, 2H]
        return self.self_attn.project(x, cos, sin)

    def finish(self, hidden, q, k, v, mask) -> torch.Tensor:
        """The rest of the layer once keys and values are known: attention, residual on `hidden`, MLP."""
        x = hidden + self.self_attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MLP(nn.Module):
    def __init__(self, h: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, inner, bias=False)
        self.up_proj = nn.Linear(h, inner, bias=False)
        self.down_proj = nn.Linear(inner, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KVCache:
    """The head's own keys and values [B, nkv, L, d]; `crop` drops draft entries after drafting, `gather_rows`
    packs a batch's rows (engine/drafters/eagle.py)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]

    def gather_rows(self, index: torch.Tensor) -> None:
        """Row b keeps positions index[b] [L] (pad entries point anywhere and stay masked). index: [B, L] long."""
        if self.k is not None:
            b, h, _, d = self.k.shape
            idx = index.to(self.k.device)[:, None, :, None].expand(b, h, index.shape[1], d)  # [B, nkv, L, d]
            self.k, self.v = self.k.gather(2, idx), self.v.gather(2, idx)


def _rotary(cfg: dict):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    lc = LlamaConfig(
        hidden_size=cfg["hidden_size"],
        num_attention_heads=cfg["num_attention_heads"],
        head_dim=cfg["head_dim"],
        rope_theta=cfg["rope_theta"],
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rope_scaling=cfg.get("rope_scaling"),
    )
    return LlamaRotaryEmbedding(lc)


class Eagle3Head(nn.Module):
    """forward(tokens [B, S], hidden [B, S, 3H] or [B, S, H], positions [B, S], cache, mask) -> outputs [B, S, H]
    (pre-norm: fed back as the next depth's hidden); `logits(out)` -> [.., draft_vocab]."""

    def __init__(self, cfg: dict, target: nn.Module) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        h = cfg["hidden_size"]
        self.layer_ids = tuple(cfg["layer_ids"])
        self.fc = nn.Linear(3 * cfg.get("target_hidden_size", h), h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(h, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))
        self.__dict__["rotary"] = _rotary(cfg)  # no weights: kept out of the state dict
        self.__dict__["embed"] = target.get_input_embeddings()  # the target's, frozen, not stored

    @classmethod
    def for_target(cls, target: nn.Module, draft_ids: torch.Tensor, layer_ids=None) -> Eagle3Head:
        """A fresh head shaped like one layer of the target, drafting over the target ids `draft_ids` (sorted)."""
        c = target.config
        heads = c.num_attention_heads
        cfg = {
            "hidden_size": c.hidden_size,
            "intermediate_size": getattr(c, "intermediate_size", 4 * c.hidden_size),
            "num_attention_heads": heads,
            "num_key_value_heads": getattr(c, "num_key_value_heads", None) or heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
            "rope_theta": float(getattr(c, "rope_theta", None) or 10000.0),
            "rms_norm_eps": float(getattr(c, "rms_norm_eps", 1e-6)),
            "vocab_size": target.get_output_embeddings().weight.shape[0],
            "draft_vocab_size": len(draft_ids),
            "layer_ids": list(layer_ids or default_feature_layers(c.num_hidden_layers)),
        }
        head = cls(cfg, target)
        head.set_vocab(draft_ids)
        p = next(target.parameters())
        return head.to(device=p.device, dtype=p.dtype)

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """d2t and t2d for the sorted target ids `draft_ids` [draft_vocab]."""
        ids = draft_ids.long().to(self.d2t.device)
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (same shape)."""
        return draft_ids + self.d2t[draft_ids]

    def target_ids(self) -> torch.Tensor:
        """The target id of every draft-vocabulary entry [draft_vocab]."""
        return self.to_target(torch.arange(len(self.d2t), device=self.d2t.device))

    def new_cache(self) -> KVCache:
        return KVCache()

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """Fused target features [.., 3H] -> [.., H]; the head's own outputs [.., H] pass through."""
        return self.fc(hidden) if hidden.shape[-1] == self.fc.in_features else hidden

    def step_inputs(self, tokens, hidden, positions):
        """(residual hidden [B, S, H], q, k, v) for one forward."""
        hidden = self.fuse(hidden)
        cos, sin = self.rotary(hidden, positions)
        q, k, v = self.midlayer.project(self.embed(tokens).to(hidden.dtype), hidden, cos, sin)
        return hidden, q, k, v

    def forward(self, tokens, hidden, positions, cache: KVCache | None = None, mask=None) -> torch.Tensor:
        hidden, q, k, v = self.step_inputs(tokens, hidden, positions)
        if cache is not None:
            k, v = cache.append(k, v)
        elif mask is None:
            s = tokens.shape[1]
            mask = torch.full((s, s), float("-inf"), dtype=hidden.dtype, device=hidden.device).triu(1)[None, None]
        return self.midlayer.finish(hidden, q, k, v, mask)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))

    def feature_widths(self) -> tuple[int, ...]:
        """The widths of the features drafting feeds: the fused target features [3H], then the head's outputs."""
        return (self.fc.in_features, self.cfg["hidden_size"])

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = {k: v for k, v in self.cfg.items() if k != "layer_ids"}
        cfg |= {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids)},
        }
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {
            k: (v if v.dtype in (torch.bool, torch.long) else v.detach().to(torch.bfloat16)).contiguous().cpu()
            for k, v in self.state_dict().items()
        }
        save_file(state, str(folder / WEIGHTS_SAFE))


def _config(raw: dict, target: nn.Module, state: dict, where: str) -> dict:
    """The head's config from a published config.json, filling what published heads leave out from the target; every
    field is checked for type and range (a GlanceError names it)."""
    c = target.config
    h = whole(raw.get("hidden_size", c.hidden_size), "hidden_size", where)
    heads = whole(raw.get("num_attention_heads", c.num_attention_heads), "num_attention_heads", where, 1, h)
    nested = raw.get("eagle_config") or {}
    if not isinstance(nested, dict):
        raise GlanceError(f"{where}: eagle_config is {type(nested).__name__}, not an object")
    n = c.num_hidden_layers
    layer_ids = nested.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
    if layer_ids is not None:
        layer_ids = whole_list(layer_ids, "eagle_aux_hidden_state_layer_ids", where, 3, 0, n - 1)
    lm = state.get("lm_head.weight")
    vocab = target.get_output_embeddings().weight.shape[0]
    draft_vocab = raw.get("draft_vocab_size") or (lm.shape[0] if lm is not None else None)
    rope_theta = raw.get("rope_theta") or getattr(c, "rope_theta", None) or 10000.0
    return {
        "hidden_size": h,
        "intermediate_size": whole(
            raw.get("intermediate_size", getattr(c, "intermediate_size", 4 * h)), "intermediate_size", where
        ),
        "num_attention_heads": heads,
        "num_key_value_heads": whole(raw.get("num_key_value_heads") or heads, "num_key_value_heads", where, 1, heads),
        "head_dim": whole(raw.get("head_dim") or h // heads, "head_dim", where),
        "rope_theta": number(rope_theta, "rope_theta", where),
        "rope_scaling": raw.get("rope_scaling"),
        "rms_norm_eps": number(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps", where),
        "max_position_embeddings": whole(raw.get("max_position_embeddings", 4096), "max_position_embeddings", where),
        "vocab_size": vocab,
        "draft_vocab_size": None if draft_vocab is None else whole(draft_vocab, "draft_vocab_size", where, 1, vocab),
        "layer_ids": list(layer_ids or default_feature_layers(n)),
    } | (
        {"target_hidden_size": whole(raw["target_hidden_size"], "target_hidden_size", where)}
        if raw.get("target_hidden_size")
        else {}
    )


def load_eagle3_head(folder: str | Path, target: nn.Module) -> Eagle3Head:
    """Load a head in the published EAGLE-3 layout, checking every shape against the target; a mismatch names
    the key."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"EAGLE-3 head folder not found: {folder}")
    raw = read_json_object(folder / "config.json", "an EAGLE-3 head's config")
    state = read_state(folder)
    for key in ("fc.weight", "d2t", "lm_head.weight"):
        if key not in state:
            hint = (
                " (an EAGLE-1/2 head? pick it under EAGLE instead)"
                if "layers.0.self_attn.q_proj.weight" in state
                else ""
            )
            raise GlanceError(f"{folder}: no key {key}: not the EAGLE-3 layout{hint}")
    with config_errors(folder, "EAGLE-3 layer", "hidden_size, intermediate_size and num_attention_heads"):
        cfg = _config(raw, target, state, f"{folder}/config.json")
    hidden = target.get_input_embeddings().weight.shape[1]
    want_fc = (cfg["hidden_size"], 3 * cfg.get("target_hidden_size", hidden))
    if tuple(state["fc.weight"].shape) != want_fc:
        raise GlanceError(
            f"{folder}: fc.weight is {list(state['fc.weight'].shape)}, the target needs {list(want_fc)} "
            f"(hidden size {hidden} x 3 layers): this head was trained for another model"
        )
    if cfg["hidden_size"] != hidden:
        raise GlanceError(f"{folder}: the head's hidden size {cfg['hidden_size']} differs from the target's {hidden}")
    n = target.config.num_hidden_layers
    if any(not 0 <= i < n for i in cfg["layer_ids"]):
        raise GlanceError(f"{folder}: feature layers {cfg['layer_ids']} do not exist in a {n}-layer target")
    state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
    state.setdefault("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))
    with config_errors(folder, "EAGLE-3 layer", "hidden_size, intermediate_size and num_attention_heads"):
        head = Eagle3Head(cfg, target)
    own = head.state_dict()
    for key, value in state.items():
        if key in own and tuple(own[key].shape) != tuple(value.shape):
            raise GlanceError(
                f"{folder}: {key} is {list(value.shape)}, a head of this config needs {list(own[key].shape)}"
            )
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise GlanceError(
            f"{folder}: the checkpoint does not fit an EAGLE-3 layer (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    top = int(head.target_ids().max()) if len(head.d2t) else 0
    if top >= cfg["vocab_size"] or int(head.target_ids().min()) < 0:
        raise GlanceError(f"{folder}: d2t maps draft ids outside the target's {cfg['vocab_size']} tokens")
    head.t2d.zero_()
    head.t2d[head.target_ids()] = True  # rebuilt from d2t, so a stale or absent t2d cannot disagree
    p = next(target.parameters())
    return head.to(device=p.device, dtype=p.dtype).eval()
