"""Multi-token-prediction layers (DeepSeek-V3's MTP modules; GLM-4.5's and MiMo's NextN layers): one decoder layer
of the target's own kind that drafts the token after next from the target's last hidden state.

Input at position i is (token x_{i+1}, hidden h_i): `eh_proj` maps [enorm(embed(x_{i+1})) ; hnorm(h_i)] [2H] to H,
a decoder layer of the target's class turns it into h'_{i+1}, `post_norm` normalises it, and the target's LM head
reads the drafted token from it; h' feeds the next depth, as vLLM chains one shipped layer for K drafts. The
embedding and LM head are the target's. The pairs and the chaining are EAGLE's (engine/drafters/eagle.py): only
the layer differs.

Two sources. *Native*: a target whose config declares MTP layers (`num_mtp_layers`, DeepSeek's
`num_nextn_predict_layers`) ships them in its own checkpoint; transformers' `MtpModel.from_pretrained` reads them
with each family's key names. *Trained here* (`python main.py train mtp`): a folder with `config.json`
(`"architectures": ["GlanceMtpLayers"]`, `num_mtp_layers`) and `model.safetensors` keyed as transformers'
`MtpModel` keys its layers: `layers.0.{enorm, hnorm, eh_proj, mtp_block.*, post_norm}`; an optional
`draft_vocab.safetensors` narrows the read-out as for EAGLE's heads. Glance drafts with the first layer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from engine.errors import GlanceError, reason
from engine.heads.checkpoint import read_tensors
from engine.heads.draft_vocab import check_draft_ids, read_draft_vocab, rows_of, save_draft_vocab
from engine.inputs import read_json_object, whole
from engine.runtime.layer_features import decoder_layers

LAYOUT = "GlanceMtpLayers"
WEIGHTS = "model.safetensors"
DECLARES = ("num_mtp_layers", "num_nextn_predict_layers", "mtp_num_hidden_layers")  # what configs call them


def declared_layers(config) -> int:
    """How many MTP layers a target's config says its checkpoint ships (0: none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in DECLARES:
        n = getattr(text, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return 0


def declares_mtp(source: str) -> bool:
    """Whether the local model folder `source` declares MTP layers in its config.json (read with the boundary's
    limits; a hub id or an unreadable folder: no)."""
    path = Path(source) / "config.json"
    if not path.is_file():
        return False
    try:
        raw = read_json_object(path, "a model's config")
    except GlanceError:
        return False
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    return any(isinstance(text.get(n), int) and text.get(n) > 0 for n in DECLARES)


def _layer_config(target: nn.Module):
    """The target's text config for one decoder layer at index 0 (the MTP layer's own index), with the MTP layer's
    kind where the config names one."""
    c = copy.deepcopy(target.config.get_text_config())
    kinds = getattr(c, "mtp_layer_types", None)
    if getattr(c, "layer_types", None) is not None:
        c.layer_types = list(kinds) if kinds else [c.layer_types[-1]]
    c.num_hidden_layers = 1
    return c


class MtpHead(nn.Module):
    """forward(tokens [B, S], hidden [B, S, H], positions [B, S], cache, mask) -> h' [B, S, H] (post-normed); the
    EAGLE head's interface, so EAGLE's drafting loop, batching and compile serve it."""

    def __init__(self, target: nn.Module, layers: nn.ModuleList | None = None, count: int = 1) -> None:
        super().__init__()
        try:
            self._build(target, layers, count)
            self._dry_run()
        except GlanceError:
            raise
        except Exception as exc:  # a layer kind transformers' MtpLayer cannot wrap, or whose forward needs more
            raise GlanceError(
                f"cannot build MTP layers around {type(target).__name__}'s decoder layers ({reason(exc, 160)})"
            ) from None

    def _build(self, target: nn.Module, layers: nn.ModuleList | None, count: int) -> None:
        from transformers.modeling_layers import MtpLayer

        self.layer_config = _layer_config(target)
        last = decoder_layers(target)[-1]
        rotary = getattr(getattr(target, "base_model", target), "rotary_emb", None)
        norms = [type(m) for name, m in last.named_modules() if "norm" in name]
        if rotary is None or not norms:
            raise GlanceError(
                f"MTP layers are decoder layers of the target's kind with rotary positions and RMS norms "
                f"(Llama, Qwen, Mistral, DeepSeek, GLM); {type(target).__name__}'s layers are not"
            )
        if layers is None:
            layers = nn.ModuleList(MtpLayer(self.layer_config, type(last), norms[0], k) for k in range(count))
        self.layers = layers
        self.cfg = {"num_mtp_layers": len(layers), "hidden_size": self.layer_config.hidden_size}
        self.__dict__["target"] = target  # not a submodule: its embeddings and LM head stay out of the state dict
        self.__dict__["rotary"] = rotary
        self.readout: nn.Linear | None = None
        self.register_buffer("draft_ids", None, persistent=False)

    @torch.no_grad()
    def _dry_run(self) -> None:
        """One position through the first layer: a target whose layers need more than MtpLayer gives (a per-kind
        rotary, say) fails here, at load, rather than in a race."""
        p = next(self.layers.parameters())
        zeros = torch.zeros(1, 1, self.cfg["hidden_size"], dtype=p.dtype, device=p.device)
        ids = torch.zeros(1, 1, dtype=torch.long, device=p.device)
        self.forward(ids, zeros, ids)

    @property
    def embed(self) -> nn.Module:
        return self.target.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.target.get_output_embeddings()  # as it is now (compiling packs it), like EAGLE's head

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.layer_config)

    def forward(self, tokens, features, position_ids, cache=None, attention_mask=None) -> torch.Tensor:
        x = self.embed(tokens).to(features.dtype)  # [B, S, H]
        pos = self.rotary(x, position_ids)
        return self.layers[0](
            x, features, position_embeddings=pos, attention_mask=attention_mask, position_ids=position_ids,
            cache=cache, use_cache=cache is not None,
        )  # fmt: skip

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Read out only the target ids `ids` (sorted); None: the whole vocabulary (EagleHead.set_draft_vocab)."""
        if ids is None:
            self.readout, self.draft_ids = None, None
            return
        p = next(self.layers.parameters())
        ids = check_draft_ids(ids, self.lm_head.weight.shape[0])
        self.readout = rows_of(self.lm_head, ids, p)
        self.draft_ids = ids.to(p.device)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(out) if self.readout is None else self.readout(out)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.draft_ids is None else self.draft_ids[ids]

    def feature_widths(self) -> tuple[int, ...]:
        return (self.cfg["hidden_size"],)

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = {"architectures": [LAYOUT], "num_mtp_layers": len(self.layers), "hidden_size": self.cfg["hidden_size"],
               "layer_class": type(self.layers[0].mtp_block).__name__}  # fmt: skip
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {
            k: v.detach().to(torch.bfloat16).contiguous().cpu()
            for k, v in self.state_dict().items()
            if not k.startswith("readout.")
        }
        save_file(state, str(folder / WEIGHTS))
        save_draft_vocab(folder, self.draft_ids)


def load_mtp_head(folder: str | Path, target: nn.Module) -> MtpHead:
    """MTP layers for the target: a folder trained here (GlanceMtpLayers), or the target's own folder when its config
    declares MTP layers (read by transformers from its checkpoint). One GlanceError names what does not fit."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"MTP folder not found: {folder}")
    raw = read_json_object(folder / "config.json", "an MTP folder's config")
    arch = raw.get("architectures")
    if isinstance(arch, list) and LAYOUT in arch:
        head = _load_trained(folder, raw, target)
    elif declared_layers(target.config):
        head = _load_native(target)
    else:
        raise GlanceError(
            f'{folder}: neither MTP layers trained here (config.json architectures ["{LAYOUT}"]) nor a target '
            "whose config declares MTP layers (num_mtp_layers, num_nextn_predict_layers): train one with "
            "`python main.py train mtp`"
        )
    p = next(target.parameters())
    head = head.to(device=p.device, dtype=p.dtype).eval()
    for name, value in head.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise GlanceError(f"{folder}: {name} holds NaN or infinite weights: damaged MTP layers")
    head.set_draft_vocab(read_draft_vocab(folder, target.get_output_embeddings().weight.shape[0]))
    return head


