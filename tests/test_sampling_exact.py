"""Sampling through the whole loop: vanilla at temperature 1 emits tokens distributed exactly as the target's.

The prefill token is sampled from the target directly, so the check is on the second token, which comes out of a
verification step (max_new_tokens=3 leaves that step a one-token draft; with 2 it would draft nothing); its exact
marginal is sum_a p(a | prompt) p(b | prompt, a), computed from the target.
"""

import torch
from scipy.stats import chisquare

from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.vanilla import VanillaDrafter
from tests.conftest import tiny_model

V = 12
PROMPT = [3, 7, 1]


@torch.no_grad()
def exact_second_token(target, prompt: list[int] = PROMPT) -> torch.Tensor:
    """sum_a p(a | prompt) p(b | prompt, a): the exact distribution [V] of the second sampled token."""
    vocab = target.config.vocab_size
    p0 = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1], -1)  # [V]
    nxt = torch.softmax(target(input_ids=torch.tensor([prompt + [a] for a in range(vocab)])).logits[:, -1], -1)
    return p0 @ nxt  # [V]


def second_token_pvalue(target, drafter, prompt: list[int], new: int, drafted: int, n: int = 600) -> float:
    """Sample `n` runs of `new` tokens at temperature 1 and return the chi-square p-value of their second tokens
    against `exact_second_token`; every run's first verification step must have gone through at least `drafted`
    draft tokens (else the rule under test was never used)."""
    counts = torch.zeros(target.config.vocab_size)
    for seed in range(n):
        res = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=new).generate(prompt)
        counts[res.tokens[1]] += 1
        assert len(res.events[1].draft_tokens) >= drafted
    return chisquare(counts.numpy(), exact_second_token(target, prompt).numpy() * n).pvalue


def test_vanilla_sampling_matches_target_distribution():
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    draft = tiny_model("llama", seed=9, vocab=V, sharpen=6.0)  # an unrelated draft: q differs from p
    drafter = VanillaDrafter(draft, gamma=3)
    counts = torch.zeros(V)
    n = 600
    for seed in range(n):
        res = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=3).generate(PROMPT)
        counts[res.tokens[1]] += 1
        assert len(res.events[1].draft_tokens) == 1  # the second token went through Leviathan's rule
    expected = exact_second_token(target)
    with torch.no_grad():  # the draft must disagree with the target, or any rule would pass
        p = torch.softmax(target(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
        q = torch.softmax(draft(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    assert float((p - q).abs().sum()) / 2 > 0.3
    pv = chisquare(counts.numpy(), expected.numpy() * n).pvalue
    assert pv > 1e-3, (pv, counts, expected * n)


def test_vanilla_with_confidence_stop_matches_target_distribution():
    """Stopping the chain on the draft's own doubt reads only the draft's side: the output stays exact."""
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    draft = tiny_model("llama", seed=9, vocab=V, sharpen=6.0)
    drafter = VanillaDrafter(draft, gamma=4, confidence=0.5)
    counts = torch.zeros(V)
    n, short = 600, 0
    for seed in range(n):
        res = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=5).generate(PROMPT)
        counts[res.tokens[1]] += 1
        short += len(res.events[1].draft_tokens) < 3
    assert short > 30  # the stop did cut chains
    pv = chisquare(counts.numpy(), exact_second_token(target).numpy() * n).pvalue
    assert pv > 1e-3, (pv, counts)


def test_vanilla_with_a_draft_vocabulary_matches_target_distribution():
    """A draft whose LM head reads a few target ids only (q zero elsewhere, as FR-Spec) stays exact; its own
    probabilities, which the confidence stop reads, are looked up by column."""
    from engine.heads.draft_vocab import narrow_lm_head

    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    draft = tiny_model("llama", seed=9, vocab=V, sharpen=6.0)
    ids = torch.tensor([0, 2, 3, 5, 7, 8, 10])
    narrow_lm_head(draft, ids)
    drafter = VanillaDrafter(draft, gamma=3, target_vocab=V, draft_ids=ids, confidence=0.2)
    counts = torch.zeros(V)
    n = 600
    for seed in range(n):
        res = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=4).generate(PROMPT)
        counts[res.tokens[1]] += 1
        drafted = res.events[1].draft_tokens
        assert drafted and set(drafted) <= set(ids.tolist())  # from the draft vocabulary only
    assert counts[[i for i in range(V) if i not in ids]].sum() > 0  # the target still emits the others
    pv = chisquare(counts.numpy(), exact_second_token(target).numpy() * n).pvalue
    assert pv > 1e-3, (pv, counts)
