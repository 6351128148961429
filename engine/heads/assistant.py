"""Gemma 4's assistant (transformers' `Gemma4AssistantForCausalLM`, Google's `gemma-4-*-assistant` folders): a few
decoder layers that draft from the target's own keys and values.

Input for the token after the pending one: [embed(pending token) ; the target's last hidden state h] [2 Hb]
(`pre_projection` to the assistant's width). Its layers have no keys or values of their own: every layer attends to
the target's cached entries of the last full-attention layer and the last sliding layer that store them
(`kv_sharing_modes` "store"), at the pending token's position. Its output gives the drafted token (its LM head,
optionally through a centroid-clustered read-out) and, through `post_projection`, the hidden state that stands in for
h at the next depth; the position stays the same while a chain grows, so the context never holds a drafted token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.errors import GlanceError, reason
from engine.inputs import read_json_object
from engine.runtime.layer_features import decoder_layers

MODEL_TYPE = "gemma4_assistant"
KINDS = ("full_attention", "sliding_attention")  # the cache kinds a Gemma 4 target stores for its assistant


def stored_layers(config) -> dict[str, int]:
    """The target layers whose keys and values an assistant reads, per attention kind: the last layer of each kind
    before Gemma 4's KV-shared layers (`kv_sharing_modes` "store"). {} for a target without them."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        modes, kinds = list(text.kv_sharing_modes), list(text.layer_types)
    except (AttributeError, TypeError, ValueError):
        return {}
    return {kind: i for i, (kind, mode) in enumerate(zip(kinds, modes)) if mode == "store"}


class AssistantHead(nn.Module):
    """step(tokens [n], hidden [n, Hb], positions [n], context, mask) -> (logits [n, V], next hidden [n, Hb])."""

    def __init__(self, model: nn.Module, target: nn.Module) -> None:
        super().__init__()
        self.model = model  # Gemma4AssistantForCausalLM
        self.__dict__["target"] = target  # not a submodule: its embedding stays out of the state dict
        store = stored_layers(target.config)
        self.kinds = tuple(k for k in KINDS if k in store)
        self.context_layers = tuple(store[k] for k in self.kinds)  # target cache layers read, in `kinds` order
        self.cfg = {
            "layers": model.config.get_text_config().num_hidden_layers,
            "hidden_size": model.config.get_text_config().hidden_size,
            "backbone_hidden_size": model.config.backbone_hidden_size,
            "centroids": model.config.num_centroids if model.config.use_ordered_embeddings else None,
            "target_layers": dict(zip(self.kinds, self.context_layers)),
        }

    def step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft token per row. context: per kind (keys, values) [n, h, L, d] of the target's committed
        positions; mask: additive [n, 1, 1, L] hiding padded entries (None: every row sees all L)."""
        m = self.model
        emb = self.target.get_input_embeddings()(tokens[:, None]).to(hidden.dtype)  # [n, 1, Hb], scaled as Gemma's
        x = m.pre_projection(torch.cat([emb, hidden[:, None]], dim=-1))  # [n, 1, H]
        shared = dict(zip(self.kinds, context))
        out = m.model(
            inputs_embeds=x,
            attention_mask={k: mask for k in KINDS},
            position_ids=positions[:, None],
            shared_kv_states=shared,
            use_cache=False,
        )
        h = out.last_hidden_state  # [n, 1, H]
        logits = m.masked_embedding(h, m.lm_head.weight) if m.masked_embedding is not None else m.lm_head(h)
        return logits[:, 0], m.post_projection(h)[:, 0]


def load_assistant_head(folder: str | Path, target: nn.Module) -> AssistantHead:
    """A Gemma 4 assistant folder (config.json of model_type gemma4_assistant, safetensors weights) for `target`.
    One GlanceError names what does not fit: another target width or vocabulary, a target that stores no
    keys and values for it, missing or non-finite weights, a damaged token ordering."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"assistant folder not found: {folder}")
    raw = read_json_object(folder / "config.json", "an assistant's config")
    if raw.get("model_type") != MODEL_TYPE:
        raise GlanceError(
            f"{folder}: not a Gemma 4 assistant (config.json model_type is {raw.get('model_type')!r}, expected "
            f"'{MODEL_TYPE}')"
        )
    store = stored_layers(target.config)
    if not store:
        raise GlanceError(
            f"a Gemma 4 assistant drafts from a Gemma 4 target's stored keys and values; {type(target).__name__} "
            "stores none (its config has no kv_sharing_modes)"
        )
    width = target.get_input_embeddings().weight.shape[1]
    if raw.get("backbone_hidden_size") != width:
        raise GlanceError(
            f"{folder}: an assistant for a target of width {raw.get('backbone_hidden_size')}; this target's is {width}"
        )
    from transformers import Gemma4AssistantForCausalLM

    p = next(target.parameters())
    try:
        model, info = Gemma4AssistantForCausalLM.from_pretrained(
            folder, dtype=p.dtype, use_safetensors=True, output_loading_info=True, local_files_only=True
        )
    except Exception as exc:  # transformers' own loader: config fields, shapes, a missing weights file
        raise GlanceError(f"{folder}: cannot load the assistant ({reason(exc, 200)})") from None
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]  # tied to its embedding
    if missing or info.get("mismatched_keys"):
        raise GlanceError(
            f"{folder}: the assistant's weights are incomplete (missing {sorted(missing)[:3]}, "
            f"mismatched {list(info.get('mismatched_keys') or [])[:3]})"
        )
    _check_fits(folder, model, target, store)
    head = AssistantHead(model.to(p.device).eval(), target)
    _dry_run(folder, head, target)
    return head


