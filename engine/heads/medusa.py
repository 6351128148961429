"""Medusa heads (Cai et al. 2024): K heads on the target's last hidden state; head k predicts the token k + 2
positions ahead of that state (the target's own LM head predicts k + 1).

Each head is `num_layers` residual blocks x + SiLU(W x + b) (W zero-initialised, every block its own weights)
followed by a vocabulary projection initialised from the target's LM head. The module is a ModuleList of
Sequentials, so its state-dict keys are the published FasterDecoding layout: `{h}.{l}.linear.weight|bias` and
`{h}.{L}.weight`.

Checkpoint folder: `config.json` (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`, plus
`hidden_size` and `vocab_size`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt` (loaded with
weights_only=True). Glance also reads and writes a compact variant, `"shared_lm_head": true`, whose heads reuse
the target's frozen LM head instead of storing one projection per head (how the bundled heads stay small).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from engine.errors import GlanceError
from engine.heads.checkpoint import config_errors, read_tensors
from engine.heads.draft_vocab import check_draft_ids, read_draft_vocab, rows_of, save_draft_vocab
from engine.inputs import read_json_object

WEIGHTS_SAFE = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # starts as the identity: the head begins as the target's LM head
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """forward(hidden [..., H]) -> logits [K, ..., V]."""

    def __init__(
        self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1, shares_with=None, base_model: str = ""
    ) -> None:
        """`shares_with`: the target whose LM head every head projects through (None: each head has its own)."""
        self.hidden, self.vocab = hidden, vocab
        self.num_heads, self.num_layers = num_heads, num_layers
        self.base_model = base_model
        shared = shares_with is not None
        heads = []
        for _ in range(num_heads):
            blocks: list[nn.Module] = [ResBlock(hidden) for _ in range(num_layers)]
            if not shared:
                blocks.append(nn.Linear(hidden, vocab, bias=False))
            heads.append(nn.Sequential(*blocks))
        super().__init__(heads)
        # kept out of the state dict: the LM head is the target's, frozen
        self.__dict__["shares_with"] = shares_with
        # The draft vocabulary (set_draft_vocab): its rows of the shared LM head (one nn.Linear) or of each head's own
        # projection (one per head), kept out of the list (iterating it yields the heads) and out of the state dict
        # (the rows are the LM head's); and the target ids they stand for (a buffer, saved in its own file).
        self.__dict__["readouts"] = None
        self.register_buffer("draft_ids", None, persistent=False)

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Read candidates from the target ids `ids` only (sorted, unique, inside the vocabulary), None: the whole
        vocabulary. Output is unchanged: the target verifies every draft; the read-out reads len(ids) rows."""
        if ids is None:
            self.__dict__["readouts"] = self.draft_ids = None
            return
        ids = check_draft_ids(ids, self.vocab)
        p = next(self.parameters())
        lm = self.shared_lm_head
        sources = [lm] if lm is not None else [head[-1] for head in self]
        self.__dict__["readouts"] = [rows_of(src, ids, p) for src in sources]
        self.draft_ids = ids.to(p.device)

    def _apply(self, fn, recurse=True):  # .to() / .half(): the draft vocabulary's rows follow the heads
        out = super()._apply(fn, recurse)
        if self.readouts is not None:
            self.__dict__["readouts"] = [r._apply(fn, recurse) for r in self.readouts]
        return out

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids of the heads' output ids (the same ids without a draft vocabulary)."""
        return ids if self.draft_ids is None else self.draft_ids[ids]

    def _states(self, hidden: torch.Tensor, heads) -> list[torch.Tensor]:
        """Each head's state before its vocabulary projection [..., H] (own projections: all but the last layer)."""
        if self.shared_lm_head is not None:
            return [head(hidden) for head in heads]
        return [head[:-1](hidden) for head in heads]

    @property
    def shared_lm_head(self) -> nn.Module | None:
        """The target's LM head as it is now (compiling packs it, engine/runtime/packed.py: one copy in the cache, not
        two)."""
        return None if self.shares_with is None else self.shares_with.get_output_embeddings()

    @classmethod
    def for_target(
        cls, target: nn.Module, num_heads: int, num_layers: int = 1, shared_lm_head: bool = False, base_model: str = ""
    ) -> MedusaHeads:
        lm_head = target.get_output_embeddings()
        vocab, hidden = lm_head.weight.shape
        heads = cls(hidden, vocab, num_heads, num_layers, target if shared_lm_head else None, base_model)
        if not shared_lm_head:
            with torch.no_grad():
                for head in heads:
                    head[-1].weight.copy_(lm_head.weight)
        p = next(target.parameters())
        return heads.to(device=p.device, dtype=p.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        lm_head = self.shared_lm_head
        if self.readouts is not None:  # [K, ..., draft_vocab]
            states = self._states(hidden, self)
            if lm_head is not None:
                return self.readouts[0](torch.stack(states))
            return torch.stack([ro(x) for ro, x in zip(self.readouts, states)])
        if lm_head is None:
            return torch.stack([head(hidden) for head in self])
        # one projection over every head's state: the LM head's weights are read once, not once per head
        # (bundled heads on a CPU: 1.0 ms per proposal instead of 2.9; the logits are bit-identical)
        return lm_head(torch.stack([head(hidden) for head in self]))  # [K, ..., H] -> [K, ..., V]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[K, ..., V] (V: the draft vocabulary's size where set): every head's logits (what engine/heads/readout.py
        reads candidates from; `to_target` maps their ids)."""
        return self(hidden)

    def first_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V]: head 0's logits alone (the depth-1 guesses a draft budget checks in hindsight)."""
        if self.readouts is not None:
            return self.readouts[0](self._states(hidden, [self[0]])[0])
        lm_head = self.shared_lm_head
        return self[0](hidden) if lm_head is None else lm_head(self[0](hidden))

    def config(self) -> dict:
        return {
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            "base_model_name_or_path": self.base_model,
            "hidden_size": self.hidden,
            "vocab_size": self.vocab,
            "shared_lm_head": self.shared_lm_head is not None,
        }

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config(), indent=2))
        state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_SAFE))
        save_draft_vocab(folder, self.draft_ids)


