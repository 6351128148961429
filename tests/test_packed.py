"""Packed linear weights (engine/runtime/packed.py): the same products as the model's own layers, one packed copy
shared by
every compiled graph, fused projections exact in any call order, gradients through the plain product."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from engine.runtime.forward import CompiledForward, uncompile
from engine.runtime.packed import FusedLinear, PackedLinear, _runs_in, pack_linears, packable, unpacked
from tests.conftest import tiny_model

# oneDNN packs bfloat16 only on CPUs with AVX-512 (an AVX2-only AMD EPYC refuses it; packing then leaves every model
# as it is, which test_a_cpu_whose_onednn_cannot_multiply_the_dtype_leaves_the_model_as_it_is covers everywhere)
packs_bf16 = pytest.mark.skipif(not _runs_in(torch.bfloat16), reason="this CPU's oneDNN does not pack bfloat16")

IDS = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(5))


def half(arch: str) -> torch.nn.Module:
    return tiny_model(arch, seed=0, sharpen=4.0).to(torch.bfloat16)


def linears(model) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]


@packs_bf16
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])  # qwen2: biases on q/k/v; gpt2: Conv1D, LM head only
def test_packed_layers_compute_what_the_model_computed(arch):
    model = half(arch)
    before = linears(model)
    with torch.no_grad():
        want = model(input_ids=IDS).logits.float()  # [1, 12, V]
        assert pack_linears(model) == len(before) > 0
        got = model(input_ids=IDS).logits.float()
        with unpacked():  # the benchmark's transformers rows: the model's own products, bit for bit
            assert torch.equal(model(input_ids=IDS).logits.float(), want)
    assert linears(model) == []
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)  # bfloat16: kernels round differently
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert pack_linears(model) == 0  # packed already: nothing more


@packs_bf16
def test_packed_layers_keep_their_weights_and_the_tied_head():
    model = tiny_model("llama").to(torch.bfloat16)
    model.config.tie_word_embeddings = True
    model.tie_weights()  # the LM head is the embedding table, as in SmolLM2
    params = sum(p.numel() for p in model.parameters())
    pack_linears(model)
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    assert head.weight is model.get_input_embeddings().weight
    assert sum(p.numel() for p in model.parameters()) == params
    assert not any("packed" in k for k in model.state_dict())  # checkpoints keep the model's own layout


@packs_bf16
def test_fused_projections_are_exact_in_any_order_and_hold_nothing_after():
    model = half("qwen2")
    attn = model.model.layers[0].self_attn
    plain = {n: getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj")}
    pack_linears(model)
    fused = {n: getattr(attn, n) for n in plain}
    assert all(isinstance(m, FusedLinear) for m in fused.values())
    x = torch.randn(1, 5, model.config.hidden_size, dtype=torch.bfloat16)
    y = torch.randn(1, 5, model.config.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        for order, inputs in ((("q_proj", "k_proj", "v_proj"), (x, x, x)), (("v_proj", "q_proj", "k_proj"), (x, y, x))):
            for name, inp in zip(order, inputs):
                want = torch.nn.functional.linear(inp, plain[name].weight, plain[name].bias).float()
                torch.testing.assert_close(fused[name](inp).float(), want, atol=0.03, rtol=0.02)
            if order[0] == "q_proj":  # the attention's own order: one product, nothing held after it
                assert fused["q_proj"].group.pending is None


def test_gradients_go_through_the_plain_product():
    model = half("llama")
    pack_linears(model)
    emb = model.get_input_embeddings()(IDS).detach().requires_grad_(True)
    model(inputs_embeds=emb).logits.float().sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


def test_float32_and_other_devices_stay_as_they_are():
    model = tiny_model("llama")
    assert not packable(model)
    assert pack_linears(model) == 0 and linears(model)


def test_a_cpu_whose_onednn_cannot_multiply_the_dtype_leaves_the_model_as_it_is(monkeypatch):
    """float16 needs instructions not every CPU has: packing is tried on a tiny product first, and where oneDNN
    refuses it the model keeps its own layers (it must still run, compiled or eager)."""
    import engine.runtime.packed as packed

    def refuse(weight):
        raise RuntimeError("could not create a primitive descriptor for the inner product")

    monkeypatch.setattr(packed, "_pack", refuse)
    packed._runs_in.cache_clear()
    try:
        model = half("llama")
        assert not packable(model)
        assert pack_linears(model) == 0 and linears(model)
    finally:
        packed._runs_in.cache_clear()


@pytest.mark.slow
@packs_bf16
def test_a_compiled_half_precision_model_is_packed_and_its_graphs_share_the_weights():
    """Compiling packs the model first: the one-, two-, few- and several-token graphs all read the one packed copy
    (no graph breaks from the fused projections) and compute what the packed model computes eager."""
    model = half("llama")
    forward = CompiledForward(model)
    try:
        assert linears(model) == []
        graphs = counters["stats"]["unique_graphs"]
        forward.warm_up()
        # one token, two (STATIC_TOKENS), three or four (SMALL_TOKENS), several (SEVERAL_TOKENS)
        assert counters["stats"]["unique_graphs"] - graphs == 4
        with torch.no_grad():
            cache = forward.new_cache(16)
            forward(IDS[:, :6], cache)  # eager prefill
            one, two = forward(IDS[:, 6:7], cache).logits, forward(IDS[:, 7:9], cache).logits
            few = forward(IDS[:, 9:], cache).logits  # three tokens
            cache = forward.new_cache(16)
            forward(IDS[:, :4], cache)
            several = forward(IDS[:, 4:], cache).logits  # eight
            whole = model(input_ids=IDS).logits  # eager, packed
            assert counters["stats"]["unique_graphs"] - graphs == 4
        torch.testing.assert_close(torch.cat([one, two, few], 1).float(), whole[:, 6:].float(), atol=0.05, rtol=0.02)
        torch.testing.assert_close(several.float(), whole[:, 4:].float(), atol=0.05, rtol=0.02)
    finally:
        uncompile(model)


@pytest.mark.slow
def test_compiling_on_a_cpu_times_each_product_against_a_generated_kernel(capfd, monkeypatch):
    """engine.runtime.forward.inductor_options: a graph's matrix products are timed while compiling (oneDNN's call
    against
    inductor's C++ GEMM kernel), not sent to oneDNN unasked, and none of inductor's timing reports reach the user's
    terminal; the tuned graph computes what the eager model computes, and the thread's inductor settings are as
    they were. Both caches off, so the timing runs here rather than being read from an earlier compile. The symbolic
    graph of three and four tokens is timed (as the several-token one is); the one- and two-token graphs take the
    C++ kernel untimed (SMALL_GRAPH_PRODUCTS: inductor has one choice, so nothing to time)."""
    from engine.runtime.forward import SMALL_GRAPH_PRODUCTS, TUNE_PRODUCTS

    monkeypatch.setenv(TUNE_PRODUCTS, "1")  # the suite compiles untuned (conftest); this test is about tuning
    settings = torch._inductor.config.get_config_copy()
    model = half("llama")
    forward = CompiledForward(model)
    timed = {}

    def counted(graph):  # the products timed while each width's graph compiles
        def run(moves, **kwargs):
            before = counters["inductor"]["select_algorithm_autotune"]
            out = graph(moves, **kwargs)
            timed[kwargs["input_ids"].shape[1]] = counters["inductor"]["select_algorithm_autotune"] - before
            return out

        return run

    assert forward.one_graph.options["max_autotune_gemm_backends"] == SMALL_GRAPH_PRODUCTS
    forward.small_graph = counted(forward.small_graph)
    forward.strict = True  # a compile error fails the test rather than falling back
    try:
        with torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False), torch.no_grad():
            cache = forward.new_cache(16)
            forward(IDS[:, :9], cache)  # eager prefill
            got = forward(IDS[:, 9:], cache).logits  # three tokens: the symbolic graph, compiled and timed here
            whole = model(input_ids=IDS).logits
        assert set(timed) == {3} and timed[3] > 0, timed
        assert torch._inductor.config.get_config_copy() == settings  # the options were the graphs' own
        err = capfd.readouterr().err
        assert "AUTOTUNE" not in err and "Autotune Choices" not in err and "TypedStorage" not in err, err[-2000:]
        torch.testing.assert_close(got.float(), whole[:, 9:].float(), atol=0.05, rtol=0.02)
    finally:
        uncompile(model)


@packs_bf16
def test_a_one_row_drafting_step_compiles_with_generated_kernels_and_a_batched_one_with_timed_products(monkeypatch):
    """EAGLE's one-row drafting graph compiles with SMALL_GRAPH_PRODUCTS (timed, oneDNN won the head's products and
    a call of two to four rows ran slower); the batched graph keeps the timed choice. Each graph carries its own
    options (the target's test above shows inductor times nothing under the generated choice), and warming both up
    leaves the thread's inductor settings as they were."""
    from engine.heads.compiled_step import CompiledDraftStep
    from engine.heads.eagle3 import Eagle3Head
    from engine.runtime.forward import SMALL_GRAPH_PRODUCTS, TIMED_PRODUCTS, TUNE_PRODUCTS

    monkeypatch.setenv(TUNE_PRODUCTS, "1")
    settings = torch._inductor.config.get_config_copy()
    head = Eagle3Head.for_target(half("llama"), torch.arange(0, 96, 2)).to(torch.bfloat16).eval()
    step = CompiledDraftStep(head)
    assert step.one_row.options["max_autotune_gemm_backends"] == SMALL_GRAPH_PRODUCTS
    assert step.rows.options["max_autotune_gemm_backends"] == TIMED_PRODUCTS
    assert step.one_row.options["freezing"] and step.rows.options["freezing"]
    calls = {}  # which graph each warm-up calls (eager stand-ins: compiling is the target's test's concern)
    step.one_row, step.rows = counted_by(head, calls, 1), counted_by(head, calls, 2)
    step.warm_up(1)
    step.warm_up(2)
    assert calls[1] > 0 and calls[2] > 0, calls
    assert torch._inductor.config.get_config_copy() == settings


def counted_by(head, calls: dict, key):
    from engine.heads.readout import run_draft_step

    def run(*args):
        calls[key] = calls.get(key, 0) + 1
        return run_draft_step(head, *args)

    return run


@packs_bf16
def test_a_compiled_drafting_step_packs_a_half_precision_head():
    """EAGLE's drafting step (engine/heads/compiled_step.py) packs its head as the target's forward packs the target:
    one copy for the one-row and the batched graphs. The head drafts as it did."""
    from engine.heads.compiled_step import CompiledDraftStep
    from engine.heads.eagle3 import Eagle3Head

    target = half("llama")
    head = Eagle3Head.for_target(target, torch.arange(0, 96, 2)).to(torch.bfloat16).eval()
    x = torch.randn(1, 3, head.fc.in_features, dtype=torch.bfloat16)
    with torch.no_grad():
        want = head.fc(x).float()
        CompiledDraftStep(head)
        got = head.fc(x).float()
    assert linears(head) == []
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


def test_warming_runs_every_distinct_packed_product_at_every_row_count(monkeypatch):
    """oneDNN builds a primitive per row count (about 0.5 ms, 10x the product): loading runs each distinct product
    once per row count a decoding step may use, layers of one shape sharing theirs."""
    import engine.runtime.packed as packed
    from engine.runtime.packed import warm_products

    model = half("llama")
    pack_linears(model)
    seen = []
    product = packed._product

    def counted(x, p, bias, out):
        seen.append((x.shape[0], x.shape[1], out))
        return product(x, p, bias, out)

    monkeypatch.setattr(packed, "_product", counted)
    shapes = set()
    for m in model.modules():
        if isinstance(m, PackedLinear):
            shapes.add((m.in_features, m.out_features))
        elif isinstance(m, FusedLinear):
            shapes.add((m.in_features, m.group.width))
    assert warm_products(model, 5) == len(shapes) * 5 == len(seen)
    assert sorted(seen) == sorted((rows, i, o) for rows in range(1, 6) for i, o in shapes)


@packs_bf16
def test_heads_project_through_the_targets_packed_lm_head():
    """Heads built before the target is packed still read its one packed LM head, not the replaced layer: a second
    copy of the vocabulary projection cost cache space every drafting depth."""
    from engine.heads.eagle import EagleHead
    from engine.heads.medusa import MedusaHeads

    target = half("llama")
    eagle = EagleHead.for_target(target)
    medusa = MedusaHeads.for_target(target, 2, shared_lm_head=True)
    pack_linears(target)
    packed = target.get_output_embeddings()
    assert isinstance(packed, PackedLinear)
    assert eagle.lm_head is packed and medusa.shared_lm_head is packed
    assert eagle.embed is target.get_input_embeddings()
    assert not any(k.startswith(("lm_head", "embed")) for k in eagle.state_dict())