def _check_fits(folder: Path, model: nn.Module, target: nn.Module, store: dict[str, int]) -> None:
    cfg, text = model.config, model.config.get_text_config()
    vocab = target.get_output_embeddings().weight.shape[0]
    if text.vocab_size != vocab:
        raise GlanceError(f"{folder}: the assistant reads out {text.vocab_size} tokens, the target {vocab}")
    missing = sorted(set(text.layer_types) - set(store))
    if missing:
        raise GlanceError(f"{folder}: the assistant attends to {missing} keys the target does not store")
    for name, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise GlanceError(f"{folder}: {name} holds NaN or infinite weights: a damaged assistant")
    if model.masked_embedding is not None:
        order = model.masked_embedding.token_ordering
        if (
            cfg.num_centroids < 1
            or text.vocab_size % cfg.num_centroids
            or not 1 <= cfg.centroid_intermediate_top_k <= cfg.num_centroids
        ):
            raise GlanceError(
                f"{folder}: {cfg.num_centroids} centroids (top {cfg.centroid_intermediate_top_k}) do "
                f"not split a vocabulary of {text.vocab_size}"
            )
        if not torch.equal(order.long().sort().values, torch.arange(text.vocab_size, device=order.device)):
            raise GlanceError(f"{folder}: token_ordering is not an ordering of the vocabulary: a damaged assistant")


def _dry_run(folder: Path, head: AssistantHead, target: nn.Module) -> None:
    """One draft step over a context shaped as the target's stored keys: heads or widths that do not fit fail here,
    with a line, rather than in the middle of a race."""
    text = target.config.get_text_config()
    p = next(target.parameters())
    context = []
    layers = decoder_layers(target)
    for layer in head.context_layers:
        attn = layers[layer].self_attn
        kv_heads = attn.k_proj.out_features // attn.head_dim
        k = torch.zeros(1, kv_heads, 3, attn.head_dim, dtype=p.dtype, device=p.device)
        context.append((k, k))
    try:
        with torch.no_grad():
            logits, nxt = head.step(
                torch.zeros(1, dtype=torch.long, device=p.device),
                torch.zeros(1, text.hidden_size, dtype=p.dtype, device=p.device),
                torch.tensor([3], device=p.device),
                context,
            )
    except Exception as exc:
        raise GlanceError(
            f"{folder}: the assistant does not fit this target's keys and values ({reason(exc, 160)})"
        ) from None
    if tuple(logits.shape) != (1, text.vocab_size) or tuple(nxt.shape) != (1, text.hidden_size):
        raise GlanceError(f"{folder}: the assistant's outputs {list(logits.shape)}, {list(nxt.shape)} do not fit")
