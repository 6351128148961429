"""DFlash drafting (Chen, Liang, Liu 2026): one draft forward fills a whole block, [pending token, mask, ...], from
the target's hidden states at several layers (engine/heads/dflash.py), and the block is verified as a chain.

Each row keeps its own context, per draft layer the keys and values of every committed position's target features;
a step first projects the positions committed since the last draft (the prompt's, or what the last verification
kept), then runs the block. The block's drafts do not depend on one another, so a token drafted at depth i is a
deterministic function of the context (greedy) or sampled from its own distribution q_i (Leviathan's rule stays
exact for any q). The budget caps the depth: the block runs whole (its cost hardly depends on its size), and only
its first `max_tokens` drafts are read out and verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.decoding.sampling import logits_to_probs, sample
from engine.decoding.tree import Draft, additive_mask
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BuildContext, DrafterSpec, PartSpec, knob
from engine.errors import GlanceError
from engine.heads.compiled_block import compile_block
from engine.heads.dflash import MAX_BLOCK, DFlashHead, load_dflash_head
from engine.models.loading import BUNDLED


class DFlashDrafter(Drafter):
    """Blocks for every row of a run: the context projections per row, then one block forward for all rows."""

    name = "dflash"

    def __init__(self, head: DFlashHead, block_size: int | None = None, target_vocab: int | None = None) -> None:
        block = head.block_size if block_size is None else block_size
        if not 2 <= block <= head.block_size:
            raise GlanceError(f"the DFlash block must hold 2 to {head.block_size} tokens (got {block})")
        self.head = head
        self.block = block  # tokens the block forward fills, the pending one included: block - 1 drafts
        self.feature_layers = head.feature_layers
        self.target_vocab = target_vocab or head.cfg["vocab_size"]
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.ctx: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = [None] * rows  # per row, per layer (k, v)
        self.length = [0] * rows  # per row: context positions projected
        self.pending: list[list] = [[] for _ in range(rows)]  # per row: (feature tensors, rows to read) waiting

    def begin(self, row: int, state: DecodeState) -> None:
        self.ctx[row], self.length[row] = None, 0
        self.pending[row] = [(list(state.target_out.layer_features), None)]  # every prompt position

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        # the rows of the verification whose tokens the target's cache now holds (the pending one and the accepted)
        self.pending[row].append((list(state.target_out.layer_features), list(state.rows)))

    def check_context(self, positions: int) -> None:
        longest = self.head.cfg["max_position_embeddings"]
        if positions + self.block > longest:
            raise GlanceError(
                f"the DFlash draft takes {longest} positions; a run of {positions} tokens and a block of "
                f"{self.block} needs {positions + self.block}"
            )

    def _absorb(self, b: int) -> None:
        """Project row b's waiting positions into its context."""
        chunks, self.pending[b] = self.pending[b], []
        if not chunks:
            return
        pieces = []
        for parts, rows in chunks:
            f = torch.cat([p[0] for p in parts], dim=-1) if len(parts) > 1 else parts[0][0]  # [S, kH]
            pieces.append(f if rows is None else f[rows])
        feats = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # [n, kH]
        n = feats.shape[0]
        positions = torch.arange(self.length[b], self.length[b] + n, device=self.device)[None]
        new = self.head.context(feats[None].to(self.device), positions)
        old = self.ctx[b]
        self.ctx[b] = new if old is None else [
            (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2)) for (k0, v0), (k1, v1) in zip(old, new)
        ]  # fmt: skip
        self.length[b] += n

    def _batch_context(self, live: list[int]):
        """Per layer the live rows' (keys, values) [n, nkv, L, d], right-padded to the longest, and the additive
        mask [n, 1, S, L + S] that hides the padding (None when no row is padded)."""
        longest = max(self.length[b] for b in live)
        if len(live) == 1:
            return self.ctx[live[0]], None
        layers = []
        for i in range(len(self.head.layers)):
            ks, vs = [], []
            for b in live:
                k, v = self.ctx[b][i]
                pad = longest - k.shape[2]
                ks.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
                vs.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
            layers.append((torch.cat(ks), torch.cat(vs)))
        visible = torch.ones(len(live), self.block, longest + self.block, dtype=torch.bool)
        for r, b in enumerate(live):
            visible[r, :, self.length[b] : longest] = False
        return layers, additive_mask(visible, self.dtype, self.device)

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        drafts = [Draft() for _ in states]
        live = [b for b, s in enumerate(states) if s is not None and max_tokens[b] >= 1]
        if not live:
            return drafts
        for b in live:
            self._absorb(b)
            if self.length[b] != len(states[b].tokens) - 1:  # the loop's contract, checked: a silent shift drafts junk
                raise RuntimeError(f"DFlash context of row {b} holds {self.length[b]} positions, expected "
                                   f"{len(states[b].tokens) - 1}")  # fmt: skip
        S = self.block
        ids = torch.full((len(live), S), self.head.mask_token_id, dtype=torch.long)
        ids[:, 0] = torch.tensor([states[b].tokens[-1] for b in live])
        positions = torch.tensor([[self.length[b] + j for j in range(S)] for b in live])
        ctx, mask = self._batch_context(live)
        want = [min(S - 1, max_tokens[b]) for b in live]
        ids, positions = ids.to(self.device), positions.to(self.device)
        compiled = self.head.__dict__.get("compiled")  # engine/heads/compiled_block.py, when the session compiled it
        if compiled is not None:
            logits, best = compiled(ids, positions, ctx, mask)  # every drafted position: one graph for every cap
        else:
            out = self.head.block(ids, positions, ctx, mask)  # [n, S, H]
            logits = self.head.logits(out[:, 1 : 1 + max(want)])  # [n, m, V or Vd]
            best = logits.argmax(-1)  # [n, m]
        ids_of = self.head.draft_ids
        best = (best if ids_of is None else ids_of.to(best.device)[best]).tolist()
        for r, b in enumerate(live):
            s, m = states[b], want[r]
            if s.sampling.greedy:
                drafts[b] = self.finish(Draft.chain(best[r][:m]))
                continue
            qs = self._full(logits_to_probs(logits[r, :m], s.sampling))  # [m, V]
            if not bool(torch.isfinite(qs).all()):  # a broken draft (NaN weights) proposes nothing
                continue
            tokens = [sample(q, s.generator) for q in qs]
            drafts[b] = self.finish(Draft.chain(tokens, qs))
        return drafts

    def _full(self, probs: torch.Tensor) -> torch.Tensor:
        """[m, Vd or V] -> [m, V]: the draft distribution over the target's vocabulary (zero outside Vd)."""
        ids = self.head.draft_ids
        if ids is None:
            return probs[:, : self.target_vocab]
        full = probs.new_zeros(probs.shape[0], self.target_vocab)
        return full.index_copy_(1, ids.to(probs.device), probs)

    def finish(self, draft: Draft) -> Draft:
        draft.notes.block_size = self.block
        return draft

    def settings(self) -> dict:
        ids = self.head.draft_ids
        return {
            "block_size": self.block,
            "draft_layers": len(self.head.layers),
            "target_layer_ids": list(self.head.target_layer_ids),
            "draft_vocab": len(ids) if ids is not None else "full",
        }


