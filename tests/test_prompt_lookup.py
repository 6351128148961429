"""Prompt lookup decoding: the lookup itself, lossless greedy output on every architecture, exact sampling, and the
registry wiring it up (its CLI flags) without any other file naming it."""

import pytest
import torch
from scipy.stats import chisquare

from engine.cli import main
from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.prompt_lookup import PromptLookupDrafter, lookup
from tests.conftest import ARCHS, tiny_model
from tests.test_lookahead import LOOPY
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import exact_second_token


def test_lookup_finds_the_newest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 2) == [7, 1]  # newest earlier occurrence of (1, 2, 3)
    assert lookup([5, 6, 1, 2, 8, 2], 3, 3) == [8, 2]  # (1, 2) ... only "2" recurs: the 1-gram match
    assert lookup([1, 2, 3], 3, 4) == []  # nothing recurs
    assert lookup([4], 3, 4) == []


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("max_ngram,count", [(3, 8), (1, 2), (5, 16)])
def test_prompt_lookup_greedy_is_lossless(arch, max_ngram, count):
    target = tiny_model(arch, seed=0, sharpen=4.0)
    accepted = 0
    for prompt in PROMPTS + [LOOPY]:
        res = Decoder(target, PromptLookupDrafter(max_ngram, count), max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt), (prompt, res.tokens)
        accepted += sum(len(e.accepted_nodes) for e in res.events)
    assert accepted > 0  # matches were proposed and accepted: the speculative path ran


def test_prompt_lookup_exact_sampling_matches_target():
    """The second token's distribution when it comes out of verifying a looked-up chain (every token recurs)."""
    V = 12
    prompt = [3, 7, 1, 0, 5, 2, 9, 4, 11, 6, 8, 10, 3, 1, 7, 0, 2, 5, 4, 9, 6, 11, 10, 8, 3]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    counts, n, drafted = torch.zeros(V), 1000, 0
    for seed in range(n):
        dec = Decoder(target, PromptLookupDrafter(2, 3), SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=3)
        res = dec.generate(prompt)
        counts[res.tokens[1]] += 1
        drafted += bool(res.events[1].draft_tokens)
    assert drafted > 0.9 * n
    assert chisquare(counts.numpy(), exact_second_token(target, prompt).numpy() * n).pvalue > 1e-3


def test_the_cli_offers_it_from_the_registry(model_folders, capsys):
    common = ["--target", str(model_folders["target"]), "--prompt", "def add(a, b):", "--max-new-tokens", "12"]
    assert main(["generate", "--method", "ar", *common, "--dtype", "float32", "--json"]) == 0
    ar = capsys.readouterr().out
    argv = ["generate", "--method", "prompt_lookup", "--prompt-lookup-ngram", "2", "--prompt-lookup-tokens", "4"]
    assert main([*argv, *common, "--dtype", "float32", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == json.loads(ar)["token_ids"]
    assert out["settings"]["max_ngram"] == 2 and out["settings"]["tokens"] == 4
    assert main([*argv[:3], "--prompt-lookup-tokens", "0", *common]) == 2
    assert "--prompt-lookup-tokens must be between 1 and 32" in capsys.readouterr().err
