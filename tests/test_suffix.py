"""Suffix decoding: the suffix index and the tree it grows, lossless greedy output on every architecture, exact
sampling, the session's earlier outputs, and the registry wiring it up (flags, the app's lane) with no other file
naming it."""

import pytest
import torch
from scipy.stats import chisquare

from engine.cli import main
from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.suffix import SuffixDrafter, SuffixIndex, continuation_tree
from tests.conftest import ARCHS, batch_decoder, tiny_model
from tests.test_lookahead import LOOPY
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import exact_second_token


def test_the_longest_match_and_its_continuations_make_a_tree_best_first():
    index = SuffixIndex()
    index.add([9, 1, 2, 3, 4, 7, 1, 2, 3, 4, 8, 5, 2, 3, 5, 6, 1, 2, 3])
    length, ends = index.occurrences(index.seqs[0])
    assert length == 3 and ends == [(0, 8), (0, 3)]  # (1, 2, 3) twice before; (2, 3) alone once more: not longest
    tree = continuation_tree(index, ends, size=4, depth=3, min_prob=0.0)
    assert tree.tokens == [4, 8, 7, 5] and tree.parents == [-1, 0, 0, 1]  # 4 always followed; then 8 and 7 once each
    assert tree.spine().tokens == [4, 8, 5]  # children best first: the spine is the newest, most frequent path
    assert continuation_tree(index, ends, size=4, depth=1, min_prob=0.0).tokens == [4]  # one token deep
    assert continuation_tree(index, ends, size=4, depth=3, min_prob=0.6).tokens == [4]  # 8 and 7 followed half
    assert index.occurrences([5, 5, 5])[0] == 1  # a single token matches where no pair does
    assert index.occurrences([11]) == (0, [])


def test_a_longer_match_earns_a_larger_tree():
    drafter = SuffixDrafter(tokens=16, factor=1.0, min_prob=0.0)
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    state = _state(text)
    drafter.begin(0, state)
    (draft,) = drafter.propose([state], [16])
    assert draft.tokens == [13, 1, 2, 3, 4, 5, 6, 7]  # an 8-token match: 8 nodes
    short = _state([5, 6, 1, 2, 3, 5, 6])
    drafter.begin(0, short)
    assert drafter.propose([short], [16])[0].tokens == [1, 2]  # a 2-token match: 2 nodes


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tokens,factor,min_prob", [(16, 1.0, 0.1), (4, 4.0, 0.0), (24, 2.0, 0.3)])
def test_suffix_greedy_is_lossless(arch, tokens, factor, min_prob):
    target = tiny_model(arch, seed=0, sharpen=4.0)
    accepted = 0
    drafter = SuffixDrafter(tokens, factor, min_prob)  # one drafter: later prompts read earlier outputs
    for prompt in PROMPTS + [LOOPY]:
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt), (prompt, res.tokens)
        accepted += sum(len(e.accepted_nodes) for e in res.events)
    assert accepted > 0  # matches were proposed and accepted: the speculative path ran
    rows = batch_decoder(target, lambda: SuffixDrafter(tokens, factor, min_prob), max_new_tokens=NEW)
    assert rows.generate_batch(PROMPTS + [LOOPY], rows=2).tokens == [reference(target, p) for p in PROMPTS + [LOOPY]]


def test_a_run_reads_the_sessions_earlier_outputs_but_not_its_own_prompts():
    """A second prompt whose answer repeats the first's output drafts it from the session; a repeat of the same
    prompt does not read its own earlier answer (a benchmark's repeats would time a lookup of themselves)."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    session: list = []
    first = Decoder(target, SuffixDrafter(session=session), max_new_tokens=NEW).generate(PROMPTS[0])
    tail = first.tokens[-6:-3]  # a stretch of the first answer, as the second prompt's end
    fresh = Decoder(target, SuffixDrafter(), max_new_tokens=NEW).generate(PROMPTS[1] + tail)
    shared = Decoder(target, SuffixDrafter(session=session), max_new_tokens=NEW).generate(PROMPTS[1] + tail)
    assert shared.tokens == fresh.tokens == reference(target, PROMPTS[1] + tail)
    assert shared.events[1].draft_tokens and not fresh.events[1].draft_tokens  # the session's output drafted it
    again = Decoder(target, SuffixDrafter(session=session[:1]), max_new_tokens=NEW).generate(PROMPTS[0])
    alone = Decoder(target, SuffixDrafter(), max_new_tokens=NEW).generate(PROMPTS[0])
    assert [e.draft_tokens for e in again.events] == [e.draft_tokens for e in alone.events]


def test_suffix_exact_sampling_matches_target():
    """The second token's distribution when it comes out of verifying a suffix tree (every token recurs)."""
    V = 12
    prompt = [3, 7, 1, 0, 5, 2, 9, 4, 11, 6, 8, 10, 3, 1, 7, 0, 2, 5, 4, 9, 6, 11, 10, 8, 3]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    counts, n, drafted = torch.zeros(V), 1000, 0
    drafter = SuffixDrafter(tokens=4, factor=4.0, min_prob=0.0)
    for seed in range(n):
        res = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=3).generate(prompt)
        counts[res.tokens[1]] += 1
        drafted += bool(res.events[1].draft_tokens)
    assert drafted > 0.9 * n
    assert chisquare(counts.numpy(), exact_second_token(target, prompt).numpy() * n).pvalue > 1e-3


def test_the_registry_gives_it_flags_without_any_other_file_naming_it(model_folders, capsys):
    common = ["--target", str(model_folders["target"]), "--prompt", "def add(a, b): return a + b\ndef add(a, b):"]
    common += ["--max-new-tokens", "12", "--dtype", "float32", "--json"]
    assert main(["generate", "--method", "ar", *common]) == 0
    ar = capsys.readouterr().out
    assert main(["generate", "--method", "suffix", "--suffix-tokens", "8", "--suffix-min-prob", "0.2", *common]) == 0
    out = capsys.readouterr().out
    import json

    assert json.loads(out)["token_ids"] == json.loads(ar)["token_ids"]
    assert {"tokens": 8, "min_prob": 0.2}.items() <= json.loads(out)["settings"].items()


def _state(tokens):
    from engine.drafters.base import DecodeState

    return DecodeState(list(tokens), len(tokens), SamplingConfig(), torch.Generator())
