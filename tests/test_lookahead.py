"""Lookahead decoding: the combined mask, lossless greedy output, exact sampling, and a cache holding only commits."""

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.decoding.tree import draft_visibility, ngram_trie, tree_position_ids
from engine.drafters.lookahead import LookaheadDrafter, NgramPool, window_cells, window_layout
from engine.errors import GlanceError
from engine.runtime.cache import cache_length
from tests.conftest import ARCHS, tiny_model
from tests.test_lossless import NEW, PROMPTS, reference
from tests.test_sampling_exact import exact_second_token

# A prompt that repeats itself, so pooled n-grams match and the verification branch gets exercised.
LOOPY = [5, 9, 14, 5, 9, 14, 22, 5, 9, 31, 14, 22, 5]


def brute_force_visibility(parents, sizes):
    """Who sees whom, from the branches' definitions: a node sees the root, itself and its ancestors; window token
    (l, c) sees the root, level-0 tokens in columns 1..c and column c's tokens of levels 1..l; nothing else."""
    cells = window_cells(sizes)
    n, m = len(parents), len(cells)
    size = 1 + n + m

    def ancestors(i):
        out = {i}
        while parents[i] >= 0:
            i = parents[i]
            out.add(i)
        return out

    vis = torch.zeros(size, size, dtype=torch.bool)
    for r in range(size):
        for k in range(size):
            if k == 0:
                vis[r, k] = True
            elif 1 <= r <= n and 1 <= k <= n:
                vis[r, k] = (k - 1) in ancestors(r - 1)
            elif r > n and k > n:
                (l1, c1), (l2, c2) = cells[r - 1 - n], cells[k - 1 - n]
                vis[r, k] = (l2 == 0 and c2 <= c1) or (1 <= l2 <= l1 and c2 == c1)
    return vis


# Window shapes as the reference's window passes through them: W + N - 3 seeded tokens on level 0, then each
# filling step slides a column and adds a level, until level 0 holds W - 1 and every later level W.
@pytest.mark.parametrize("sizes", [(1,), (4,), (5,), (4, 5), (3, 4, 4), (0, 1), (2, 3, 3, 3)])
def test_combined_mask_matches_brute_force(sizes):
    tokens, parents, _ = ngram_trie([(4, 5), (4, 6), (7, 8), (4, 5, 9)])
    assert tokens == [4, 5, 6, 7, 8, 9] and parents == [-1, 0, 0, -1, 3, 1]
    offsets, side = window_layout(sizes)
    assert torch.equal(draft_visibility(parents, side), brute_force_visibility(parents, sizes))
    # A window token's position is the length of the sequence it sees: each column is one contiguous continuation.
    assert offsets == [int(row.sum()) for row in side]
    pos = tree_position_ids(parents, 10, "cpu", offsets)[0].tolist()
    assert pos[: 1 + len(tokens)] == [10, 11, 12, 12, 11, 12, 13]


def test_pool_keeps_the_newest_per_key():
    pool = NgramPool(capacity=2)
    pool.add((1, 2, 3))
    pool.add((1, 4, 5))
    pool.add((1, 2, 3))  # added again: now the newest, so (4, 5) is the oldest
    pool.add((1, 6, 7))
    assert pool.lookup(1) == [(2, 3), (6, 7)]
    assert pool.lookup(2) == [] and len(pool) == 2


