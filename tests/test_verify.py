"""Verification rules: greedy picks the longest matching path; both sampling rules reproduce the target exactly.

The sampling tests draw the first two emitted tokens many times and compare their joint distribution with the
target's own, P0(a) * P1[a](b), by a chi-square test at a fixed seed. Each test also runs a subtly wrong rule
through the same check and asserts that it fails, so the test has the power to catch a broken residual.
"""

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.sampling import SamplingConfig, logits_to_probs, sample
from engine.decoding.tree import Draft
from engine.decoding.verify import Verdict, verify_candidates, verify_greedy, verify_sampled_chain

V = 6


def test_greedy_takes_longest_matching_path():
    # tree: root -> [1, 2]; node0(1) -> [3]; node1(2) -> [4, 5]
    draft = Draft([1, 2, 3, 4, 5], [-1, -1, 0, 1, 1])
    logits = torch.full((6, V), -5.0)
    best = {0: 2, 1: 0, 2: 5, 3: 0, 4: 0, 5: 0}  # root wants 2; node1 (row 2) wants 5; node4 (row 5) wants 0
    for row, tok in best.items():
        logits[row, tok] = 5.0
    v = verify_greedy(draft, logits)
    assert v.accepted == [1, 4] and v.bonus == 0 and v.bonus_row == 5
    # the same from the rows' argmax alone (what the compiled forward hands over), not the logits
    assert verify_greedy(draft, torch.zeros(6, V), [best[r] for r in range(6)]) == v


def test_greedy_rejects_everything():
    draft = Draft.chain([1, 2])
    logits = torch.zeros(3, V)
    logits[0, 3] = 1.0
    assert verify_greedy(draft, logits) == Verdict([], 3, 0)


def _dists(seed):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.softmax(torch.randn(*shape, V, generator=g) * 1.5, -1)

    return rnd


def _joint_counts(trial, n, gen):
    counts = torch.zeros(V * V)
    for _ in range(n):
        a, b = trial(gen)
        counts[a * V + b] += 1
    return counts


def _pvalue(counts, expected):
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token with zero target probability was emitted"
    scale = counts.sum().item() / expected[mask].sum().item()
    return chisquare(counts[mask].numpy(), expected[mask].numpy() * scale).pvalue


def _wrong_leviathan(draft, p, gen):
    """Bug on purpose: resample from p instead of norm(max(0, p - q)) after a rejection."""
    q = draft.q_probs
    for i, x in enumerate(draft.tokens):
        if float(torch.rand((), generator=gen)) < min(1.0, float(p[i, x] / q[i, x])):
            continue
        return Verdict(list(range(i)), sample(p[i], gen), i)
    return Verdict(list(range(len(draft))), sample(p[len(draft)], gen), len(draft))


@pytest.mark.parametrize("rule,should_pass", [(verify_sampled_chain, True), (_wrong_leviathan, False)])
def test_leviathan_chain_is_exact(rule, should_pass):
    rnd = _dists(0)
    P0, P1, P2 = rnd(), rnd(V), rnd(V, V)  # target: P1[a] = p(. | a)
    Q0, Q1 = rnd(), rnd(V)  # draft, deliberately different

    def trial(gen):
        x0 = sample(Q0, gen)
        x1 = sample(Q1[x0], gen)
        draft = Draft.chain([x0, x1], torch.stack([Q0, Q1[x0]]))
        p = torch.stack([P0, P1[x0], P2[x0, x1]])
        v = rule(draft, p, gen)
        out = [draft.tokens[i] for i in v.accepted] + [v.bonus]
        if len(out) < 2:
            out.append(sample(P1[out[0]], gen))
        return out[0], out[1]

    counts = _joint_counts(trial, 12000, torch.Generator().manual_seed(1))
    expected = (P0[:, None] * P1).reshape(-1)
    pv = _pvalue(counts, expected)
    assert (pv > 1e-3) if should_pass else (pv < 1e-6), pv


def _wrong_candidates(draft, p, gen):
    """Bug on purpose: accept each candidate with its raw p(x), never renormalising after a rejection."""
    node, accepted = -1, []
    while True:
        row = node + 1
        nxt = next(
            (c for c in draft.children(node) if float(torch.rand((), generator=gen)) < float(p[row, draft.tokens[c]])),
            None,
        )
        if nxt is None:
            return Verdict(accepted, sample(p[row], gen), row)
        accepted.append(nxt)
        node = nxt


