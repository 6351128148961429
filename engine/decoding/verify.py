"""Verification: which draft nodes the target accepts, and the target's own ("bonus") token after them.

Row 0 of the target's probabilities belongs to the root (the pending token), row i + 1 to draft node i; the
distribution at a node's row is the target's prediction for that node's children.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.decoding.sampling import SamplingConfig, logits_to_probs
from engine.decoding.tree import Draft


@dataclass
class Verdict:
    accepted: list[int]  # node indices of the accepted root-to-node path
    bonus: int  # the target's token after the accepted path
    bonus_row: int  # row of the target output that produced the bonus (0 = root)


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))


def verify_greedy(draft: Draft, target_logits: torch.Tensor, best: list[int] | None = None) -> Verdict:
    """Longest path whose every token equals the target's argmax at its parent. target_logits: [1 + n, V];
    `best`: those argmaxes when the caller has them (the compiled forward computes them in its graph)."""
    if best is None:
        best = target_logits.float().argmax(-1).tolist()  # [1 + n]
    node, accepted = -1, []
    while True:
        row = node + 1
        nxt = next((c for c in draft.children(node) if draft.tokens[c] == best[row]), None)
        if nxt is None:
            return Verdict(accepted, best[row], row)
        accepted.append(nxt)
        node = nxt


def _row_samples(residual: torch.Tensor, fallback: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row [R] drawn from each row of `residual` [R, V] normalised (from `fallback`'s row where the
    residual has no mass left), by inverse CDF with uniforms from the host generator: drawn on the device, read
    back with everything else in the step's one transfer."""
    mass = residual.sum(-1, keepdim=True)  # [R, 1]
    dist = torch.where(mass > 0, residual, fallback)
    cdf = dist.cumsum(-1)  # [R, V]
    u = torch.rand(dist.shape[0], 1, generator=generator).to(dist.device, cdf.dtype)  # [R, 1]
    picked = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # first index whose cdf exceeds u * total
    return picked.clamp(max=dist.shape[-1] - 1)[:, 0]


def verify_sampled_chain(draft: Draft, p: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Leviathan et al. 2023 for a chain sampled from q: accept x with min(1, p(x)/q(x)); on rejection sample
    norm(max(0, p - q)); when all are accepted, sample the bonus from p. p: [1 + n, V], draft.q_probs: [n, V].
    Every row's replacement token is drawn on the device beforehand (it is only used at the first rejection, and
    its draw is independent of the acceptance draws), so the step reads the device once."""
    assert draft.q_probs is not None and draft.is_chain()
    q = draft.q_probs.to(p.device, p.dtype)
    n = len(draft)
    rows = torch.arange(n, device=p.device)
    xs = torch.tensor(draft.tokens, device=p.device, dtype=torch.long)
    residual = torch.cat([torch.clamp(p[:n] - q, min=0.0), p[n:]])  # [1 + n, V]: the bonus row samples from p
    replacement = _row_samples(residual, p, generator)  # [1 + n]
    packed = torch.cat([p[rows, xs].double(), q[rows, xs].double(), replacement.double()]).tolist()  # one transfer
    px, qx, tokens = packed[:n], packed[n : 2 * n], [int(t) for t in packed[2 * n :]]
    for i in range(n):
        if qx[i] > 0 and _uniform(generator) < min(1.0, px[i] / qx[i]):
            continue
        return Verdict(list(range(i)), tokens[i], i)
    return Verdict(list(range(n)), tokens[n], n)


def verify_candidates(draft: Draft, p: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Deterministic candidates (top-k trees, n-grams, greedy drafts): walk a node's children in order, accept child
    x with probability p(x); on rejection set p(x) = 0 and renormalise; none left, sample from what remains.
    Each emitted token is distributed exactly as p. p: [1 + n, V].

    The walk needs only each node's p at its parent's row and each row's mass, and a rejection at a row means
    every child there was rejected, so the token sampled then comes from p without all of that row's children:
    drawn for every row beforehand on the device, the step reads the device once."""
    n = len(draft)
    parent_rows = torch.tensor([parent + 1 for parent in draft.parents], dtype=torch.long, device=p.device)
    xs = torch.tensor(draft.tokens, dtype=torch.long, device=p.device)
    residual = p.clone()
    if n:
        residual[parent_rows, xs] = 0.0  # each row without its children's tokens
    replacement = _row_samples(residual, p, generator)  # [1 + n]
    packed = torch.cat([p[parent_rows, xs].double(), p.sum(-1).double(), replacement.double()]).tolist()
    token_p, mass, tokens = packed[:n], packed[n : 2 * n + 1], [int(t) for t in packed[2 * n + 1 :]]
    node, accepted = -1, []
    while True:
        row = node + 1
        left, tried, nxt = mass[row], set(), None
        for c in draft.children(node):
            x = draft.tokens[c]
            px = 0.0 if x in tried else token_p[c]  # a repeated sibling was zeroed by its first rejection
            if left <= 0:
                break
            if _uniform(generator) < px / left:
                nxt = c
                break
            left -= px
            tried.add(x)
        if nxt is None:
            return Verdict(accepted, tokens[row], row)
        accepted.append(nxt)
        node = nxt


def verify_typical(
    draft: Draft, p: torch.Tensor, generator: torch.Generator | None, eps: float, alpha: float
) -> Verdict:
    """Medusa's typical acceptance (APPROXIMATE: output no longer follows the target's distribution exactly), as
    FasterDecoding/Medusa's `evaluate_posterior` and `get_typical_one_token` do it. A node passes when p(token) >
    min(eps, alpha * exp(-H(p))) at its parent; the longest passing path wins, and among paths of that length the
    most likely one (the largest sum of log p); the bonus is sampled from p after it with every token under that
    row's threshold removed (each row's bonus drawn beforehand on the device: the step reads the device once).
    p: [1 + n, V]."""
    n = len(draft)
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # [1 + n], with the reference's 1e-5
    threshold = torch.clamp(alpha * torch.exp(-entropy), max=eps)  # [1 + n]
    rows = torch.tensor([parent + 1 for parent in draft.parents], dtype=torch.long, device=p.device)
    xs = torch.tensor(draft.tokens, dtype=torch.long, device=p.device)
    typical = torch.where(p < threshold[:, None], torch.zeros_like(p), p)  # [1 + n, V]
    most_likely = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).to(p.dtype)  # when nothing passes
    bonus = _row_samples(typical, most_likely, generator)  # [1 + n]
    packed = torch.cat([p[rows, xs].double(), threshold[rows].double(), bonus.double()]).tolist()  # one transfer
    token_p, limits, bonus_of = packed[:n], packed[n : 2 * n], [int(t) for t in packed[2 * n :]]
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
    return Verdict(path, bonus_of[row], row)


def verify(
    draft: Draft,
    target_logits: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
    best: list[int] | None = None,
) -> Verdict:
    """Pick the rule: greedy at temperature 0, Medusa's typical acceptance when the draft asks for it, Leviathan's
    for sampled chains, the deterministic-candidate rule otherwise. `best`: each row's argmax, if known."""
    if cfg.greedy:
        return verify_greedy(draft, target_logits, best)
    p = logits_to_probs(target_logits, cfg)  # [1 + n, V]
    if draft.typical is not None:
        return verify_typical(draft, p, generator, *draft.typical)
    if draft.sampled:
        if not draft.is_chain():
            raise ValueError("sampled drafts must be chains; trees use deterministic candidates")
        return verify_sampled_chain(draft, p, generator)
    return verify_candidates(draft, p, generator)