def test_window_follows_the_reference_shapes():
    """W + N - 3 seeded tokens; N - 2 filling steps that slide; then W - 1 on level 0 and W on each later level,
    with one n-gram per column pooled each step, column 0's under the pending token; n-grams verified only once
    the window is full."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    window, ngram = 4, 4

    class Recording(LookaheadDrafter):
        def propose(self, states, max_tokens):
            (draft,) = super().propose(states, max_tokens)
            shapes.append((tuple(map(len, self.rows[0].levels)), len(draft.tokens), states[0].tokens[-1]))
            return [draft]

    shapes = []
    drafter = Recording(window, ngram, guesses=3, context_ngrams=False)
    res = Decoder(target, drafter, max_new_tokens=NEW).generate(LOOPY)
    assert res.tokens == reference(target, LOOPY)
    assert [s for s, _, _ in shapes[:4]] == [(5,), (4, 5), (3, 4, 4), (3, 4, 4)]
    assert all(nodes == 0 for _, nodes, _ in shapes[:2])  # no verification while the window fills
    assert all(s == (3, 4, 4) for s, _, _ in shapes[2:])
    # each full-window step pooled W n-grams of N tokens; the first step's column 0 under its pending token
    first_full_root = shapes[2][2]
    pool = drafter.rows[0].pool
    assert len(pool) >= window and all(len(c) == ngram - 1 for c in pool.lookup(first_full_root))
    assert pool.lookup(first_full_root)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "window,ngram,guesses,context",
    [(4, 2, 3, True), (3, 3, 4, False), (5, 4, 6, True), (2, 5, 2, True), (4, 3, 0, True)],
)
def test_lookahead_greedy_is_lossless(arch, window, ngram, guesses, context):
    target = tiny_model(arch, seed=0, sharpen=4.0)
    accepted = 0
    for prompt in PROMPTS + [LOOPY]:
        drafter = LookaheadDrafter(window, ngram, guesses, context_ngrams=context)
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(prompt)
        assert res.tokens == reference(target, prompt), (prompt, res.tokens)
        accepted += sum(len(e.accepted_nodes) for e in res.events)
        if guesses == 0:  # reduces to plain decoding: one token per forward, no window in the forward
            assert res.summary.target_forwards == NEW
            assert all(not e.draft_tokens for e in res.events)
    if guesses and context:
        assert accepted > 0  # n-grams were verified and accepted: the speculative path ran


class CacheCheckingDrafter(LookaheadDrafter):
    """Records, after every step, the target cache length against the committed tokens."""

    def update(self, row, state, draft, accepted):
        self.lengths.append((cache_length(state.target_out.cache), len(state.tokens) - 1))
        super().update(row, state, draft, accepted)


def test_cache_holds_only_committed_tokens():
    target = tiny_model("llama", seed=0, sharpen=4.0)
    drafter = CacheCheckingDrafter(window=5, ngram=4, guesses=5)
    drafter.lengths = []
    res = Decoder(target, drafter, max_new_tokens=NEW).generate(LOOPY)
    assert res.tokens == reference(target, LOOPY)
    assert any(e.draft_tokens for e in res.events) and len(drafter.lengths) == res.summary.steps
    assert all(cached == committed for cached, committed in drafter.lengths), drafter.lengths


def test_lookahead_exact_sampling_matches_target():
    """Second token's distribution, when it comes out of verifying pooled n-grams (prompt n-grams cover every key)."""
    V = 12
    prompt = [3, 7, 1, 0, 5, 2, 9, 4, 11, 6, 8, 10, 3, 1, 7, 0, 2, 5, 4, 9, 6, 11, 10, 8, 3]
    target = tiny_model("llama", seed=0, vocab=V, sharpen=6.0)
    counts = torch.zeros(V)
    n, drafted = 1000, 0
    for seed in range(n):
        drafter = LookaheadDrafter(window=3, ngram=2, guesses=3, seed=seed)  # N = 2: the window is full at once
        dec = Decoder(target, drafter, SamplingConfig(temperature=1.0, seed=seed), max_new_tokens=3)
        res = dec.generate(prompt)
        counts[res.tokens[1]] += 1
        drafted += bool(res.events[1].draft_tokens)
    assert drafted > 0.9 * n  # the second token nearly always went through the candidate rule
    expected = exact_second_token(target, prompt)
    assert chisquare(counts.numpy(), expected.numpy() * n).pvalue > 1e-3


def test_bad_settings_fail_clearly():
    for kwargs, word in (({"window": 0}, "window"), ({"ngram": 1}, "n-gram"), ({"guesses": -1}, "guesses")):
        with pytest.raises(GlanceError, match=word):
            LookaheadDrafter(**kwargs)


def test_sampled_runs_accept_several_pooled_tokens_at_once():
    """Under temperature 0.7 and top-p 0.9 the candidate rule accepts more than one pooled token in a step; the
    first tokens' exactness under these settings is tests/test_sampling_paths.py's."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    multi = 0
    for seed in range(20):
        cfg = SamplingConfig(temperature=0.7, top_p=0.9, seed=seed)
        res = Decoder(target, LookaheadDrafter(window=4, ngram=3, guesses=4), cfg, max_new_tokens=NEW).generate(LOOPY)
        multi += sum(sum(ev.from_draft) >= 2 for ev in res.events[1:])
    assert multi > 0


def test_plain_steps_score_what_the_pool_would_have_guessed():
    """A plain step notes the pooled n-grams under its pending token (whether the window is full or not: a window
    step fills it), and once their positions are committed tells how many tokens they guessed right: what the window
    budget reads while it runs plain steps."""
    from engine.drafters.base import DecodeState

    drafter = LookaheadDrafter(window=1, ngram=3, guesses=2)
    state = DecodeState([5, 6, 7, 5], 4, SamplingConfig(), torch.Generator())
    drafter.begin(0, state)  # pools the prompt's 3-grams: 5 -> (6, 7), 6 -> (7, 5); the window is not full yet
    for token in (6, 9, 4):
        (draft,) = drafter.propose([state], [0])  # a plain step
        assert len(draft) == 0 and not draft.side_tokens
        state.tokens.append(token)
        drafter.update(0, state, draft, [])
    # 5 pending: (6, 7) against 6, 9: one right; 6 pending: (7, 5) against 9: none; 9's guess is not due yet
    assert drafter.take_guessed() == [1, 0] and drafter.take_guessed() == []
