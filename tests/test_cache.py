"""Cache crop and tree compaction give the same logits as recomputing the kept sequence from scratch."""

import pytest
import torch
from transformers import DynamicCache

from engine.decoding.tree import tree_attention_mask, tree_position_ids
from engine.runtime.cache import cache_length, compact_tail, crop, keep_positions
from tests.conftest import ARCHS, tiny_model


def _next_logits(model, cache, tokens):
    return model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True).logits[0, -1]


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_crop_equals_recompute(arch):
    model = tiny_model(arch)
    seq = [3, 14, 15, 92, 65, 35, 89, 79]
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([seq]), cache=cache, use_cache=True)
    crop(cache, 5)
    assert cache_length(cache) == 5
    got = _next_logits(model, cache, [seq[5], 7])
    want = model(input_ids=torch.tensor([seq[:6] + [7]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_tree_compaction_equals_recompute(arch):
    """Verify a tree, keep one root-to-leaf path, then continue: logits equal a plain forward over that path."""
    model = tiny_model(arch)
    prompt = [5, 9, 2, 6]
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([prompt[:-1]]), cache=cache, use_cache=True)
    parents = [-1, -1, 0, 0, 3]  # nodes: a b | c d under a | e under d
    tokens = [11, 12, 13, 14, 15]
    past = cache_length(cache)
    out = model(
        input_ids=torch.tensor([[prompt[-1]] + tokens]),
        cache=cache,
        use_cache=True,
        attention_mask=tree_attention_mask(parents, past, torch.float32, "cpu"),
        position_ids=tree_position_ids(parents, past, "cpu"),
    )
    # the tree forward's row for node e equals the plain forward over prompt + a d e
    path_tokens = prompt + [11, 14, 15]
    plain = model(input_ids=torch.tensor([path_tokens])).logits[0]
    torch.testing.assert_close(out.logits[0, 5], plain[-1], rtol=1e-4, atol=1e-4)
    compact_tail(cache, past, [0, 1, 4, 5])  # root, a, d, e
    assert cache_length(cache) == len(path_tokens)
    got = _next_logits(model, cache, [21])
    want = model(input_ids=torch.tensor([path_tokens + [21]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_keep_positions_selects_in_order():
    model = tiny_model("llama")
    seq = [1, 2, 3, 4, 5, 6]
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([seq]), cache=cache, use_cache=True)
    before = cache.layers[0].keys.clone()
    keep_positions(cache, [0, 2, 5])
    assert torch.equal(cache.layers[0].keys, before[..., [0, 2, 5], :])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_run_past_the_context_length_is_refused_before_it_starts(arch):
    from engine.decoding.loop import Decoder
    from engine.drafters.lookahead import LookaheadDrafter
    from engine.errors import GlanceError
    from tests.conftest import tiny_model

    target = tiny_model(arch)  # 256 positions
    with pytest.raises(GlanceError, match="takes at most 256 positions and this run needs 264"):
        Decoder(target, max_new_tokens=24).generate([1] * 240)
    assert len(Decoder(target, max_new_tokens=16).generate([1] * 240).tokens) == 16  # exactly fits
    with pytest.raises(GlanceError, match="at most 256 positions"):  # lookahead's window needs room too
        Decoder(target, LookaheadDrafter(window=4, ngram=3), max_new_tokens=16).generate([1] * 240)