@pytest.mark.parametrize("rule,should_pass", [(verify_candidates, True), (_wrong_candidates, False)])
def test_candidate_rule_is_exact(rule, should_pass):
    rnd = _dists(2)
    P0, P1 = rnd(), rnd(V)
    # hand-made candidate tree: root -> [2, 0, 4]; node 0 (token 2) -> [1, 3]; node 1 (token 0) -> [5]
    draft = Draft([2, 0, 4, 1, 3, 5], [-1, -1, -1, 0, 0, 1])

    def trial(gen):
        p = torch.stack([P0] + [P1[t] for t in draft.tokens])
        v = rule(draft, p, gen)
        out = [draft.tokens[i] for i in v.accepted] + [v.bonus]
        if len(out) < 2:
            out.append(sample(P1[out[0]], gen))
        return out[0], out[1]

    counts = _joint_counts(trial, 12000, torch.Generator().manual_seed(3))
    pv = _pvalue(counts, (P0[:, None] * P1).reshape(-1))
    assert (pv > 1e-3) if should_pass else (pv < 1e-6), pv


def test_top_p_and_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    full = torch.softmax(logits, -1)
    assert p[3] == 0 and p[2] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))  # 0.64 + 0.24 reaches 0.8
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())
    cold = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert cold[0] > full[0]
    assert logits_to_probs(logits, SamplingConfig()).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_typical_acceptance_prefers_the_most_likely_of_equally_long_paths():
    """FasterDecoding/Medusa's rule: the longest passing path, and among equally long ones the most likely; the
    bonus comes from the target's row with every token under the threshold removed."""
    from engine.decoding.verify import verify_typical

    V = 6
    p = torch.full((5, V), 0.02)
    p[0, :] = torch.tensor([0.45, 0.45, 0.04, 0.02, 0.02, 0.02])  # root: tokens 0 and 1 both pass
    p[1, :] = torch.tensor([0.02, 0.02, 0.30, 0.62, 0.02, 0.02])  # after node 0 (token 0): token 3 likelier
    p[2, :] = torch.tensor([0.02, 0.02, 0.90, 0.02, 0.02, 0.02])  # after node 1 (token 1): token 2 very likely
    for row in (3, 4):
        p[row, :] = torch.tensor([0.5, 0.3, 0.14, 0.02, 0.02, 0.02])
    # nodes: 0 = token 0 (root), 1 = token 1 (root), 2 = token 3 after node 0, 3 = token 2 after node 1
    draft = Draft([0, 1, 3, 2], [-1, -1, 0, 1])
    bonus_seen = set()
    for seed in range(200):
        v = verify_typical(draft, p, torch.Generator().manual_seed(seed), 0.09, 0.3)
        # both two-node paths pass; 0.45 * 0.90 beats 0.45 * 0.62: the path through node 1 wins
        assert v.accepted == [1, 3] and v.bonus_row == 4
        bonus_seen.add(v.bonus)
    assert bonus_seen <= {0, 1, 2} and {0, 1} <= bonus_seen  # tokens under the threshold are never sampled


@pytest.mark.parametrize("rule", ["greedy", "candidates", "chain", "typical"])
def test_verification_reads_the_device_once(monkeypatch, rule):
    """On a GPU every read of a tensor's value waits for the device: each rule reads it once per step. The
    acceptance uniforms come from the host generator; here a Python one, so that any tensor read counted is one
    of the target's rows."""
    import random

    import engine.decoding.verify as verify_mod

    rng = random.Random(0)
    monkeypatch.setattr(verify_mod, "_uniform", lambda generator: rng.random())
    reads = []
    for name in ("tolist", "item", "__float__", "__int__", "__index__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            reads.append(self.shape)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    rnd = _dists(5)
    tree = Draft([1, 2, 3, 4, 5], [-1, -1, 0, 1, 1])
    chain = Draft.chain([1, 2, 3], rnd(3))
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):  # accepted and rejected paths alike
        p = rnd(6)
        reads.clear()
        if rule == "greedy":
            verify_mod.verify_greedy(tree, p.log())
        elif rule == "candidates":
            verify_mod.verify_candidates(tree, p, gen)
        elif rule == "chain":
            verify_mod.verify_sampled_chain(chain, p[:4], gen)
        else:
            verify_mod.verify_typical(tree, p, gen, 0.09, 0.3)
        assert len(reads) == 1, (trial, reads)
