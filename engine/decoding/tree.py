"""A draft as a token tree in flat arrays, and what it implies for the verifying forward pass.

Node i has token `tokens[i]` and parent `parents[i]` (-1 = the root, i.e. the pending token whose KV is not yet
cached). The verifying forward runs over [root] + nodes, so row 0 of its output belongs to the root and row i + 1
to node i. A chain is a tree whose node i has parent i - 1; plain decoding is the empty tree.

A draft may also carry a side branch (lookahead's Jacobi window): m more tokens appended after the nodes, run in the
same forward under their own mask and positions, never visible to the nodes (nor the nodes to them), never verified,
and dropped from the cache by compaction. Rows 1 + n .. 1 + n + m of the output belong to them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.records.events import DraftNotes


@dataclass
class Draft:
    """What a drafter proposes for one step."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # Draft distribution each node was sampled from, [n, V], only when tokens were sampled (Leviathan's rule applies).
    q_probs: torch.Tensor | None = None
    notes: DraftNotes = field(default_factory=DraftNotes)  # what the drafter wants shown (the step event's)
    # Medusa's typical acceptance (epsilon, alpha): an approximate rule, used only when set.
    typical: tuple[float, float] | None = None
    # Side branch: tokens, positions relative to the root, and which side tokens each may see ([m, m] bool);
    # every side token also sees the cache and the root.
    side_tokens: list[int] = field(default_factory=list)
    side_offsets: list[int] = field(default_factory=list)
    side_visible: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must precede their children")
        m = len(self.side_tokens)
        if len(self.side_offsets) != m:
            raise ValueError("side tokens and side offsets must have the same length")
        if m and (self.side_visible is None or tuple(self.side_visible.shape) != (m, m)):
            raise ValueError(f"a side branch of {m} tokens needs an [{m}, {m}] visibility matrix")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def sampled(self) -> bool:
        return self.q_probs is not None

    @classmethod
    def chain(cls, tokens: list[int], q_probs: torch.Tensor | None = None) -> Draft:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q_probs)

    def depths(self) -> list[int]:
        return node_depths(self.parents)

    def children(self, node: int) -> list[int]:
        """Children of `node` (-1 for the root), in proposal order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def is_chain(self) -> bool:
        return is_chain(self.parents)

    def spine(self) -> Draft:
        """The draft's greedy spine: the root's first child, that node's first child, and so on (every drafter lists
        a node's children best first). A subset that keeps every node's ancestors, so verifying it is as exact as
        verifying the whole tree; a chain is its own spine. Side branches stay (they verify independently)."""
        keep = spine_nodes(self.parents)
        if len(keep) == len(self.tokens):
            return self
        q = self.q_probs[keep] if self.q_probs is not None else None  # [d, V]
        return Draft(
            [self.tokens[i] for i in keep], list(range(-1, len(keep) - 1)), q, self.notes, self.typical,
            self.side_tokens, self.side_offsets, self.side_visible,
        )  # fmt: skip


def spine_nodes(parents: list[int]) -> list[int]:
    """The nodes of the greedy spine (Draft.spine): the root's first child, its first child, and so on."""
    keep, parent = [], -1
    for i, p in enumerate(parents):
        if p == parent:
            keep.append(i)
            parent = i
    return keep