def _load_trained(folder: Path, raw: dict, target: nn.Module) -> MtpHead:
    where = f"{folder}/config.json"
    count = whole(raw.get("num_mtp_layers"), "num_mtp_layers", where, 1, 16)
    hidden = target.get_input_embeddings().weight.shape[1]
    if raw.get("hidden_size", hidden) != hidden:
        raise GlanceError(f"{folder}: MTP layers of width {raw.get('hidden_size')}, the target's is {hidden}")
    state = read_tensors(folder, WEIGHTS, "pytorch_model.bin")
    try:
        head = MtpHead(target, count=count)
    except GlanceError:
        raise
    except Exception as exc:  # a target whose layer class cannot be rebuilt from its config
        raise GlanceError(f"cannot build MTP layers for {type(target).__name__} ({reason(exc, 160)})") from None
    own = head.state_dict()
    for key, value in state.items():
        if key in own and tuple(own[key].shape) != tuple(value.shape):
            raise GlanceError(f"{folder}: {key} is {list(value.shape)}, this target's MTP layer needs "
                              f"{list(own[key].shape)}: trained for another model?")  # fmt: skip
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise GlanceError(
            f"{folder}: the weights do not fit {count} MTP layer(s) of {type(target).__name__} (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})"
        )
    head.load_state_dict(state)
    return head


def _load_native(target: nn.Module) -> MtpHead:
    from transformers.modeling_layers import MtpModel

    try:
        native = MtpModel.from_pretrained(target)
    except Exception as exc:  # transformers' own loader: missing keys, a family it has no MTP mapping for
        raise GlanceError(f"the target's own MTP layers could not be read ({reason(exc, 200)})") from None
    return MtpHead(target, layers=native.layers)
