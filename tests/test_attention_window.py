"""Attention over a window of the static cache (engine/runtime/attention_window.py): the compiled forward reads the
keys of
the live entries only, computes what attention over every slot computed, and one graph serves every window."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from engine.decoding.loop import Decoder
from engine.runtime.attention_window import PREFIX, WINDOW_STEP, window
from engine.runtime.forward import CompiledForward, forward_for, register, uncompile
from tests.conftest import tiny_model

IDS = torch.randint(0, 96, (1, 200), generator=torch.Generator().manual_seed(2))


def test_a_window_covers_the_live_entries_rounded_up_and_never_passes_the_capacity():
    assert window(1, 256) == WINDOW_STEP
    assert window(WINDOW_STEP, 256) == WINDOW_STEP
    assert window(WINDOW_STEP + 1, 256) == 2 * WINDOW_STEP
    assert window(250, 256) == 256  # rounded up past the capacity: the capacity
    assert window(300, 256) == 300  # the cache grows first: every entry


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_attention_reads_no_slot_past_the_window_and_computes_what_all_slots_computed(arch):
    """Slots past the window hold NaN: attention over them would return NaN even where they are masked (0 x NaN)."""
    model = tiny_model(arch, seed=0, sharpen=4.0)
    forward = CompiledForward(model, compile=False)  # the static cache and masks, eager: the same attention wrapper
    register(model, forward)
    try:
        assert forward.windowed and model.config._attn_implementation.startswith(PREFIX)
        with torch.no_grad():
            cache = forward.new_cache(400)
            forward(IDS[:, :100], cache)
            width = forward.mask_width(cache, 1)
            assert width < cache.capacity
            for layer in cache.layers:
                layer.keys[:, :, width:] = float("nan")  # [B, H, slots - width, D]
                layer.values[:, :, width:] = float("nan")
            got = forward(IDS[:, 100:101], cache).logits  # [1, 1, V]
            whole = model(input_ids=IDS[:, :101]).logits[:, 100:]  # no cache at all
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, whole, atol=1e-4, rtol=1e-4)
    finally:
        uncompile(model)
    assert not model.config._attn_implementation.startswith(PREFIX)  # the model's own attention again


@pytest.mark.slow
def test_one_compiled_graph_serves_every_window_up_to_the_whole_capacity():
    """Heads 64 wide, as the first window is: traced together they became one symbol, and every later window width
    compiled a graph of its own (dynamo's duck shaping). Decoding to the capacity's last window compiles nothing."""
    import transformers as tf

    config = tf.LlamaConfig(
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,  # head_dim 64 = WINDOW_STEP
        num_key_value_heads=2,
        max_position_embeddings=512,
        vocab_size=96,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    prompt, new = [5, 17, 3], 460  # a 512-entry cache: windows of 64 to 512
    eager = Decoder(model, max_new_tokens=new).generate(prompt).tokens
    register(model, CompiledForward(model))  # compiled lazily: plain decoding needs the one-token graph only
    try:
        assert Decoder(model, max_new_tokens=3).generate(prompt).tokens == eager[:3]  # compiles it, first window
        graphs = counters["stats"]["unique_graphs"]
        assert Decoder(model, max_new_tokens=new).generate(prompt).tokens == eager
        assert counters["stats"]["unique_graphs"] == graphs  # every later window: the same graph
        assert forward_for(model).one_graph is not None and forward_for(model).failure is None
    finally:
        uncompile(model)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_wrapped_model_still_masks_its_own_causal_runs_after_a_cache(arch):
    """transformers builds the mask itself where none is passed (its own generate; Glance's eager forward): for
    the wrapped implementation too. Without one, sdpa aligned a run of several tokens after a cache to the top-left
    corner, and transformers' prompt lookup matched plain decoding on no prompt of the suite."""
    from transformers import DynamicCache

    model = tiny_model(arch, seed=0, sharpen=4.0)
    register(model, CompiledForward(model, compile=False))  # wraps the attention
    try:
        assert model.config._attn_implementation.startswith(PREFIX)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(input_ids=IDS[:, :10], past_key_values=cache, use_cache=True)
            run = model(input_ids=IDS[:, 10:14], past_key_values=cache, use_cache=True).logits  # [1, 4, V]
            whole = model(input_ids=IDS[:, :14]).logits[:, 10:]
        torch.testing.assert_close(run, whole, atol=1e-4, rtol=1e-4)
    finally:
        uncompile(model)


def test_the_causal_mask_lets_each_new_token_see_the_columns_up_to_its_own_position():
    """The mask cut from the kept row template equals the causal mask built column by column, at every size, and
    is a fresh contiguous tensor (the graphs guard on a view's base)."""
    forward = CompiledForward(tiny_model("llama", seed=0), compile=False)
    low = torch.finfo(torch.float32).min
    for S, past, width in [(1, 0, 64), (1, 63, 64), (3, 10, 64), (17, 100, 128), (5, 1500, 1536), (1, 2999, 3000)]:
        mask = forward._causal(S, past, width, torch.float32, torch.device("cpu"))
        cols, rows = torch.arange(width), torch.arange(past, past + S)
        expected = torch.zeros(S, width).masked_fill_(cols[None, :] > rows[:, None], low)
        assert mask.shape == (1, 1, S, width) and mask.is_contiguous() and mask._base is None
        assert torch.equal(mask[0, 0], expected), (S, past, width)