def load_medusa_heads(folder: str | Path, target: nn.Module) -> MedusaHeads:
    """Load heads from a published-format folder, checking every shape against the target."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GlanceError(f"Medusa heads folder not found: {folder}")
    cfg = read_json_object(folder / "config.json", "a Medusa heads config")
    if "medusa_num_heads" not in cfg:
        raise GlanceError(f"{folder}/config.json has no medusa_num_heads: not a Medusa heads folder")
    state = read_tensors(folder, WEIGHTS_SAFE, WEIGHTS_PT)
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    try:
        k, layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    except (TypeError, ValueError):
        raise GlanceError(
            f"{folder}/config.json: medusa_num_heads and medusa_num_layers must be whole numbers "
            f"(got {cfg.get('medusa_num_heads')!r} and {cfg.get('medusa_num_layers', 1)!r})"
        ) from None
    if not (1 <= k <= 64 and 1 <= layers <= 64):
        raise GlanceError(f"{folder}/config.json: {k} heads x {layers} layers is not a Medusa configuration")
    shared = bool(cfg.get("shared_lm_head", False))
    block = state.get("0.0.linear.weight")
    if block is None:
        raise GlanceError(f"{folder}: no key 0.0.linear.weight: not the Medusa key layout")
    if block.dim() != 2:
        raise GlanceError(f"{folder}: 0.0.linear.weight is {list(block.shape)}, not a matrix: a damaged file")
    if block.shape[1] != hidden:
        raise GlanceError(
            f"{folder}: Medusa heads expect hidden size {block.shape[1]}, the target has {hidden}: "
            "these heads were trained for another model"
        )
    if not shared:
        proj = state.get(f"0.{layers}.weight")
        if proj is None:
            raise GlanceError(f"{folder}: no key 0.{layers}.weight for the heads' vocabulary projection")
        if proj.dim() != 2 or proj.shape[0] != vocab:
            raise GlanceError(
                f"Medusa heads predict {proj.shape[0]} tokens, the target's vocabulary has {vocab}: "
                "these heads were trained for another model"
            )
    with config_errors(folder, "Medusa heads", "medusa_num_heads"):
        base = cfg.get("base_model_name_or_path", "")
        heads = MedusaHeads(hidden, vocab, k, layers, target if shared else None, base)
        missing, unexpected = heads.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise GlanceError(
            f"{folder}: the checkpoint does not fit {k} heads x {layers} layers "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    p = next(target.parameters())
    heads = heads.to(device=p.device, dtype=p.dtype).eval()
    heads.set_draft_vocab(read_draft_vocab(folder, vocab))
    return heads