@dataclass
class DFlashOptions:
    block: int = knob(0, "tokens per block, the pending one included (0 = the draft's own block size)", lo=0,
                      hi=MAX_BLOCK, label="block size")  # fmt: skip


def build(ctx: BuildContext) -> DFlashDrafter:
    return DFlashDrafter(ctx.part, block_size=ctx.options.block or None, target_vocab=ctx.target.vocab_size)


def serve(o: DFlashOptions, draft: str | None) -> Serving:
    block = o.block or _published_block(draft)
    drafts = None if block is None else block - 1
    notes = ["transformers' generate runs DFlash as assisted generation with speculation_type='dflash'"]
    if draft and (Path(draft) / "draft_vocab.safetensors").exists():
        notes.append("the draft vocabulary is Glance's: these engines read the target's whole LM head")
    return Serving(
        vllm={"method": "dflash", "model": draft, "num_speculative_tokens": drafts},
        sglang={
            "speculative-algorithm": "DFLASH",
            "speculative-draft-model-path": draft,
            "speculative-num-draft-tokens": block,
        },
        transformers={"assistant_model": draft, "speculation_type": "dflash"},
        notes=notes,
    )


def _published_block(draft: str | None) -> int | None:
    """The block size a draft folder's config.json declares, or None where it cannot be read."""
    import json

    try:
        raw = json.loads((Path(draft) / "config.json").read_text())
        return int(raw.get("block_size") or raw["dflash_config"]["block_size"])
    except (TypeError, OSError, ValueError, KeyError):
        return None


def describe(head: DFlashHead) -> dict:
    ids = head.draft_ids
    return {
        "block_size": head.block_size,
        "draft_layers": len(head.layers),
        "target_layer_ids": list(head.target_layer_ids),
        "mask_token_id": head.mask_token_id,
        "draft_vocab": len(ids) if ids is not None else "full",
    }


SPEC = DrafterSpec(
    name="dflash",
    reference="hf_dflash",  # transformers' DFlash assisted generation, with this drafter's weights
    label="DFlash",
    color="#ff8a65",
    summary="a block-diffusion draft fills a whole block of masks in one forward from several target layers' "
    "hidden states (Chen et al. 2026)",
    in_default_race=False,  # trained for minutes here, it loses on the bundled models: tick it to race it
    build=build,
    options=DFlashOptions,
    serve=serve,
    explain=lambda o: f"a block of {o.block} tokens a step" if o.block else "the draft's own block a step",
    part=PartSpec(
        "dflash",
        "DFlash draft folder (z-lab's layout)",
        load=lambda path, target, access: load_dflash_head(path, target.model),
        describe=describe,
        bundled=BUNDLED / "dflash",
        brief=lambda head: f"block {head.block_size}, {len(head.layers)} layers, reads {list(head.target_layer_ids)}",
        compile=lambda head, progress: compile_block(head, progress),
    ),
)