def is_chain(parents: list[int]) -> bool:
    """True when node i's parent is node i - 1 (a chain; the empty draft is one too)."""
    return parents == list(range(-1, len(parents) - 1))


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node; children of the root have depth 1."""
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """[1 + n, 1 + n] bool: row r may attend column c (c is r or an ancestor of r; the root is everyone's ancestor).
    Shared between calls with the same tree (static trees repeat every step): never modify the result."""
    return _ancestor_matrix(tuple(parents))


@functools.lru_cache(maxsize=256)
def _ancestor_matrix(parents: tuple[int, ...]) -> torch.Tensor:
    n = len(parents)
    visible = np.zeros((n + 1, n + 1), dtype=bool)  # numpy rows: a tenth of the cost of torch's per-row indexing
    visible[:, 0] = True
    for i, p in enumerate(parents):
        if p >= 0:
            visible[i + 1] = visible[p + 1]
        visible[i + 1, i + 1] = True
    return torch.from_numpy(visible)


def draft_visibility(parents: list[int], side_visible: torch.Tensor | None = None) -> torch.Tensor:
    """[1 + n + m, 1 + n + m] bool over root, nodes and side tokens: the tree's ancestor matrix, and a side block
    that sees the root and its own visible side tokens only."""
    tree = ancestor_matrix(parents)
    if side_visible is None or side_visible.numel() == 0:
        return tree
    n1, m = tree.shape[0], side_visible.shape[0]
    visible = torch.zeros(n1 + m, n1 + m, dtype=torch.bool)
    visible[:n1, :n1] = tree
    visible[n1:, 0] = True
    visible[n1:, n1:] = side_visible
    return visible


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """A boolean visibility [..., S, K] as the additive mask attention takes, with a head axis: [..., 1, S, K] for
    [B, S, K] input, [1, 1, S, K] for [S, K]. 0 where visible, dtype-min elsewhere (eager attention misreads bools)."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    mask = mask[:, None] if mask.dim() == 3 else mask[None, None]
    return mask.to(device)


@functools.lru_cache(maxsize=8)
def mask_storage(dtype: torch.dtype) -> tuple[type, object]:
    """The numpy dtype whose bits are `dtype`'s and `dtype`'s lowest value in it: an additive mask built in numpy and
    viewed as `dtype` needs no conversion pass (bfloat16 has no numpy type; its bits are a uint16)."""
    if dtype == torch.bfloat16:
        low = torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(torch.int16).item() & 0xFFFF
        return np.uint16, np.uint16(low)
    storage = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}[dtype]
    return storage, storage(torch.finfo(dtype).min)


def host_mask(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A numpy mask built in `mask_storage(dtype)` as a tensor of `dtype`, sharing its memory."""
    out = torch.from_numpy(array)
    return out if out.dtype == dtype else out.view(dtype)


@functools.lru_cache(maxsize=256)
def _hidden_block(parents: tuple[int, ...]) -> np.ndarray:
    """[1 + n, 1 + n] bool: True where a row may not look (not itself nor an ancestor). Shared: never modify it."""
    return ~_ancestor_matrix(parents).numpy()


def tree_attention_mask(
    parents: list[int],
    past_len: int,
    dtype: torch.dtype,
    device,
    side_visible: torch.Tensor | None = None,
    width: int | None = None,
) -> torch.Tensor:
    """Additive mask [1, 1, S, width] (S = 1 + n + m) over the cache and the draft; `width` (at least past_len + S,
    the default) lets a static cache's forward take it whole: columns past the draft are masked. Built in numpy and
    viewed as a tensor: the torch ops it took (zeros, concatenation, then the static forward's padding) cost about
    0.1 ms a step here, and converting float32 to bfloat16 a tenth of what is left."""
    hidden = (
        _hidden_block(tuple(parents))
        if side_visible is None or side_visible.numel() == 0  # a tree alone: its block is cached (trees repeat)
        else ~draft_visibility(parents, side_visible).numpy()
    )
    S = hidden.shape[0]
    storage, lowest = mask_storage(dtype)
    mask = np.full((S, max(width or 0, past_len + S)), lowest, dtype=storage)
    mask[:, :past_len] = 0  # the cache: visible to all
    mask[:, past_len : past_len + S] = np.where(hidden, lowest, storage(0))
    return host_mask(mask, dtype)[None, None].to(device)


def tree_position_ids(parents: list[int], past_len: int, device, side_offsets: list[int] | None = None) -> torch.Tensor:
    """[1, 1 + n + m]: the root sits at past_len, each node at past_len + its depth, side tokens at their offsets."""
    depths = node_depths(parents) + list(side_offsets or [])
    return torch.tensor([[past_len] + [past_len + d for d in depths]], device=device)


def ngram_trie(continuations: list[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
    """Merge continuations into a trie: (tokens, parents, node that ends each continuation)."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    ends: list[int] = []
    for cont in continuations:
        node = -1
        for tok in cont:
            key = (node, tok)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = index[key]
        ends.append(node)
    return tokens, parents, ends
