"""Medusa drafting: the heads' top-k candidates along a tree of paths, verified in the one target forward.

A tree is a list of paths; path (i, j) is the node whose depth-1 token is head 0's i-th candidate and depth-2
token head 1's j-th candidate. The verifying forward also returns the hidden states the next proposal needs, so a
Medusa step costs exactly one target forward plus the small heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from engine.decoding.tree import Draft
from engine.drafters.base import HINDSIGHT_ROWS, DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, PartSpec, knob
from engine.errors import GlanceError
from engine.heads.compiled_readout import compile_readout, compiled_readout_of
from engine.heads.medusa import MedusaHeads, load_medusa_heads
from engine.heads.readout import candidates
from engine.models.loading import BUNDLED
from engine.records.events import DraftNotes

# FasterDecoding/Medusa `medusa_choices.py`: the 63-node tree tuned for Vicuna-7B on an A100.
MC_SIM_7B_63 = [
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
]  # fmt: skip

# A small tree for CPUs, where verifying n tokens costs more than on a GPU: a greedy spine of depth 4, with
# second and third choices where the heads are least sure (the first levels). Measured on this project's 2-core
# Xeon (bf16, bundled target and heads, 12 suite prompts x 48 tokens, greedy; evaluate.compare_settings):
# chain_4 tau 1.52 (1.16x), cpu_16 tau 2.01 (1.34x), mc_sim_7b_63 tau 2.35 (1.00x: 63 nodes cost too much to verify).
CPU_16 = [
    (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 2), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (1, 1),
]  # fmt: skip

# cpu_16 plus the 4th and 5th candidates of head 0 and second-level branches under the top three: with the heads
# trained 1000 steps, 12 suite prompts x 48 tokens, bf16, 2 repeats interleaved per prompt: cpu_16 tau 2.17 (1.48x),
# cpu_24 tau 2.32 (1.47x), mc_sim_7b_63 tau 2.54 (1.19x). Verifying 25 tokens costs about what 17 do on this CPU,
# so the default is cpu_24: the longest accepted length at no measurable cost in speed.
CPU_24 = CPU_16 + [(3,), (4,), (0, 3), (1, 2), (2, 1), (3, 0), (0, 0, 2), (0, 1, 1)]

CHAIN_4 = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]

TREES = {"mc_sim_7b_63": MC_SIM_7B_63, "cpu_24": CPU_24, "cpu_16": CPU_16, "chain_4": CHAIN_4}
DEFAULT_TREE = "cpu_24"

# Medusa's typical acceptance defaults: posterior threshold epsilon and alpha (delta = sqrt(epsilon) in the paper
# is expressed here as alpha, the reference implementation's name).
TYPICAL_EPS = 0.09
TYPICAL_ALPHA = 0.3


def _index(value) -> int:
    """A path index: an integer (not a string, a float or a bool that happens to convert)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value


def parse_tree(spec: str | list) -> list[tuple[int, ...]]:
    """A tree by name (see TREES) or as a JSON list of paths; every path's parent must be in the tree."""
    if isinstance(spec, str):
        if spec in TREES:
            paths = TREES[spec]
        else:
            try:
                paths = json.loads(spec)
            except (json.JSONDecodeError, RecursionError):
                raise GlanceError(
                    f"unknown Medusa tree '{spec}': use one of {', '.join(TREES)} or a JSON list of "
                    "paths such as [[0], [0, 0], [1]]"
                ) from None
    else:
        paths = spec
    shape = "a Medusa tree is a non-empty list of non-empty paths of non-negative indices, such as [[0], [0, 0], [1]]"
    try:
        paths = [tuple(_index(i) for i in p) for p in paths]
    except (TypeError, ValueError):
        raise GlanceError(f"{shape} (got {spec!r})"[:300]) from None
    if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
        raise GlanceError(shape)
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise GlanceError(f"Medusa tree path {list(p)} has no parent {list(p[:-1])} in the tree")
    return sorted(set(paths), key=lambda p: (len(p), p))


