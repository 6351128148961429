"""EAGLE drafting: the head predicts the target's next feature and the target's LM head reads tokens from it.

EAGLE-1 follows a static tree of paths (path (i, j): the j-th best child of the i-th best first token). EAGLE-2
grows a dynamic tree: the root's top-k children, then `depth` expansions of the `top_k` nodes with the highest
cumulative draft log-probability, and `total_tokens` tokens go to verification: the pending token and the
`total_tokens - 1` best drafted nodes. The knobs mean what SafeAILab/EAGLE's and vLLM's do, so settings port.
Each depth is one batched head forward over the frontier;
the head keeps its own KV cache of committed (token, feature) pairs, and draft entries are cropped after drafting.
Candidates are the head's top-k, deterministic given the context, so verification is exact (greedy, or the
deterministic-candidate rule when sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.decoding.tree import Draft, host_mask, mask_storage
from engine.drafters.base import HINDSIGHT_ROWS, DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, PartSpec, knob
from engine.errors import GlanceError
from engine.heads.compiled_step import compile_head
from engine.heads.eagle import EagleHead, load_eagle_head
from engine.heads.readout import draft_step
from engine.models.loading import BUNDLED
from engine.runtime.cache import cache_length, pack_columns

# SafeAILab/EAGLE's 25-node static tree (`mc_sim_7b_63` in its choices.py), for EAGLE-1.
EAGLE_25 = [
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (0, 0, 0), (0, 0, 1),
    (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
]  # fmt: skip

# Chosen on this project's 2-core Xeon CPU (bf16, bundled target and head, 12 suite prompts x 48 tokens, greedy;
# engine/train/loop/evaluate.py compare_settings), as levels / drafted nodes: top_k/levels/nodes 4/4/12 tau 3.00, 4/5/16
# tau 3.17, 6/5/20 tau 3.12, 8/6/32 tau 3.24, 3/5/10 tau 2.95, static 25-node tree tau 3.02. Wider trees buy little
# tau and cost verify time on a CPU, where verifying n tokens grows with n; the reference's 10 / 5-7 / 60 suits GPUs.
# In the reference's meaning 4 / 5 levels / 16 nodes is top_k 4, depth 4, total_tokens 17.
DEFAULT_TOP_K = 4
DEFAULT_DEPTH = 4
DEFAULT_TOTAL = 17
# A run's first draft feeds the head the prompt's pairs: the latest HEAD_CONTEXT of them only. The target's features
# already carry the context; the head's own attention over every pair of a 150-token prompt made a probe from plain
# steps cost 16-17 ms of drafting where a drafted step costs 1.6 (EAGLE-2 off the suite on the AVX2 EPYC), and a
# draft budget that keeps plain steps pays one such probe nearly every run. A catch-up after a longer stretch of plain
# steps feeds its latest HEAD_CONTEXT pairs the same way (the head's cache keeps a gap): a probe 100 plain steps
# after the last draft drafted 15-17 ms, nearly all of it the head over every pair of the stretch.
HEAD_CONTEXT = 64


def tree_shape(depth: int, total_tokens: int) -> tuple[int, int]:
    """(levels of drafted nodes, drafted nodes) of the reference's `depth` and `total_tokens`: the root's top-k
    children plus `depth` expansions, and every verified token but the pending one."""
    return depth + 1, total_tokens - 1


def explain(top_k: int, depth: int, total_tokens: int) -> str:
    levels, nodes = tree_shape(depth, total_tokens)
    grown = min(nodes, top_k + depth * top_k * top_k)  # what the expansions can produce at most
    return f"{levels} levels, up to {grown} drafted nodes + the pending token verified"


class EagleDrafter(Drafter):
    """EAGLE's trees for every row of a run: one head forward and read-out per depth for all rows' frontiers.

    Each row keeps its pending (token, feature) pairs and grows its own tree (`GrowingTree`), so it drafts the tree
    it would draft alone. The rows share one head cache: a row's committed pairs sit at columns tracked per row; a
    forward's mask lets each new entry see its row's committed pairs, its own ancestors and itself, and before each
    draft the cache is packed to each row's committed pairs (draft entries are only for drafting)."""

    name = "eagle"
    needs_hidden_states = True
    head_context = HEAD_CONTEXT  # the most pairs one draft feeds the head: of a prompt, or of a stretch of plain steps

    def __init__(
        self,
        head: EagleHead,
        dynamic: bool = True,
        top_k: int = DEFAULT_TOP_K,
        depth: int = DEFAULT_DEPTH,
        total_tokens: int = DEFAULT_TOTAL,
        tree: list | None = None,
    ) -> None:
        if top_k < 1 or depth < 0 or total_tokens < 2:
            raise GlanceError("EAGLE needs top_k of at least 1, depth of at least 0 and total_tokens of at least 2")
        self.head = head
        self.dynamic = dynamic
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.levels, self.total = tree_shape(depth, total_tokens)  # what the loop below builds and verifies
        self.paths = sorted({tuple(p) for p in (tree or EAGLE_25)}, key=lambda p: (len(p), p))
        self.dtype = next(head.parameters()).dtype
        self.device = next(head.parameters()).device
        # candidates read per drafted row: the root's and every node's children come from the same top-k
        self.k_read = top_k if dynamic else max(max(p[0] for p in self.paths), max(p[-1] for p in self.paths)) + 1
        self.first_ranks = sorted({p[0] for p in self.paths if len(p) == 1})  # EAGLE-1's depth-1 children
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.cache = None
        self.cols: list[list[int]] = [[] for _ in range(rows)]  # per row: the cache columns of its committed pairs
        self.skipped = [0] * rows  # per row: pairs left out of the cache (HEAD_CONTEXT): positions count them
        # per row, committed pairs not yet in the head cache: tokens, and per step the tensors their features come
        # from with the rows to read (a plain step appends one; gathered when drafting takes them)
        self.pending: list[tuple[list[int], list] | None] = [None] * rows

    def feature_parts(self, target_out) -> list[torch.Tensor]:
        """The tensors [1, S, H] of a target forward the head's features are made of: the last hidden state."""
        return [target_out.hidden_states[-1]]

    def begin(self, row: int, state: DecodeState) -> None:
        self.cols[row], self.skipped[row] = [], 0
        # every prompt position's features, pairs (x_{i+1}, f_i)
        self.pending[row] = (state.tokens[1:], [(self.feature_parts(state.target_out), None)])

    def update(self, row: int, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        rows = state.rows  # verify rows whose features predicted the emitted tokens
        toks = state.tokens[-len(rows) :]
        # no tensor op here: a plain step's gather and concatenation would cost every step
        chunk = (self.feature_parts(state.target_out), list(rows))
        if self.pending[row] is None:
            self.pending[row] = (toks, [chunk])
        else:  # this step drafted nothing (its depth cap was 0): the earlier pairs still wait
            self.pending[row][0].extend(toks)
            self.pending[row][1].append(chunk)

    def take_pending(self, row: int) -> tuple[list[int], torch.Tensor]:
        """A row's waiting pairs, tokens and features [n, F], and none left waiting."""
        toks, chunks = self.pending[row]
        self.pending[row] = None
        columns = []  # per feature part: [n, H]
        for i in range(len(chunks[0][0])):
            pieces = [_rows_of(parts[i][0], rows) for parts, rows in chunks]
            columns.append(pieces[0] if len(pieces) == 1 else torch.cat([p.to(pieces[0].dtype) for p in pieces]))
        return toks, columns[0] if len(columns) == 1 else torch.cat(columns, dim=-1)

    def _catch_up(self, b: int, state: DecodeState) -> tuple[tuple | None, tuple]:
        """Row b's waiting pairs split in two: those that go in without a read-out (None: none), and the latest
        ones read (the root's, and those hindsight reads when greedy: every pair since the last draft, or the
        generated ones on a run's first). A prompt or a long stretch of plain steps feeds its latest `head_context`
        pairs only, at their text positions (`skipped` counts the gap)."""
        base = len(self.cols[b])
        toks, feats = self.take_pending(b)
        read = 1
        if state.sampling.greedy:
            generated = len(state.tokens) - state.prompt_len  # pairs from the one whose read-out guesses the first
            read += min(HINDSIGHT_ROWS, len(toks) - 1 if base else generated)
        gap = 0
        if base == 0 and len(toks) > 1:  # a prompt's pairs: the root's pair and the `head_context` before it
            gap = max(0, len(toks) - 1 - self.head_context)
        elif len(toks) > self.head_context:  # a long stretch of plain steps: its latest pairs, after a gap
            gap = len(toks) - self.head_context
        self.skipped[b] += gap
        toks, feats = toks[gap:], feats[gap:]
        if len(toks) > read:  # a vocabulary's top-k per pair would be dropped: these go in without one
            return (toks[:-read], feats[:-read]), (toks[-read:], feats[-read:])
        return None, (toks, feats)

    def _head_call(self, feeds: dict[int, tuple], readout: bool = True) -> dict:
        """One head forward (and read-out) for the rows in `feeds`: feeds[b] = (tokens, features [n, F], text
        positions, per new entry the slots of its ancestors among the row's draft entries, or None for a causal run
        after the row's committed pairs). Returns {b: (outputs [n, H], the columns the new entries took, per new entry
        its candidates (target ids, log-probs) as lists)}; without `readout` the outputs and candidates are None."""
        B = len(self.cols)
        S = max(len(f[0]) for f in feeds.values())
        if B > 1:
            S = max(S, 2)  # a batch feeds two or more: one compiled graph for every batch forward
        width = cache_length(self.cache)
        hidden = next(iter(feeds.values()))[1].shape[-1]
        ids, positions = np.zeros((B, S), dtype=np.int64), np.zeros((B, S), dtype=np.int64)
        feats = torch.zeros(B, S, hidden, dtype=self.dtype)  # [B, S, F]
        plain = B == 1  # one row that sees its whole cache and a causal run of one entry needs no mask
        runs = {}
        for b, (tokens, f, pos, ancestors) in feeds.items():
            n = len(tokens)
            ids[b, :n] = tokens
            feats[b, :n] = f.to(self.dtype)
            positions[b, :n] = pos
            plain = plain and ancestors is None and n == 1 and len(self.cols[b]) == width
            columns = None if ancestors is None else [[self.drafted[b][s] for s in slots] for slots in ancestors]
            runs[b] = (self.cols[b], n, columns)
        device = self.device
        inputs = (
            torch.from_numpy(ids).to(device),
            feats.to(device),
            torch.from_numpy(positions).to(device),
            self.cache,
            None if plain else head_mask(runs, B, width, S, self.dtype).to(device),  # [B, 1, S, width + S]
        )
        if not readout:
            self.head(*inputs)
            return {b: (None, list(range(width, width + len(f[0]))), None) for b, f in feeds.items()}
        out, values, top = draft_step(self.head)(*inputs, self.k_read)  # [B, S, H], [B, S, k], [B, S, k]
        values, top = values.tolist(), top.tolist()  # one copy each for every row
        return {
            b: (out[b, :n], list(range(width, width + n)), list(zip(top[b][:n], values[b][:n])))
            for b, n in ((b, len(f[0])) for b, f in feeds.items())
        }

    def _check_catch_up(self, toks: list[int], tops: list[tuple[list, list]]) -> None:
        """Whether the head's candidates after each caught-up pair held the next one's token: depth 1 of a tree
        there (and whether its first choice did)."""
        if len(toks) < 2:
            return
        if self.dynamic:
            rows = [ids[: self.top_k] for ids, _ in tops[:-1]]
        else:
            rows = [[ids[r] for r in self.first_ranks if r < len(ids)] for ids, _ in tops[:-1]]
        firsts = [bool(r) and t == r[0] for t, r in zip(toks[1:], rows)]
        self.note_hindsight([t in r for t, r in zip(toks[1:], rows)], firsts)

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        drafts = [Draft() for _ in states]
        live = [b for b, s in enumerate(states) if s is not None and self.pending[b] is not None and max_tokens[b] >= 1]
        if not live:
            return drafts
        if self.cache is None:
            self.cache = self.head.new_cache()
        self.cols = pack_columns(self.cache, self.cols)  # each row's committed pairs at columns 0..n_b - 1
        absorbed, read = {}, {}
        for b in live:
            absorbed[b], read[b] = self._catch_up(b, states[b])
        outs = {}
        for part, readout in (({b: a for b, a in absorbed.items() if a is not None}, False), (read, True)):
            if not part:
                continue
            feeds = {}
            for b, (toks, f) in part.items():
                at = len(self.cols[b]) + self.skipped[b]  # the text position of the first pair fed
                feeds[b] = (toks, f, list(range(at, at + len(toks))), None)
            outs = self._head_call(feeds, readout)
            for b in part:
                self.cols[b] += outs[b][1]
        trees, committed = {}, {}
        self.drafted = {b: [] for b in live}  # row b's draft entries' columns, by slot
        for b in live:
            toks = read[b][0]
            if states[b].sampling.greedy:
                self._check_catch_up(toks, outs[b][2])
            committed[b] = len(self.cols[b])  # pairs in the cache; the root pair sits at position committed - 1
            trees[b] = GrowingTree(self, outs[b][0][-1], min(self.levels, max_tokens[b]))
            trees[b].start(outs[b][2][-1])  # the root's candidates: the last pair's read-out
        while True:
            feeds = {}
            for b in live:
                step = trees[b].next_inputs()
                if step is None:
                    continue
                tokens, f, ancestors = step
                position = committed[b] + self.skipped[b] - 1 + trees[b].depth - 1  # the text's (HEAD_CONTEXT)
                feeds[b] = (tokens, f, [position] * len(tokens), ancestors)
            if not feeds:
                break
            outs = self._head_call(feeds)
            for b in feeds:
                out, cols, tops = outs[b]
                self.drafted[b] += cols
                trees[b].absorb(out, tops)
        for b in live:
            drafts[b] = self.finish(trees[b].draft())
        return drafts

    def finish(self, draft: Draft) -> Draft:
        """The draft as the loop gets it: a hook for what a subclass adds (EAGLE-3's draft-vocabulary ids)."""
        return draft

    def settings(self) -> dict:
        ids = getattr(self.head, "draft_ids", None)  # EAGLE's optional draft vocabulary (EAGLE-3 says its own)
        vocab = {"draft_vocab": len(ids) if ids is not None else "full"}
        if self.dynamic:
            return {
                "mode": "eagle-2",
                "top_k": self.top_k,
                "depth": self.depth,
                "total_tokens": self.total_tokens,
                "levels": self.levels,
                "draft_nodes": self.total,
            } | vocab
        return {"mode": "eagle-1", "tree_nodes": len(self.paths), "depth": self.depth, "levels": self.levels} | vocab


class GrowingTree:
    """One row's draft tree while it grows: EAGLE-2's confidence-ranked expansion (or EAGLE-1's fixed paths), apart
    from the head calls, which `EagleDrafter.propose` makes for every row at once."""

    def __init__(self, drafter: EagleDrafter, root_feat: torch.Tensor, depth_cap: int) -> None:
        self.d = drafter
        self.root_feat = root_feat
        self.depth_cap = depth_cap
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.in_feat: list[torch.Tensor] = []  # feature each node is fed with: its parent's predicted feature
        self.slot: dict[int, int] = {}  # node -> index among fed draft entries
        self.ancestors: dict[int, list[int]] = {}
        self.paths: dict[int, tuple] = {}
        self.frontier: list[int] = []
        self.fed = 0  # draft entries fed to the head so far
        self.depth = 1  # depth of the frontier

    def _add_children(self, parent: int, feat: torch.Tensor, top: tuple[list, list], base: float, ranks) -> list:
        """Children of `parent` at the given ranks of its top candidates (ids, log-probs as Python lists)."""
        ids, logps = top
        new = []
        for r in ranks:
            if r >= len(ids):  # a draft vocabulary smaller than top-k has fewer candidates
                break
            self.tokens.append(ids[r])
            self.parents.append(parent)
            self.scores.append(base + logps[r])
            self.in_feat.append(feat)
            node = len(self.tokens) - 1
            self.paths[node] = (self.paths[parent] if parent >= 0 else ()) + (r,)
            new.append(node)
        return new

    def start(self, root_top: tuple[list, list]) -> None:
        d = self.d
        ranks = range(d.top_k) if d.dynamic else d.first_ranks
        self.frontier = self._add_children(-1, self.root_feat, root_top, 0.0, ranks)

    def next_inputs(self) -> tuple[list[int], torch.Tensor, list[list[int]]] | None:
        """The next depth's head inputs (tokens, features [f, H], each node's ancestor slots), None when done."""
        if self.depth >= self.depth_cap:
            return None
        self.depth += 1
        d = self.d
        if not d.dynamic:
            self.frontier = [
                n for n in self.frontier if any(len(p) == self.depth and p[:-1] == self.paths[n] for p in d.paths)
            ]
        if not self.frontier:
            return None
        anc = []
        for n in self.frontier:
            parent = self.parents[n]
            self.ancestors[n] = self.ancestors.get(parent, []) + ([self.slot[parent]] if parent >= 0 else [])
            anc.append(self.ancestors[n])
        feats = torch.stack([self.in_feat[n] for n in self.frontier])  # [f, H]
        return [self.tokens[n] for n in self.frontier], feats, anc

    def absorb(self, outs: torch.Tensor, tops: list[tuple[list, list]]) -> None:
        """The head's outputs [f, H] for the frontier and their top candidates: grow one depth."""
        d = self.d
        for i, n in enumerate(self.frontier):
            self.slot[n] = self.fed + i
        self.fed += len(self.frontier)
        children = []
        for i, n in enumerate(self.frontier):
            if d.dynamic:
                ranks = range(d.top_k)
            else:
                ranks = sorted({p[-1] for p in d.paths if len(p) == self.depth and p[:-1] == self.paths[n]})
            children += self._add_children(n, outs[i], tops[i], self.scores[n], ranks)
        if d.dynamic:  # the next frontier: the best top_k of this depth by cumulative log-probability
            children = sorted(children, key=lambda c: -self.scores[c])[: d.top_k]
        self.frontier = children

    def draft(self) -> Draft:
        """The nodes to verify: EAGLE-2's best `total - 1` by cumulative log-probability with their ancestors, or
        EAGLE-1's whole tree, in breadth order."""
        d, tokens, parents, scores, paths = self.d, self.tokens, self.parents, self.scores, self.paths
        budget = min(d.total if d.dynamic else len(tokens), len(tokens))  # max_tokens capped the depth
        chosen = (
            set(sorted(range(len(tokens)), key=lambda c: -scores[c])[:budget]) if d.dynamic else set(range(len(tokens)))
        )
        for c in list(chosen):  # keep every chosen node's ancestors
            p = parents[c]
            while p >= 0:
                chosen.add(p)
                p = parents[p]
        order = sorted(chosen, key=lambda c: (len(paths[c]), -scores[c]))[: max(budget, 1)]
        order = [c for c in order if parents[c] < 0 or parents[c] in order]
        index = {c: i for i, c in enumerate(order)}
        return Draft([tokens[c] for c in order], [index[parents[c]] if parents[c] >= 0 else -1 for c in order])


def compiled_drafting(label: str):
    """How an EAGLE-style head compiles with the target (its PartSpec's `compile`): its drafting step, the head's
    forward and its top-k read-out, as one graph per kind of call."""

    def compile_part(head, progress):
        progress(0, 1, f"compiling the {label} head's drafting step (once per session)")
        return compile_head(head, f"the {label} head")

    return compile_part


@dataclass
class TreeOptions:
    """The dynamic tree's knobs, as SafeAILab/EAGLE names them: EAGLE-2's and EAGLE-3's alike."""

    top_k: int = knob(DEFAULT_TOP_K, "nodes expanded per depth (dynamic trees)", lo=1, hi=32, label="top-k")
    depth: int = knob(
        DEFAULT_DEPTH, "expansions after the root's top-k (levels = depth + 1), as in SafeAILab/EAGLE", lo=0, hi=12
    )
    total_tokens: int = knob(
        DEFAULT_TOTAL,
        "tokens verified per step, the pending one included (drafted nodes = total - 1), as in SafeAILab/EAGLE "
        "(dynamic trees)",
        lo=2,
        hi=129,
        label="total",
    )


def tree_serving(algorithm: str, method: str, o: TreeOptions, head: str | None) -> Serving:
    """EAGLE-2 and EAGLE-3 trees in the serving engines: SGLang grows the same top-k tree (its steps are the tree's
    levels); vLLM drafts a chain as deep as the tree."""
    levels, nodes = tree_shape(o.depth, o.total_tokens)
    return Serving(
        vllm={"method": method, "model": head, "num_speculative_tokens": levels, "draft_tensor_parallel_size": 1},
        sglang={
            "speculative-algorithm": algorithm,
            "speculative-draft-model-path": head,
            "speculative-num-steps": levels,
            "speculative-eagle-topk": o.top_k,
            "speculative-num-draft-tokens": nodes + 1,
        },
        notes=[
            f"vLLM drafts a chain of {levels} tokens (top-1 at each level), not the top-{o.top_k} tree",
            "transformers' generate has no EAGLE head",
        ],
    )


@dataclass
class EagleOptions(TreeOptions):
    mode: str = knob(
        "dynamic",
        "dynamic: EAGLE-2's confidence-ranked tree; static: EAGLE-1's fixed tree",
        choices=("dynamic", "static"),
    )


def build(ctx: BuildContext) -> EagleDrafter:
    o = ctx.options
    return EagleDrafter(
        ctx.part,
        dynamic=o.mode == "dynamic",
        top_k=o.top_k,
        depth=o.depth,
        total_tokens=o.total_tokens,
    )


SPEC = DrafterSpec(
    name="eagle",
    label="EAGLE-2",
    color="#81c784",
    summary="a one-layer head predicts the next hidden state: EAGLE-1 static tree, EAGLE-2 dynamic tree "
    "(Li et al. 2024)",
    build=build,
    options=EagleOptions,
    serve=lambda o, head: tree_serving("EAGLE", "eagle", o, head),
    explain=lambda o: (
        explain(o.top_k, o.depth, o.total_tokens)
        if o.mode == "dynamic"
        else f"EAGLE-1's 25-node tree, {min(o.depth + 1, 5)} levels"
    ),
    part=PartSpec(
        "eagle",
        "EAGLE head folder",
        load=lambda path, target, access: load_eagle_head(path, target.model),
        describe=lambda head: dict(head.cfg),
        bundled=BUNDLED / "eagle",
        brief=lambda head: f"1 layer, hidden {head.cfg.get('hidden_size')}",
        compile=compiled_drafting("EAGLE"),
    ),
    budget=BudgetTraits(hindsight_depth=1),  # a catch-up reads the target's features: its guesses are depth 1's
)


def head_mask(runs: dict, rows: int, width: int, S: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 1, S, width + S] additive over a head forward's keys (the cache's `width` columns, then the S new
    entries): runs[b] = (the cache columns every new entry of row b sees, its new entries n, per entry the columns of
    its ancestors, or None: the entries are a causal run); every entry sees itself, padding only itself. Built in
    numpy and viewed as the dtype: one torch op."""
    storage, lowest = mask_storage(dtype)
    mask = np.full((rows, S, width + S), lowest, dtype=storage)
    mask[:, np.arange(S), width + np.arange(S)] = 0
    for b, (seen, n, ancestors) in runs.items():
        mask[b, :n, seen] = 0
        if ancestors is None:
            mask[b, :n, width : width + n][np.tril(np.ones((n, n), dtype=bool))] = 0
        else:
            for r, columns in enumerate(ancestors):
                mask[b, r, columns] = 0
    return host_mask(mask, dtype)[:, None]


def _rows_of(features: torch.Tensor, rows: list[int] | None) -> torch.Tensor:
    """[k, H]: these rows of a forward's features [S, H] (None: all); one row, or a run of rows, is a view."""
    if rows is None:
        return features
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return features[rows[0] : rows[0] + len(rows)]
    return features[rows]
