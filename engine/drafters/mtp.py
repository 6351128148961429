"""MTP drafting: the target's multi-token-prediction layer (engine/heads/mtp.py) chained K deep on its own outputs, as
vLLM and SGLang serve DeepSeek's, GLM's and Qwen3.5's layers (`mtp`, `NEXTN`). The layer reads the same pairs as
EAGLE's head (the next token, the target's last hidden state), so EAGLE's drafting loop runs it: top-k 1 is the
published chain, a wider top-k grows EAGLE-2's tree over the same layer. Candidates are the layer's top-k, a
deterministic function of the context, so verification stays exact."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.eagle import EagleDrafter, compiled_drafting
from engine.drafters.serving import Serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, PartSpec, knob
from engine.heads.mtp import MtpHead, declares_mtp, load_mtp_head
from engine.models.loading import BUNDLED

DEFAULT_TOKENS = 3  # vLLM's and SGLang's usual num_speculative_tokens for one shipped layer


class MtpDrafter(EagleDrafter):
    name = "mtp"

    def __init__(self, head: MtpHead, tokens: int = DEFAULT_TOKENS, top_k: int = 1) -> None:
        # EAGLE-2's tree with `tokens` levels; top-k 1 keeps one node a level: a chain of `tokens`
        total = 1 + (tokens if top_k == 1 else min(top_k * tokens, 64))
        super().__init__(head, dynamic=True, top_k=top_k, depth=tokens - 1, total_tokens=total)
        self.tokens = tokens

    def settings(self) -> dict:
        return {
            "tokens": self.tokens,
            "top_k": self.top_k,
            "draft_nodes": self.total,
            "mtp_layers": len(self.head.layers),
            "draft_vocab": len(self.head.draft_ids) if self.head.draft_ids is not None else "full",
        }


@dataclass
class MtpOptions:
    tokens: int = knob(DEFAULT_TOKENS, "drafts chained through the MTP layer a step (its depth)", lo=1, hi=16)
    top_k: int = knob(1, "candidates per depth: 1 is the published chain, more grow EAGLE-2's tree", lo=1, hi=8,
                      label="top-k")  # fmt: skip


def build(ctx: BuildContext) -> MtpDrafter:
    return MtpDrafter(ctx.part, tokens=ctx.options.tokens, top_k=ctx.options.top_k)


def serve(o: MtpOptions, folder: str | None) -> Serving:
    notes = [
        "vLLM and SGLang serve MTP layers from the target's own checkpoint: layers trained here must be merged into "
        "the target's files under its MTP key names first",
        "transformers' generate runs a target's own MTP layers (use_mtp) and drafts one token per shipped layer",
    ]
    if o.top_k > 1:
        notes.append(f"the engines chain top-1 drafts: Glance's top-{o.top_k} tree has no counterpart there")
    return Serving(
        vllm={"method": "mtp", "num_speculative_tokens": o.tokens},
        sglang={
            "speculative-algorithm": "NEXTN",
            "speculative-num-steps": o.tokens,
            "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": o.tokens + 1,
        },
        transformers={"use_mtp": True},
        notes=notes,
    )


SPEC = DrafterSpec(
    name="mtp",
    reference="hf_mtp",  # transformers' MTP generation: a target's own layers only
    label="MTP",
    color="#ba68c8",
    summary="the target's multi-token-prediction layer drafts a chain from its last hidden state (DeepSeek-V3, "
    "GLM-4.5, Qwen3.5), or one trained here",
    in_default_race=False,  # trained for minutes here, it loses on the bundled models: tick it to race it
    build=build,
    options=MtpOptions,
    serve=serve,
    explain=lambda o: f"a chain of {o.tokens}" if o.top_k == 1 else f"{o.tokens} levels of top-{o.top_k}",
    part=PartSpec(
        "mtp",
        "MTP layers: a folder trained here, or the target's own when its config declares them",
        load=lambda path, target, access: load_mtp_head(path, target.model),
        describe=lambda head: dict(head.cfg),
        bundled=BUNDLED / "mtp",
        brief=lambda head: f"{len(head.layers)} layer(s) of {type(head.layers[0].mtp_block).__name__}",
        compile=compiled_drafting("MTP"),
        native=declares_mtp,
    ),
    budget=BudgetTraits(hindsight_depth=1),  # a catch-up reads the target's features: its guesses are depth 1's
)
