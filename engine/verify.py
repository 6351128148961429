"""Verification: which draft nodes the target accepts, and the target's own ("bonus") token after them.

Row 0 of the target's probabilities belongs to the root (the pending token), row i + 1 to draft node i; the
distribution at a node's row is the target's prediction for that node's children.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling import SamplingConfig, logits_to_probs, sample
from engine.tree import Draft


@dataclass
class Verdict:
    accepted: list[int]  # node indices of the accepted root-to-node path
    bonus: int  # the target's token after the accepted path
    bonus_row: int  # row of the target output that produced the bonus (0 = root)


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))


def verify_greedy(draft: Draft, target_logits: torch.Tensor) -> Verdict:
    """Longest path whose every token equals the target's argmax at its parent. target_logits: [1 + n, V]."""
    best = target_logits.argmax(-1).tolist()  # [1 + n]
    node, accepted = -1, []
    while True:
        row = node + 1
        nxt = next((c for c in draft.children(node) if draft.tokens[c] == best[row]), None)
        if nxt is None:
            return Verdict(accepted, best[row], row)
        accepted.append(nxt)
        node = nxt


def verify_sampled_chain(draft: Draft, p: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Leviathan et al. 2023 for a chain sampled from q: accept x with min(1, p(x)/q(x)); on rejection sample
    norm(max(0, p - q)); when all are accepted, sample the bonus from p. p: [1 + n, V], draft.q_probs: [n, V]."""
    assert draft.q_probs is not None and draft.is_chain()
    q = draft.q_probs
    for i, x in enumerate(draft.tokens):
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and _uniform(generator) < min(1.0, px / qx):
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: any sample from p is exact
            residual = p[i]
        return Verdict(list(range(i)), sample(residual / residual.sum(), generator), i)
    n = len(draft)
    return Verdict(list(range(n)), sample(p[n], generator), n)


def verify_candidates(draft: Draft, p: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Deterministic candidates (top-k trees, n-grams, greedy drafts): walk a node's children in order, accept child
    x with probability p(x); on rejection set p(x) = 0 and renormalise; none left, sample from what remains.
    Each emitted token is distributed exactly as p. p: [1 + n, V]."""
    node, accepted = -1, []
    while True:
        row = node + 1
        remaining = p[row].clone()
        nxt = None
        for c in draft.children(node):
            x = draft.tokens[c]
            mass = float(remaining.sum())
            if mass <= 0:
                break
            if _uniform(generator) < float(remaining[x]) / mass:
                nxt = c
                break
            remaining[x] = 0.0
        if nxt is None:
            if float(remaining.sum()) <= 0:  # rounding ate the mass: fall back to the full distribution
                remaining = p[row]
            return Verdict(accepted, sample(remaining / remaining.sum(), generator), row)
        accepted.append(nxt)
        node = nxt


def verify_typical(
    draft: Draft, p: torch.Tensor, generator: torch.Generator | None, eps: float, alpha: float
) -> Verdict:
    """Medusa's typical acceptance (APPROXIMATE: output no longer follows the target's distribution exactly).
    A node passes when p(token) > min(eps, alpha * exp(-H(p))) at its parent; the longest passing path wins and
    the bonus is sampled from p after it. p: [1 + n, V]."""
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)  # [1 + n]
    threshold = torch.clamp(alpha * torch.exp(-entropy), max=eps)
    passes = [
        float(p[parent + 1, tok]) > float(threshold[parent + 1]) for tok, parent in zip(draft.tokens, draft.parents)
    ]
    best: list[int] = []

    def walk(node: int, path: list[int]) -> None:
        nonlocal best
        if len(path) > len(best):
            best = list(path)
        for c in draft.children(node):
            if passes[c]:
                walk(c, path + [c])

    walk(-1, [])
    row = best[-1] + 1 if best else 0
    return Verdict(best, sample(p[row], generator), row)


def verify(
    draft: Draft, target_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """Pick the rule: greedy at temperature 0, Medusa's typical acceptance when the draft asks for it, Leviathan's
    for sampled chains, the deterministic-candidate rule otherwise."""
    if cfg.greedy:
        return verify_greedy(draft, target_logits)
    p = logits_to_probs(target_logits, cfg)  # [1 + n, V]
    if draft.typical is not None:
        return verify_typical(draft, p, generator, *draft.typical)
    if draft.sampled:
        if not draft.is_chain():
            raise ValueError("sampled drafts must be chains; trees use deterministic candidates")
        return verify_sampled_chain(draft, p, generator)
    return verify_candidates(draft, p, generator)
