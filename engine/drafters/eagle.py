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

from engine.cache import cache_length, crop
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.eagle_batch import BatchedTrees
from engine.drafters.spec import BuildContext, DrafterSpec, PartSpec, knob
from engine.errors import GlanceError
from engine.heads.compiled_step import compile_head
from engine.heads.eagle import EagleHead, load_eagle_head
from engine.heads.readout import draft_step
from engine.models import BUNDLED_EAGLE
from engine.tree import Draft, host_mask, mask_storage

# SafeAILab/EAGLE's 25-node static tree (`mc_sim_7b_63` in its choices.py), for EAGLE-1.
EAGLE_25 = [
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (0, 0, 0), (0, 0, 1),
    (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
]  # fmt: skip

# Chosen on this project's 2-core Xeon CPU (bf16, bundled target and head, 12 suite prompts x 48 tokens, greedy;
# engine/train/evaluate.py compare_settings), as levels / drafted nodes: top_k/levels/nodes 4/4/12 tau 3.00, 4/5/16
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
    name = "eagle"
    needs_hidden_states = True
    hindsight_depth = 1  # a catch-up reads the target's features: its guesses are depth 1's only
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
        self.cache = None
        self.skipped = 0  # the prompt's pairs left out of the head's cache (HEAD_CONTEXT): positions count them
        # committed pairs not yet in the head cache: tokens, and per step the tensors their features come from with
        # the rows to read (a plain step appends one; gathered when drafting takes them, not on every step that waits)
        self.pending: tuple[list[int], list[tuple[list[torch.Tensor], list[int] | None]]] | None = None
        self.dtype = next(head.parameters()).dtype
        # candidates read per drafted row: the root's and every node's children come from the same top-k
        self.k_read = top_k if dynamic else max(max(p[0] for p in self.paths), max(p[-1] for p in self.paths)) + 1
        self.first_ranks = sorted({p[0] for p in self.paths if len(p) == 1})  # EAGLE-1's depth-1 children
        self.matches: list[bool] = []  # the latest catch-up's hindsight (see `hindsight`)
        self._causal: np.ndarray | None = None  # [n, n] additive upper triangle (mask_storage), cut to size per step

    def reset(self) -> None:
        self.cache, self.pending, self.matches, self.first_matches, self.skipped = None, None, [], None, 0

    def feature_parts(self, target_out) -> list[torch.Tensor]:
        """The tensors [1, S, H] of a target forward the head's features are made of: the last hidden state."""
        return [target_out.hidden_states[-1]]

    def features(self, target_out) -> torch.Tensor:
        """The features the head reads at every row of a target forward [S, F]: its parts side by side."""
        parts = self.feature_parts(target_out)
        return parts[0][0] if len(parts) == 1 else torch.cat(parts, dim=-1)[0]

    def begin(self, state: DecodeState) -> None:
        self.cache, self.skipped = self.head.new_cache(), 0
        # every prompt position's features, pairs (x_{i+1}, f_i)
        self.pending = (state.tokens[1:], [(self.feature_parts(state.target_out), None)])

    def update(self, state: DecodeState, draft: Draft, accepted: list[int]) -> None:
        rows = state.rows  # verify rows whose features predicted the emitted tokens
        toks = state.tokens[-len(rows) :]
        # no tensor op here: a plain step's gather and concatenation cost 15 us of EAGLE-3's 2.7 ms step, every step
        chunk = (self.feature_parts(state.target_out), list(rows))
        if self.pending is None:
            self.pending = (toks, [chunk])
        else:  # this step drafted nothing (its depth cap was 0): the earlier pairs still wait
            self.pending[0].extend(toks)
            self.pending[1].append(chunk)

    def take_pending(self) -> tuple[list[int], torch.Tensor]:
        """The waiting pairs, tokens and features [n, F], and none left waiting."""
        toks, chunks = self.pending
        self.pending = None
        columns = []  # per feature part: [n, H]
        for i in range(len(chunks[0][0])):
            pieces = [_rows_of(parts[i][0], rows) for parts, rows in chunks]
            columns.append(pieces[0] if len(pieces) == 1 else torch.cat([p.to(pieces[0].dtype) for p in pieces]))
        return toks, columns[0] if len(columns) == 1 else torch.cat(columns, dim=-1)

    def _drop_drafts(self, committed: int) -> None:
        """Keep only the committed pairs in the head's cache: draft entries were only for drafting."""
        crop(self.cache, committed)

    def _mask(self, committed: int, ancestors: list[list[int]] | None, fed: int, dtype, device) -> torch.Tensor | None:
        """[1, 1, m, committed + fed + m] additive: each new row sees the committed pairs, the fed entries listed in
        its `ancestors` (slots counted after the committed pairs) and itself; `ancestors` None with `m` = fed: the
        new rows are a causal run (the pairs committed since the last step), None for a run of one (it sees all)."""
        storage, lowest = mask_storage(dtype)  # built in numpy, viewed as the dtype: one torch op instead of four
        if ancestors is None:  # a causal run of `fed` rows after the committed pairs
            if fed == 1:
                return None
            if self._causal is None or self._causal.shape[0] < fed or self._causal.dtype != storage:
                size = max(fed, 16)
                self._causal = np.where(np.triu(np.ones((size, size), dtype=bool), 1), lowest, storage(0))
            mask = np.zeros((fed, committed + fed), dtype=storage)
            mask[:, committed:] = self._causal[:fed, :fed]
            return host_mask(mask, dtype)[None, None].to(device)
        m = len(ancestors)
        mask = np.zeros((m, committed + fed + m), dtype=storage)
        drafted = mask[:, committed:]  # over the fed entries and the new rows
        drafted[:] = lowest
        rows = [r for r, anc in enumerate(ancestors) for _ in range(len(anc) + 1)]
        cols = [c for r, anc in enumerate(ancestors) for c in (*anc, fed + r)]  # its ancestors and itself
        drafted[rows, cols] = 0
        return host_mask(mask, dtype)[None, None].to(device)

    def _feed(self, tokens: list[int], feats: torch.Tensor, positions: list[int], mask):
        """One head forward and its read-out (engine/heads/readout.py): outputs [m, H], the top `k_read`
        candidates' log-probs and target ids [m, k_read]."""
        dev = feats.device
        out, values, ids = draft_step(self.head)(
            torch.tensor([tokens], device=dev),
            feats[None],
            torch.tensor([positions], device=dev),
            self.cache,
            mask,
            self.k_read,
        )
        return out[0], values[0], ids[0]

    def window_prompt(self, pairs: int) -> int:
        """How many of a prompt's first `pairs` the head's cache leaves out (all but the latest `head_context`),
        remembered in `skipped`: every later pair and draft entry is fed at its text position."""
        self.skipped = max(0, pairs - self.head_context)
        return self.skipped

    def _absorb(self, tokens: list[int], feats: torch.Tensor, base: int) -> None:
        """The head forward over a causal run of pairs after the `base` in its cache, without the read-out: a top-k
        over the vocabulary for every pair of a prompt, of which drafting reads the last one's only, took most of the
        first draft (9.8 ms against 2-3 for the next ones, single row; 19-22 ms at batch 4). Positions are the text's
        (`skipped`: the pairs left out, a prompt's and any stretch's gap). feats: [m, F]."""
        m, dev = len(tokens), feats.device
        mask = self._mask(base, None, m, feats.dtype, dev)  # a causal run after the cached pairs (None for one)
        positions = torch.arange(base + self.skipped, base + self.skipped + m, device=dev)[None]
        self.head(torch.tensor([tokens], device=dev), feats[None], positions, self.cache, mask)

    @staticmethod
    def top_lists(values: torch.Tensor, ids: torch.Tensor) -> list[tuple[list, list]]:
        """Per row of a read-out [m, k]: the candidates' target ids and log-probs as lists, one copy each."""
        return list(zip(ids.tolist(), values.tolist()))

    @torch.no_grad()
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        if self.pending is None or max_tokens < 1:
            return Draft()
        dtype = self.dtype
        base = cache_length(self.cache)
        toks, feats = self.take_pending()
        read = 1  # the latest pairs fed with a read-out: the root's, and those hindsight reads (greedy only)
        if state.sampling.greedy:  # every pair since the last draft, or the generated ones on a run's first
            generated = len(state.tokens) - state.prompt_len  # pairs from the one whose read-out guesses the first
            read += min(self.hindsight_rows, len(toks) - 1 if base else generated)
        if base == 0 and len(toks) > 1:  # a prompt's pairs: the latest `head_context` only, at their text positions
            skip = self.window_prompt(len(toks) - 1)
            toks, feats = toks[skip:], feats[skip:]
        elif len(toks) > self.head_context:  # a long stretch of plain steps: its latest pairs too, after a gap
            gap = len(toks) - self.head_context  # (`skipped` counts it: every later pair keeps its text position)
            self.skipped += gap
            toks, feats = toks[gap:], feats[gap:]
        if len(toks) > read:  # the others go in with no read-out: a vocabulary's top-k per pair, only to be dropped
            self._absorb(toks[:-read], feats[:-read].to(dtype), base)
            base, toks, feats = cache_length(self.cache), toks[-read:], feats[-read:]
        m = len(toks)
        at = base + self.skipped  # the text position of the first pair fed
        out, values, ids = self._feed(
            toks, feats.to(dtype), list(range(at, at + m)), self._mask(base, None, m, dtype, feats.device)
        )
        if m > 1 and state.sampling.greedy:  # the head's candidates after each caught-up pair: depth 1 of a tree there
            first = ids[:-1, : self.top_k] if self.dynamic else ids[:-1, self.first_ranks]  # [m - 1, children]
            rows = first.tolist()
            self.matches = [t in row for t, row in zip(toks[1:], rows)]
            self.first_matches = [t == row[0] for t, row in zip(toks[1:], rows)]
        committed = base + m  # pairs in the cache; the root pair sits at position committed - 1
        root_feat = out[-1]  # predicted feature after the pending token
        tree = GrowingTree(self, root_feat, min(self.levels, max_tokens))
        (root_top,) = self.top_lists(values[-1:], ids[-1:])
        tree.start(root_top)
        while (step := tree.next_inputs()) is not None:
            tokens, in_feats, ancestors = step
            mask = self._mask(committed, ancestors, tree.fed, dtype, root_feat.device)
            positions = [committed + self.skipped - 1 + tree.depth - 1] * len(tokens)
            outs, values, ids = self._feed(tokens, in_feats, positions, mask)  # one head and read-out call per depth
            tree.absorb(outs, self.top_lists(values, ids))
        self._drop_drafts(committed)
        return self.finish(tree.draft())

    def finish(self, draft: Draft) -> Draft:
        """The draft as the loop gets it: a hook for what a subclass adds (EAGLE-3's draft-vocabulary ids)."""
        return draft

    @classmethod
    def batch_drafting(cls, drafters: list[Drafter]) -> BatchedTrees:
        """One head forward and one LM-head call per depth for every row of a batch (eagle_batch.py)."""
        return BatchedTrees(drafters, GrowingTree)

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
    from the head calls, so one row (EagleDrafter.propose) and a batch (eagle_batch.py) grow trees alike."""

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
class EagleOptions:
    eagle_mode: str = knob(
        "dynamic",
        "dynamic: EAGLE-2's confidence-ranked tree; static: EAGLE-1's fixed tree",
        choices=("dynamic", "static"),
    )
    eagle_top_k: int = knob(DEFAULT_TOP_K, "dynamic: nodes expanded per depth", lo=1, hi=32, label="top-k")
    eagle_depth: int = knob(
        DEFAULT_DEPTH, "expansions after the root's top-k (levels = depth + 1), as in SafeAILab/EAGLE", lo=0, hi=12
    )
    eagle_total_tokens: int = knob(
        DEFAULT_TOTAL,
        "dynamic: tokens verified per step, the pending one included (drafted nodes = total - 1), as in "
        "SafeAILab/EAGLE",
        lo=2,
        hi=129,
        label="total",
    )


def build(ctx: BuildContext) -> EagleDrafter:
    o = ctx.options
    return EagleDrafter(
        ctx.part,
        dynamic=o.eagle_mode == "dynamic",
        top_k=o.eagle_top_k,
        depth=o.eagle_depth,
        total_tokens=o.eagle_total_tokens,
    )


SPEC = DrafterSpec(
    name="eagle",
    label="EAGLE-2",
    color="#81c784",
    summary="a one-layer head predicts the next hidden state: EAGLE-1 static tree, EAGLE-2 dynamic tree "
    "(Li et al. 2024)",
    build=build,
    options=EagleOptions,
    explain=lambda o: (
        explain(o.eagle_top_k, o.eagle_depth, o.eagle_total_tokens)
        if o.eagle_mode == "dynamic"
        else f"EAGLE-1's 25-node tree, {min(o.eagle_depth + 1, 5)} levels"
    ),
    part=PartSpec(
        "eagle",
        "EAGLE head folder",
        load=lambda path, target, access: load_eagle_head(path, target.model),
        describe=lambda head: dict(head.cfg),
        bundled=BUNDLED_EAGLE,
        brief=lambda head: f"1 layer, hidden {head.cfg.get('hidden_size')}",
        compile=compiled_drafting("EAGLE"),
    ),
)


def _rows_of(features: torch.Tensor, rows: list[int] | None) -> torch.Tensor:
    """[k, H]: these rows of a forward's features [S, H] (None: all); one row, or a run of rows, is a view."""
    if rows is None:
        return features
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return features[rows[0] : rows[0] + len(rows)]
    return features[rows]