class MedusaDrafter(Drafter):
    name = "medusa"
    needs_hidden_states = True

    def __init__(
        self,
        heads: MedusaHeads,
        tree: str | list = DEFAULT_TREE,
        acceptance: str = "exact",
        typical_eps: float = TYPICAL_EPS,
        typical_alpha: float = TYPICAL_ALPHA,
    ) -> None:
        if acceptance not in ("greedy", "exact", "typical"):
            raise GlanceError(f"unknown acceptance '{acceptance}': use greedy, exact or typical")
        self.heads = heads
        self.tree_name = tree if isinstance(tree, str) and tree in TREES else "custom"
        self.paths = parse_tree(tree)
        depth = max(len(p) for p in self.paths)
        if depth > heads.num_heads and self.tree_name != "custom":
            # A named tree is a preset: keep the paths the heads can fill (parents are shorter, so they stay too).
            self.paths = [p for p in self.paths if len(p) <= heads.num_heads]
            self.tree_name = f"{self.tree_name} trimmed to {heads.num_heads} heads"
        elif depth > heads.num_heads:
            raise GlanceError(
                f"the Medusa tree is {depth} deep but the checkpoint has {heads.num_heads} heads: "
                f"give a tree at most {heads.num_heads} deep, or a named one (trimmed to the heads)"
            )
        self.topk = max(max(p) for p in self.paths) + 1
        index = {p: i for i, p in enumerate(self.paths)}
        self.parents = [index[p[:-1]] if len(p) > 1 else -1 for p in self.paths]
        self.acceptance = acceptance
        self.approximate = acceptance == "typical"
        self.typical = (typical_eps, typical_alpha)
        self.first_ranks = sorted({p[0] for p in self.paths if len(p) == 1})  # head 0's candidates at depth 1
        self.reset(1)
        readout = compiled_readout_of(heads)
        if readout is not None and (self.topk, False, False) not in readout.graphs:
            readout.warm_up(self.topk)  # a tree reading another k than the one compiled at load: now, not mid-run

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.hidden: list[torch.Tensor | None] = [None] * rows  # [H] per row: the last accepted position's
        self.unchecked: list[list[torch.Tensor]] = [[] for _ in range(rows)]  # per row: plain steps' hidden states
        self.unchecked_from = [0] * rows  # per row: the index in its tokens of the one the first of them emitted

    def begin(self, row: int, state: DecodeState) -> None:
        self.hidden[row] = state.target_out.hidden_states[-1][0, -1]
        self.unchecked[row] = []

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        """One heads call and one top-k for every drafting row's last hidden state."""
        drafts = [Draft() for _ in states]
        live = [b for b, s in enumerate(states) if s is not None and self.hidden[b] is not None and max_tokens[b] >= 1]
        for b in live:
            if len(self.unchecked[b]) > 1:
                self._check_unchecked(b, states[b].tokens)
            self.unchecked[b] = []
        if not live:
            return drafts
        hidden = torch.stack([self.hidden[b] for b in live])  # [rows, H]
        first = max(max_tokens[b] for b in live) == 1  # every row one token deep: head 0 alone
        top = self.heads.to_target(candidates(self.heads)(hidden, self.topk, log_probs=False, first=first).indices)
        top = top.transpose(0, 1).tolist()  # [K, rows, k] target ids -> [rows, K, k], to the host once
        for j, b in enumerate(live):
            drafts[b] = self.tree_from(top[j], max_tokens[b])
        return drafts

    def tree_from(self, top: list[list[int]], max_tokens: int) -> Draft:
        """The draft tree from each head's top candidates `top` [K, k] (ids), no path deeper than max_tokens."""
        k = len(top[0])
        keep = [i for i, p in enumerate(self.paths) if len(p) <= max_tokens and p[-1] < k]
        remap = {old: new for new, old in enumerate(keep)}
        tokens = [top[len(self.paths[i]) - 1][self.paths[i][-1]] for i in keep]
        parents = [remap.get(self.parents[i], -1) for i in keep]
        typical = self.typical if self.acceptance == "typical" else None
        return Draft(tokens, parents, notes=DraftNotes(rule="typical" if typical else None), typical=typical)

    def _check_unchecked(self, row: int, tokens: list[int]) -> None:
        """Hindsight over a row's plain steps since its last draft: whether head 0 on each one's hidden state had the
        next token among the tree's depth-1 candidates (the last one's next token is not known yet). One call of
        head 0 for all of them, eager: it runs when a step drafts after plain ones, not every step."""
        hidden = torch.stack(self.unchecked[row][:-1])  # [n, H]
        top = self.heads.to_target(self.heads.first_logits(hidden).topk(max(self.first_ranks) + 1, dim=-1).indices)
        guesses = top[:, self.first_ranks].tolist()
        start = self.unchecked_from[row] + 1  # the token head 0 guesses from the first plain step's hidden state
        matches = [tokens[start + j] in ranks for j, ranks in enumerate(guesses)]
        self.note_hindsight(matches, [tokens[start + j] == ranks[0] for j, ranks in enumerate(guesses)])

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        hidden = self.hidden[row] = state.target_out.hidden_states[-1][0, state.rows[-1]]
        # A plain step's hidden state is kept for hindsight (the latest HINDSIGHT_ROWS + 1): under a draft budget the
        # heads read nothing while plain steps are best, so acceptance would be learned from the rare probes alone.
        if not len(draft) and state.sampling.greedy:  # a plain step: what head 0 would have guessed is checked later
            unchecked = self.unchecked[row]
            if not unchecked:
                self.unchecked_from[row] = len(state.tokens) - 1
            unchecked.append(hidden)
            if len(unchecked) > HINDSIGHT_ROWS + 1:  # the last one's next token is not known yet
                del unchecked[0]
                self.unchecked_from[row] += 1

    def settings(self) -> dict:
        return {
            "tree": self.tree_name,
            "tree_nodes": len(self.paths),
            "heads": self.heads.num_heads,
            "acceptance": self.acceptance,
            "draft_vocab": len(self.heads.draft_ids) if self.heads.draft_ids is not None else "full",
        }


