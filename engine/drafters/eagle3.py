"""EAGLE-3 drafting: EAGLE-2's dynamic tree over an EAGLE-3 head. The first depth reads the target's fused
low/middle/high features (captured by hooks on three decoder layers, not every hidden state); deeper depths read the
head's own outputs. Candidates are the head's top-k in its reduced vocabulary, mapped to target ids through d2t, so
they stay deterministic given the context and verification stays exact.
"""

from __future__ import annotations

import torch

from engine.decoding.tree import Draft
from engine.drafters.base import DecodeState
from engine.drafters.eagle import EagleDrafter, TreeOptions, compiled_drafting, explain, tree_serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, PartSpec
from engine.heads.eagle3 import Eagle3Head, load_eagle3_head
from engine.models.loading import BUNDLED

# Chosen on this project's 2-core Xeon CPU (bf16, bundled target and EAGLE-3 head, 20 suite prompts x 64 tokens,
# greedy, same run as EAGLE-2): depth 5 tau 2.84, 1.36x; depth 6 (82 prompts) tau 2.85, 1.29x: the sixth level
# costs a head forward and buys nothing.
DEFAULT_TOP_K = 4
DEFAULT_DEPTH = 4  # 5 levels of drafted nodes, in the reference's meaning (engine/drafters/eagle.py tree_shape)
DEFAULT_TOTAL = 17  # 16 drafted nodes + the pending token


class Eagle3Drafter(EagleDrafter):
    name = "eagle3"
    needs_hidden_states = False

    def __init__(
        self,
        head: Eagle3Head,
        top_k: int = DEFAULT_TOP_K,
        depth: int = DEFAULT_DEPTH,
        total_tokens: int = DEFAULT_TOTAL,
    ) -> None:
        super().__init__(head, dynamic=True, top_k=top_k, depth=depth, total_tokens=total_tokens)
        self.feature_layers = head.layer_ids
        self._draft_id = [-1] * len(head.t2d)  # target id -> draft id, or -1; a list: read per node, every step
        for draft_id, target_id in enumerate(head.target_ids().tolist()):
            self._draft_id[target_id] = draft_id

    def finish(self, draft: Draft) -> Draft:
        if draft.tokens:  # for the step inspector: each node's id in the head's own vocabulary
            draft.notes.draft_ids = [self._draft_id[t] for t in draft.tokens]
            draft.notes.draft_vocab = len(self.head.d2t)
        return draft

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        super().update(row, state, draft, accepted)
        own = state.tokens[-1]  # the target's token after the accepted path: could the head have drafted it?
        draft.notes.target_in_draft_vocab = 0 <= own < len(self._draft_id) and self._draft_id[own] >= 0

    def feature_parts(self, target_out) -> list[torch.Tensor]:
        """[1, S, H] each: the captured inputs of the three feature layers (side by side, fc fuses them in the head)."""
        return list(target_out.layer_features)

    def settings(self) -> dict:
        return {
            "mode": "eagle-3",
            "top_k": self.top_k,
            "depth": self.depth,
            "total_tokens": self.total_tokens,
            "levels": self.levels,
            "draft_nodes": self.total,
            "draft_vocab": len(self.head.d2t),
            "feature_layers": list(self.head.layer_ids),
        }


def build(ctx: BuildContext) -> Eagle3Drafter:
    o = ctx.options
    return Eagle3Drafter(ctx.part, top_k=o.top_k, depth=o.depth, total_tokens=o.total_tokens)


def describe(head: Eagle3Head) -> dict:
    """What the inspector and logs show: the shape, the feature layers and the draft-vocabulary mapping."""
    ids = head.target_ids().tolist()
    return {
        **{k: v for k, v in head.cfg.items() if k != "rope_scaling"},
        "draft_vocab_first_ids": ids[:8],
        "draft_vocab_covers": f"{len(ids)} of {head.cfg['vocab_size']} target tokens",
    }


SPEC = DrafterSpec(
    name="eagle3",
    label="EAGLE-3",
    color="#4db6ac",
    summary="a one-layer head drafts from features fused from three target layers, over its own reduced vocabulary "
    "(Li et al. 2025)",
    build=build,
    options=TreeOptions,  # EAGLE-2's tree knobs, under EAGLE-3's own names (eagle3_top_k, ...)
    serve=lambda o, head: tree_serving("EAGLE3", "eagle3", o, head),
    explain=lambda o: explain(o.top_k, o.depth, o.total_tokens),
    part=PartSpec(
        "eagle3",
        "EAGLE-3 head folder",
        load=lambda path, target, access: load_eagle3_head(path, target.model),
        describe=describe,
        bundled=BUNDLED / "eagle3",
        brief=lambda head: f"layers {list(head.layer_ids)}, draft vocab {len(head.d2t)}",
        compile=compiled_drafting("EAGLE-3"),
    ),
    budget=BudgetTraits(hindsight_depth=1),  # a catch-up reads the target's features: its guesses are depth 1's
)
