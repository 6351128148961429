"""Verification: which draft nodes the target accepts, and the target's own ("bonus") token after them.

Row 0 of the target's probabilities belongs to the root (the pending token), row i + 1 to draft node i; the
distribution at a node's row is the target's prediction for that node's children.
"""

from __future__ import annotations

import math
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
    """Medusa's typical acceptance (APPROXIMATE: output no longer follows the target's distribution exactly), as
    FasterDecoding/Medusa's `evaluate_posterior` and `get_typical_one_token` do it. A node passes when p(token) >
    min(eps, alpha * exp(-H(p))) at its parent; the longest passing path wins, and among paths of that length the
    most likely one (the largest sum of log p); the bonus is sampled from p after it with every token under that
    row's threshold removed. p: [1 + n, V]."""
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # [1 + n], with the reference's 1e-5
    threshold = torch.clamp(alpha * torch.exp(-entropy), max=eps)  # [1 + n]
    rows = [parent + 1 for parent in draft.parents]
    token_p = p[rows, draft.tokens].tolist() if len(draft) else []  # one transfer for every node
    limits = threshold[rows].tolist() if len(draft) else []
    best: tuple[int, float, list[int]] = (0, 0.0, [])  # (length, log-likelihood, path)

    def walk(node: int, path: list[int], loglik: float) -> None:
        nonlocal best
        if (len(path), loglik) > best[:2]:
            best = (len(path), loglik, list(path))
        for c in draft.children(node):
            if token_p[c] > limits[c]:
                walk(c, path + [c], loglik + math.log(max(token_p[c], 1e-30)))

    walk(-1, [], 0.0)
    path = best[2]
    row = path[-1] + 1 if path else 0
    typical = torch.where(p[row] < threshold[row], torch.zeros_like(p[row]), p[row])  # [V]
    if float(typical.sum()) <= 0:  # every token under the threshold: keep the most likely one
        typical = torch.nn.functional.one_hot(p[row].argmax(), p.shape[-1]).to(p.dtype)
    return Verdict(path, sample(typical / typical.sum(), generator), row)


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
