"""Tree arrays -> masks and positions, checked against definitions written out by brute force."""

import pytest
import torch

from engine.decoding.tree import Draft, tree_attention_mask, tree_position_ids

TREES = [
    [],  # plain decoding
    [-1, 0, 1, 2],  # a chain
    [-1, -1, 0, 0, 1, 2, 5],  # a branching tree
]


def brute_force_visible(parents, past):
    n = len(parents)
    vis = torch.zeros(n + 1, past + n + 1, dtype=torch.bool)
    vis[:, :past] = True
    for row in range(n + 1):
        vis[row, past] = True  # the root
        node = row - 1
        while node >= 0:
            vis[row, past + 1 + node] = True
            node = parents[node]
    return vis


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mask_matches_ancestry(parents, dtype):
    past = 3
    mask = tree_attention_mask(parents, past, dtype, "cpu")
    assert mask.shape == (1, 1, len(parents) + 1, past + len(parents) + 1)
    assert mask.dtype == dtype
    expect = brute_force_visible(parents, past)
    assert torch.equal(mask[0, 0] == 0, expect)
    assert torch.all(mask[0, 0][~expect] == torch.finfo(dtype).min)
    wide = tree_attention_mask(parents, past, dtype, "cpu", width=past + len(parents) + 9)  # a static cache's
    assert wide.shape[-1] == past + len(parents) + 9 and torch.equal(wide[..., : mask.shape[-1]], mask)
    assert torch.all(wide[..., mask.shape[-1] :] == torch.finfo(dtype).min)  # stale entries past the draft


def test_positions_follow_depth():
    parents = [-1, -1, 0, 0, 1, 2, 5]
    pos = tree_position_ids(parents, 10, "cpu")
    assert pos.tolist() == [[10, 11, 11, 12, 12, 12, 13, 14]]


def test_draft_structure():
    d = Draft([5, 6, 7, 8], [-1, -1, 0, 2])
    assert d.depths() == [1, 1, 2, 3]
    assert d.children(-1) == [0, 1]
    assert d.path_to(3) == [0, 2, 3]
    assert not d.is_chain()
    assert Draft.chain([1, 2, 3]).is_chain()
    with pytest.raises(ValueError):
        Draft([1, 2], [1, -1])  # a parent after its child


def test_acceptance_by_depth():
    from engine.records.metrics import DepthAcceptance

    acc = DepthAcceptance()
    acc.add([-1, 0, 1, 2], 4)  # a chain of 4, all accepted
    acc.add([-1, 0, 1, 2], 1)  # depth 1 accepted, depth 2 rejected, depths 3-4 never reached
    acc.add([-1, -1, 0], 0)  # a tree rejected at depth 1
    acc.add([], 0)  # plain decoding: nothing proposed
    assert acc.reached == [3, 2, 1, 1]
    assert acc.rates() == [2 / 3, 1 / 2, 1.0, 1.0]


def test_a_drafts_spine_is_its_chain_of_first_children():
    """Draft.spine keeps the root's first child, its first child, and so on (children are listed best first), with
    their rows of q_probs: a subset that keeps every node's ancestors."""
    tree = Draft([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 1, 2], q_probs=torch.eye(6))
    spine = tree.spine()
    assert spine.tokens == [10, 12, 15] and spine.parents == [-1, 0, 1]
    assert torch.equal(spine.q_probs, torch.eye(6)[[0, 2, 5]])
    chain = Draft.chain([1, 2, 3])
    assert chain.spine() is chain
    assert Draft().spine().tokens == []
