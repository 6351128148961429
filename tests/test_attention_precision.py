"""One query row in bfloat16 on a CPU attends in float32 (engine/runtime/attention_precision.py): what it computes, and
that
every model Glance loads, compiled or eager, and both EAGLE heads take that path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.decoding.loop import Decoder
from engine.decoding.sampling import SamplingConfig
from engine.drafters.autoregressive import AutoregressiveDrafter
from engine.models.loading import load_model
from engine.runtime.attention_precision import NAME, glance_sdpa, in_float32, sdpa
from engine.runtime.forward import CompiledForward, register, uncompile

GEN = torch.Generator().manual_seed(0)


def _qkv(rows: int, dtype=torch.bfloat16, keys: int = 40):
    q = torch.randn(1, 4, rows, 16, generator=GEN).to(dtype)  # [B, H, S, D]
    k = torch.randn(1, 2, keys, 16, generator=GEN).to(dtype)  # grouped: [B, KV, L, D]
    v = torch.randn(1, 2, keys, 16, generator=GEN).to(dtype)
    mask = torch.zeros(1, 1, rows, keys, dtype=dtype)
    mask[..., keys - 5 :] = torch.finfo(dtype).min  # [B, 1, S, L] additive
    return q, k, v, mask


def test_only_one_reduced_precision_row_on_a_cpu_goes_to_float32():
    assert in_float32(torch.zeros(1, 4, 1, 16, dtype=torch.bfloat16))
    assert in_float32(torch.zeros(3, 4, 1, 16, dtype=torch.float16))  # a batch of rows, one query each
    assert not in_float32(torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16))  # two rows: no faster in float32
    assert not in_float32(torch.zeros(1, 4, 1, 16))  # float32 models are untouched


def test_one_row_is_attended_in_float32_and_several_exactly_as_before():
    q, k, v, mask = _qkv(1)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), enable_gqa=True)
    got = sdpa(q, k, v, mask, enable_gqa=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, exact.to(torch.bfloat16), atol=0, rtol=0)  # the float32 result, rounded once
    q, k, v, mask = _qkv(3)
    before = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, mask, enable_gqa=True), before, atol=0, rtol=0)


def test_transformers_attention_function_follows_the_same_rule():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, False
    for rows in (1, 3):
        q, k, v, mask = _qkv(rows)
        got, _ = glance_sdpa(module, q, k, v, mask, dropout=0.0, scaling=0.25)
        if rows == 1:
            want, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask.float(), scaling=0.25)
            want = want.to(torch.bfloat16)
        else:
            want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.fixture
def attention_dtypes(monkeypatch):
    """The query dtype and rows of every torch attention call, in order."""
    seen: list[tuple[torch.dtype, int]] = []
    inner = F.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        seen.append((query.dtype, query.shape[2]))
        return inner(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("compiled_shape", [False, True])
def test_the_bundled_target_in_bfloat16_attends_its_one_token_steps_in_float32(attention_dtypes, compiled_shape):
    """Loaded as users load it; eager over its DynamicCache, or over the compiled forward's static cache and windowed
    attention (run eager here: the same attention functions the graph traces). Greedy decoding's first forward (the
    prompt) stays in bfloat16, every later one-token step goes to float32."""
    loaded = load_model("resources/models/target", device="cpu", dtype="bfloat16")
    model = loaded.model
    assert model.config._attn_implementation == NAME
    if compiled_shape:
        register(model, CompiledForward(model, compile=False))
    try:
        ids = loaded.tokenizer("def add(a, b):").input_ids
        decoder = Decoder(model, AutoregressiveDrafter(), SamplingConfig(0.0, 1.0, 0), 4, None, details=False)
        decoder.generate(ids)
    finally:
        if compiled_shape:
            uncompile(model)
    layers = model.config.num_hidden_layers
    assert attention_dtypes[:layers] == [(torch.bfloat16, len(ids))] * layers  # the prompt: many rows
    assert attention_dtypes[layers:] and set(attention_dtypes[layers:]) == {(torch.float32, 1)}
    assert model.config._attn_implementation == NAME  # uncompiled: the loaded implementation again


def test_both_eagle_heads_attend_a_one_row_step_in_float32(attention_dtypes):
    from engine.heads.eagle import load_eagle_head
    from engine.heads.eagle3 import load_eagle3_head

    target = load_model("resources/models/target", device="cpu", dtype="bfloat16").model
    for load, folder in ((load_eagle_head, "resources/models/eagle"), (load_eagle3_head, "resources/models/eagle3")):
        head = load(folder, target).to(torch.bfloat16)
        attention_dtypes.clear()
        with torch.no_grad():
            h = target.config.hidden_size
            width = h * (3 if load is load_eagle3_head else 1)
            cache = head.new_cache()
            head(torch.tensor([[5]]), torch.zeros(1, 1, width, dtype=torch.bfloat16), torch.tensor([[0]]), cache, None)
        assert attention_dtypes == [(torch.float32, 1)], folder


def test_the_benchs_transformers_rows_run_stock_attention_and_give_the_model_back(attention_dtypes):
    """transformers' rows stand for stock transformers: one-row steps in bfloat16 there, glance_sdpa again after."""
    from engine.bench.reference import hf_generate

    loaded = load_model("resources/models/target", device="cpu", dtype="bfloat16")
    ids = loaded.tokenizer("def add(a, b):").input_ids
    hf_generate("hf_generate", loaded.model, ids, 3, SamplingConfig(0.0, 1.0, 0), None)
    assert attention_dtypes and {dtype for dtype, _ in attention_dtypes} == {torch.bfloat16}
    assert (torch.bfloat16, 1) in attention_dtypes
    assert loaded.model.config._attn_implementation == NAME
