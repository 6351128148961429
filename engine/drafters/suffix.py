"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"; as in Snowflake's Arctic Inference and vLLM): no model,
no training. The text so far is matched against an index of every suffix of the prompt, the output so far and this
session's earlier outputs; the tokens that followed the longest match, wherever it occurred, form a tree of likely
continuations, each node scored by how often its path followed the match. The tree grows best first while a node's
score stays above `min_prob`, to at most `factor` nodes per matched token (a long match earns a larger tree) and
`tokens` nodes in all.

The index keys every position by the two tokens ending there (one token where no pair matches), and a match is
extended backwards to at most MAX_MATCH tokens: a bounded-depth suffix index, which is what a suffix tree of depth
MAX_MATCH answers. Candidates are a deterministic function of the committed text and the session's earlier outputs,
so verification is exact: greedy, or the deterministic-candidate rule when sampling.
"""

from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass

from engine.decoding.tree import Draft
from engine.drafters.base import DecodeState, Drafter
from engine.drafters.serving import Serving
from engine.drafters.spec import BudgetTraits, BuildContext, DrafterSpec, knob

MAX_MATCH = 32  # the longest match scored: longer ones occur rarely, and the draft's size is capped anyway
OCCURRENCES = 64  # the latest occurrences of a match read per step: enough counts, a bounded host cost
SESSION_TOKENS = 200_000  # earlier outputs kept per target for the session's corpus, oldest dropped first

# per target model: the outputs of its earlier runs in this process, (prompt, output) each (a session's history)
_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SuffixIndex:
    """Token sequences with every position keyed by the one and two tokens ending there."""

    def __init__(self) -> None:
        self.seqs: list[list[int]] = []
        self.pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (a, b) -> (sequence, position of b)
        self.singles: dict[int, list[tuple[int, int]]] = {}
        self.indexed: list[int] = []  # per sequence: positions indexed so far

    def add(self, seq: list[int]) -> int:
        """Index a sequence (it may grow: `extend` indexes what was appended); its id."""
        self.seqs.append(seq)
        self.indexed.append(0)
        self.extend(len(self.seqs) - 1)
        return len(self.seqs) - 1

    def extend(self, s: int) -> None:
        seq = self.seqs[s]
        for i in range(self.indexed[s], len(seq)):
            self.singles.setdefault(seq[i], []).append((s, i))
            if i:
                self.pairs.setdefault((seq[i - 1], seq[i]), []).append((s, i))
        self.indexed[s] = len(seq)

    def occurrences(self, context: list[int]) -> tuple[int, list[tuple[int, int]]]:
        """The longest match of the context's end found earlier with a token after it: (its length, where each of
        its latest occurrences ends). (0, []) when not even the last token occurred before."""

        def followed(found):  # occurrences with a token after them (not the context's own end)
            return [(s, i) for s, i in found if i + 1 < len(self.seqs[s])]

        found = followed(self.pairs.get(tuple(context[-2:]), [])) if len(context) > 1 else []
        found = found or followed(self.singles.get(context[-1], []))
        best, ends = 0, []
        for s, i in reversed(found):
            seq = self.seqs[s]
            n = 1
            while n < MAX_MATCH and n <= i and n < len(context) and seq[i - n] == context[-1 - n]:
                n += 1
            if n > best:
                best, ends = n, []
            if n == best:
                ends.append((s, i))
                if len(ends) == OCCURRENCES:
                    break
        return best, ends


@dataclass
class _Node:
    token: int
    parent: int  # index among the chosen nodes, -1: the pending token
    count: int  # occurrences whose continuation followed this node's path
    rank: int  # the newest of them, by recency (0: the newest)


def continuation_tree(index: SuffixIndex, ends: list[tuple[int, int]], size: int, depth: int, min_prob: float):
    """The draft tree of the continuations after `ends`: best first by the share of occurrences its path followed,
    nodes under `min_prob` left out, at most `size` nodes `depth` deep. Children come best first (Draft.spine)."""
    total = len(ends)
    tries: dict[tuple[int, ...], list[int]] = {}  # path -> [occurrences that continued along it, newest's rank]
    for rank, (s, i) in enumerate(ends):  # newest first: ties go to the newest continuation
        seq = index.seqs[s]
        for d in range(1, min(depth, len(seq) - 1 - i) + 1):
            path = tuple(seq[i + 1 : i + 1 + d])
            tries.setdefault(path, [0, rank])[0] += 1
    heap = [(-c, rank, path) for path, (c, rank) in tries.items() if len(path) == 1]
    heapq.heapify(heap)
    chosen: dict[tuple[int, ...], int] = {}
    nodes: list[_Node] = []
    while heap and len(nodes) < size:
        neg, rank, path = heapq.heappop(heap)
        if -neg / total < min_prob:
            break
        chosen[path] = len(nodes)
        nodes.append(_Node(path[-1], chosen[path[:-1]] if len(path) > 1 else -1, -neg, rank))
        for child, (c, r) in tries.items():  # (a dict scan: continuations are short and few)
            if len(child) == len(path) + 1 and child[:-1] == path:
                heapq.heappush(heap, (-c, r, child))
    order = _breadth_first(nodes)
    where = {n: k for k, n in enumerate(order)}
    parents = [where[nodes[n].parent] if nodes[n].parent >= 0 else -1 for n in order]
    return Draft([nodes[n].token for n in order], parents)


def _breadth_first(nodes: list[_Node]) -> list[int]:
    """Node indices level by level, each node's children best first (more occurrences, then the newer)."""
    children: dict[int, list[int]] = {}
    for n, node in enumerate(nodes):
        children.setdefault(node.parent, []).append(n)

    def best_first(kids: list[int]) -> list[int]:
        return sorted(kids, key=lambda n: (-nodes[n].count, nodes[n].rank))

    order, level = [], best_first(children.get(-1, []))
    while level:
        order += level
        level = [c for n in level for c in best_first(children.get(n, []))]
    return order