@dataclass
class MedusaOptions:
    tree: str = knob(
        DEFAULT_TREE,
        f"the tree: a name ({', '.join(TREES)}) or a JSON list of paths such as [[0], [0, 0], [1]]",
        suggestions=tuple(TREES),
        label="tree",
    )
    acceptance: str = knob(
        "exact",
        "greedy (needs temperature 0), exact sampling, or typical acceptance (approximate)",
        choices=("greedy", "exact", "typical"),
        flag="--acceptance",
    )


def build(ctx: BuildContext) -> MedusaDrafter:
    o = ctx.options
    if o.acceptance == "greedy" and not ctx.sampling.greedy:
        raise GlanceError("--acceptance greedy needs --temperature 0; use exact or typical to sample")
    return MedusaDrafter(ctx.part, tree=o.tree, acceptance=o.acceptance)


def compile_medusa(heads: MedusaHeads, progress):
    """How Medusa heads compile with the target (their PartSpec's `compile`): every head's read-out and the top-k
    the default tree reads, as one graph."""
    progress(0, 1, "compiling the Medusa heads' read-out (once per session)")
    return compile_readout(heads, MedusaDrafter(heads).topk, "the Medusa heads")


def serve(o: MedusaOptions, heads: str | None) -> Serving:
    from pathlib import Path

    from engine.inputs import read_json_object

    try:
        cfg = read_json_object(Path(heads) / "config.json", "a Medusa heads config")
        count = int(cfg["medusa_num_heads"])
    except (GlanceError, ValueError, KeyError, TypeError):
        raise GlanceError(f"{heads} holds no Medusa config.json with medusa_num_heads") from None
    notes = [f"vLLM drafts a chain of {count} tokens (one per head), not the `{o.tree}` tree"]
    if cfg.get("shared_lm_head"):
        notes.append("these heads share the target's LM head; vLLM's Medusa gives every head its own: retrain with "
                     "`train medusa --own-lm-head` for vLLM")  # fmt: skip
    if o.acceptance == "typical":
        notes.append("typical acceptance is approximate; vLLM verifies exactly")
    notes.append("SGLang and transformers have no Medusa")
    return Serving(vllm={"method": "medusa", "model": heads, "num_speculative_tokens": count}, notes=notes)


SPEC = DrafterSpec(
    name="medusa",
    label="Medusa",
    color="#ffb74d",
    summary="extra heads on the target's last hidden state propose a token tree (Cai et al. 2024)",
    build=build,
    options=MedusaOptions,
    serve=serve,
    part=PartSpec(
        "medusa",
        "Medusa heads folder",
        load=lambda path, target, access: load_medusa_heads(path, target.model),
        describe=lambda heads: heads.config(),
        bundled=BUNDLED / "medusa",
        brief=lambda heads: f"{heads.num_heads} heads",
        compile=compile_medusa,
    ),
    budget=BudgetTraits(hindsight_depth=1),  # head 0 on a plain step's hidden state: the depth-1 guess there
)