class SuffixDrafter(Drafter):
    """Per row, an index of the session's earlier outputs and of the row's own text as it grows; a tree per row from
    its longest match, on the host (nothing to batch)."""

    name = "suffix"

    def __init__(self, tokens: int = 16, factor: float = 1.0, min_prob: float = 0.1, session: list | None = None):
        self.tokens, self.factor, self.min_prob = tokens, factor, min_prob
        # (prompt, text) of every row begun with this target in this process; each text is the row's live token
        # list, so an output joins the corpus as it is decoded, with no end-of-run hook
        self.session = session if session is not None else []
        self.reset(1)

    def reset(self, rows: int) -> None:
        super().reset(rows)
        self.indexes: list[SuffixIndex | None] = [None] * rows
        self.own = [0] * rows  # per row: its text's sequence in its index

    def begin(self, row: int, state: DecodeState) -> None:
        prompt = state.tokens[: state.prompt_len]
        index = SuffixIndex()
        for earlier, text in self.session:
            if earlier != prompt:  # a repeat of this prompt would read its answer off its own earlier output
                index.add(text[len(earlier) :])
        self.own[row] = index.add(state.tokens)  # the live list: `extend` indexes what each step appends
        self.indexes[row] = index
        self.session.append((prompt, state.tokens))
        while sum(len(text) for _, text in self.session) > SESSION_TOKENS:
            del self.session[0]

    def propose(self, states: list[DecodeState | None], max_tokens: list[int]) -> list[Draft]:
        drafts = []
        for b, (state, most) in enumerate(zip(states, max_tokens)):
            index = self.indexes[b]
            if state is None or most < 1 or index is None:
                drafts.append(Draft())
                continue
            index.extend(self.own[b])  # the tokens committed since the row's last draft
            length, ends = index.occurrences(state.tokens)
            size = min(self.tokens, math.ceil(self.factor * length))
            drafts.append(continuation_tree(index, ends, size, most, self.min_prob) if ends else Draft())
        return drafts

    def settings(self) -> dict:
        return {"tokens": self.tokens, "factor": self.factor, "min_prob": self.min_prob}


@dataclass
class SuffixOptions:
    tokens: int = knob(16, "the most nodes a step's tree may have", lo=1, hi=64)
    factor: float = knob(1.0, "tree nodes per matched token: a longer match earns a larger tree", lo=0.1, hi=8.0)
    min_prob: float = knob(
        0.1,
        "leave out a node whose path followed the match in fewer than this share of its occurrences",
        lo=0.0,
        hi=1.0,
    )


def build(ctx: BuildContext) -> SuffixDrafter:
    o = ctx.options
    session = _SESSIONS.setdefault(ctx.target.model, [])  # this target's earlier outputs in this process
    return SuffixDrafter(o.tokens, o.factor, o.min_prob, session)


def serve(o: SuffixOptions, part: str | None) -> Serving:
    return Serving(
        vllm={
            "method": "suffix",
            "num_speculative_tokens": o.tokens,
            "suffix_decoding_max_spec_factor": o.factor,
            "suffix_decoding_min_token_prob": o.min_prob,
        },
        notes=[
            "vLLM's suffix decoding needs the arctic-inference package; its global tree holds finished requests, as "
            "Glance's session tree holds earlier runs",
            "SGLang and transformers have no suffix decoding",
        ],
    )


SPEC = DrafterSpec(
    name="suffix",
    label="suffix decoding",
    color="#f06292",
    summary="continuations of the longest match in a suffix index of the prompt, the output and the session's "
    "earlier outputs (Oliaro et al. 2024)",
    build=build,
    options=SuffixOptions,
    serve=serve,
    # as prompt lookup's: host lookups cost next to nothing and the tree shrinks with the match by itself, so at one
    # row a cap only loses tokens (it tells no hindsight for the budget to learn from plain steps); capped in batches
    budget=BudgetTraits(depth_cap="batches"),
)
