"""The compiled forward (engine/runtime/forward.py) decodes exactly as the eager one, for every drafter, one row or
several.

Two layers are tested apart: the static cache with its full-width masks and in-place edits (run eager, fast, on three
architectures), and torch.compile itself over it (one tiny target and draft, compiled once for the module)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from engine.decoding.loop import Decoder
from engine.decoding.tree import additive_mask
from engine.drafters.eagle import EagleDrafter
from engine.drafters.eagle3 import Eagle3Drafter
from engine.drafters.lookahead import LookaheadDrafter
from engine.drafters.medusa import MedusaDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.vanilla import VanillaDrafter
from engine.heads.compiled_readout import CompiledReadout, compile_readout, compiled_readout_of, uncompile_readout
from engine.heads.compiled_step import CompiledDraftStep, compile_head, compiled_step_of, uncompile_head
from engine.heads.eagle3 import Eagle3Head
from engine.heads.readout import candidates, draft_step, top_candidates
from engine.runtime.cache import cache_length, compact_tail, gather_rows, move_row_entries
from engine.runtime.forward import (
    CompiledForward,
    ModelForward,
    compile_model,
    forward_for,
    greedy_ids,
    register,
    uncompile,
)
from engine.runtime.static_cache import StaticKVCache
from tests.conftest import batch_decoder, perturbed_copy, tiny_model
from tests.test_eagle import random_head
from tests.test_eagle3 import deep_target
from tests.test_lookahead import LOOPY
from tests.test_lossless import reference
from tests.test_medusa import random_heads

NEW = 20
PROMPTS = [[1, 2, 3], [17, 5, 60, 33, 8, 8, 41], LOOPY, [33] * 9]
METHODS = ["ar", "vanilla", "medusa", "eagle", "eagle3", "lookahead", "prompt_lookup"]


def makers(target, draft) -> dict:
    heads, head = random_heads(target), random_head(target)
    head3 = Eagle3Head.for_target(target, torch.arange(0, 96, 2)).eval()  # a reduced vocabulary of even ids
    return {
        "ar": None,
        "vanilla": lambda: VanillaDrafter(draft, gamma=3),
        "medusa": lambda: MedusaDrafter(heads, "cpu_16"),
        "eagle": lambda: EagleDrafter(head, top_k=3, depth=3, total_tokens=8),
        "eagle3": lambda: Eagle3Drafter(head3, top_k=3, depth=3, total_tokens=8),
        "lookahead": lambda: LookaheadDrafter(window=3, ngram=3, guesses=3),
        "prompt_lookup": lambda: PromptLookupDrafter(max_ngram=2, tokens=3),
    }


def shallow_copy(target):
    """A draft of the target's architecture: its first layer, perturbed. Compiling costs time per layer, and two
    compiled models of one architecture are what the tests below need."""
    draft = perturbed_copy(target, 0.3)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:1]
    return draft


def decode_all(target, make, prompts) -> dict:
    """Every method's greedy tokens per prompt, alone (a batch of one), and as one batch."""
    out = {}
    for method, maker in make.items():
        drafter = maker() if maker else None
        out[method] = [Decoder(target, drafter, max_new_tokens=NEW).generate(p).tokens for p in prompts]
    return out


@pytest.fixture(params=["llama", "gpt2", "qwen2"])
def static_eager(request):
    """A target (4 layers for Llama, so EAGLE-3's three feature layers differ) and a draft, both running over the
    static cache with full-width masks, eager; the eager forward is restored after the test."""
    target = deep_target("llama") if request.param == "llama" else tiny_model(request.param, seed=0, sharpen=4.0)
    draft = perturbed_copy(target, 0.3)
    for model in (target, draft):
        register(model, CompiledForward(model, compile=False))
    yield request.param, target, draft
    uncompile(target)
    uncompile(draft)


def test_the_static_cache_decodes_every_method_exactly(static_eager):
    arch, target, draft = static_eager
    assert isinstance(forward_for(target), CompiledForward)
    refs = [reference(target, p)[:NEW] for p in PROMPTS]
    make = makers(target, draft)
    if arch != "llama":
        make.pop("eagle3")  # its feature layers need four
    for method, tokens in decode_all(target, make, PROMPTS).items():
        assert tokens == refs, method
    for method in ("ar", "vanilla", "eagle", "lookahead"):  # per-row gathers of the target's and the draft's caches
        res = batch_decoder(target, make[method], max_new_tokens=NEW).generate_batch(PROMPTS)
        assert res.tokens == refs, method
        # two rows for every prompt: finished rows take waiting prompts, written into the static cache's rows
        res = batch_decoder(target, make[method], max_new_tokens=NEW).generate_batch(PROMPTS, rows=2)
        assert res.tokens == refs and res.prefills > 1, method


def test_the_static_cache_grows_past_its_capacity_and_keeps_its_entries():
    target = tiny_model("llama", seed=0)
    forward = CompiledForward(target, compile=False)
    cache = forward.new_cache(8)
    assert isinstance(cache, StaticKVCache) and cache.capacity == 256
    ids = torch.randint(0, 96, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        forward(ids[:, :250], cache)
        grown = forward(ids[:, 250:], cache).logits  # [1, 50, V]: written past the first capacity
        whole = target(input_ids=ids).logits[:, 250:]
    assert cache.capacity > 256 and cache.length == 300
    torch.testing.assert_close(grown, whole, atol=1e-4, rtol=1e-4)


def test_a_compaction_moves_entries_in_the_next_forward_or_at_once_when_read():
    """The static cache's compaction only records its moves (the next compiled forward does them in its graph);
    reading or editing the cache first does them eager, and a compaction past MOVE_SLOTS moves is done at once."""
    from engine.runtime.static_cache import MOVE_SLOTS

    target = tiny_model("llama", seed=0)
    forward = CompiledForward(target, compile=False)
    cache = forward.new_cache(64)
    with torch.no_grad():
        forward(torch.randint(0, 96, (1, 50), generator=torch.Generator().manual_seed(2)), cache)
    before = [layer.keys.clone() for layer in cache.layers]
    for offsets in ([0, 2, 5], list(range(0, 2 * (MOVE_SLOTS + 2), 2))):
        cache.set_length(50)
        for layer, keys in zip(cache.layers, before):
            layer.keys.copy_(keys)
        cache.compact_tail(10, offsets)
        assert cache.length == 10 + len(offsets)
        assert (cache.moves is None) == (len(offsets) > MOVE_SLOTS)
        cache.crop(cache.length)  # an edit: the moves are done first
        assert cache.moves is None
        for layer, keys in zip(cache.layers, before):
            torch.testing.assert_close(layer.keys[:, :, 10 : cache.length], keys[:, :, [10 + o for o in offsets]])


def test_static_cache_edits_match_the_dynamic_cache_edits():
    """Per-row gather and tail compaction leave the static cache attending exactly as the eager cache does."""
    target = tiny_model("llama", seed=0)
    static, eager = CompiledForward(target, compile=False), ModelForward(target)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    kept = torch.tensor([[0, 1, 2, 5, 9], [0, 3, 4, 6, 11]])  # row b keeps those columns
    nxt, positions = torch.tensor([[7, 8], [9, 10]]), torch.tensor([[12, 13], [12, 13]])
    outs = []
    with torch.no_grad():
        for forward in (static, eager):
            cache = forward.new_cache(16)
            forward(ids, cache)
            gather_rows(cache, kept)
            mask = additive_mask(torch.ones(2, 2, 7, dtype=torch.bool).tril(5), torch.float32, "cpu")
            forward(nxt, cache, mask, positions)
            compact_tail(cache, 5, [1])  # keep the second new entry only
            assert cache_length(cache) == 6
            outs.append(forward(torch.tensor([[3], [4]]), cache, None, torch.tensor([[14], [14]])).logits)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("takes_it", [True, False])
def test_logits_at_gives_those_rows_logits_and_nothing_else(monkeypatch, takes_it):
    """A prefill that asks for the last rows only gets exactly those rows' logits (the LM head runs on them alone
    where the model takes `logits_to_keep`; otherwise the rows are picked afterwards), on every forward kind."""
    import engine.runtime.forward as forward_module

    monkeypatch.setattr(forward_module, "_takes_logits_to_keep", lambda cls: takes_it)
    target = tiny_model("llama", seed=0)
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(4))
    for forward in (CompiledForward(target, compile=False), ModelForward(target)):
        with torch.no_grad():
            full = forward(ids, forward.new_cache(16)).logits  # [2, 9, V]
            for at in ([8], [3, 8], [0, 2, 5]):
                out = forward(ids, forward.new_cache(16), logits_at=at)
                assert out.logits.shape[:2] == (2, len(at))
                torch.testing.assert_close(out.logits, full[:, at], atol=1e-5, rtol=1e-5)


def test_per_row_moves_keep_what_a_gather_keeps():
    """The batch decoder's compaction (each row's accepted entries moved after its own prefix) leaves every row's
    kept entries where a per-row gather of the whole prefix puts them, on the static and the eager cache. The
    static cache records the moves for the next compiled forward's graph and does them eager when read first."""
    target = tiny_model("llama", seed=0)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(3))
    # row 0 holds 8 entries and keeps new columns 12 and 14 (moved to 8, 9); row 1 holds 12 and keeps 12, 13, 15
    kept = torch.tensor([[*range(8), 12, 14, 0, 0, 0, 0, 0], [*range(12), 12, 13, 15]])
    rows, src, dst = [0, 0, 1], [12, 14, 15], [8, 9, 14]
    for forward in (CompiledForward(target, compile=False), ModelForward(target)):
        with torch.no_grad():
            moved, gathered = forward.new_cache(32), forward.new_cache(32)
            for cache in (moved, gathered):
                forward(ids, cache)
                forward(
                    torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), cache, None, torch.arange(12, 16)[None].repeat(2, 1)
                )
        move_row_entries(moved, rows, src, dst, 15)
        gather_rows(gathered, kept)
        assert cache_length(moved) == cache_length(gathered) == 15
        if isinstance(moved, StaticKVCache):
            assert moved.moves == (rows, src, dst)  # pending: the next forward's graph does them
            moved.settle()
        for a, b in zip(moved.layers, gathered.layers):
            for row, n in ((0, 10), (1, 15)):
                torch.testing.assert_close(a.keys[row, :, :n], b.keys[row, :, :n])
                torch.testing.assert_close(a.values[row, :, :n], b.values[row, :, :n])


# ---- torch.compile itself -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled():
    """A 2-layer Llama target, EAGLE-3's drafting step and Medusa's read-out, compiled and warmed up once for the
    module; `make` builds drafters over these same heads. Each compiled graph costs seconds, so the rest stays eager:
    the one-layer draft (a compiled draft is the target's kind of graph again; two compiled models of one
    architecture have a test of their own) and EAGLE-2's head (its compiled step is EAGLE-3's class)."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    draft = shallow_copy(target)
    make = makers(target, draft)
    eager = decode_all(target, make, PROMPTS)  # before compiling: the eager path's tokens
    head = make["eagle3"]().head
    medusa = make["medusa"]()
    reports = [compile_model(target, "the target"), compile_head(head, "the EAGLE-3 head")]
    reports += [compile_readout(medusa.heads, medusa.topk, "the Medusa heads")]
    yield target, draft, eager, reports, make
    uncompile(target)
    uncompile_head(head)
    uncompile_readout(medusa.heads)


@pytest.mark.slow
def test_compiling_reports_its_time_and_registers_the_forward(compiled):
    target, draft, _, reports, make = compiled
    assert all(r.compiled for r in reports), [r.line() for r in reports]
    assert reports[0].line().startswith("compiled the target in ")
    assert reports[1].line().startswith("compiled the EAGLE-3 head in ")
    assert isinstance(forward_for(target), CompiledForward) and forward_for(target).graph is not None
    assert compiled_step_of(make["eagle3"]().head) is not None
    assert reports[2].line().startswith("compiled the Medusa heads in ")
    medusa = make["medusa"]()
    heads, k = medusa.heads, medusa.topk  # the graph the fixture warmed up (another k would compile another)
    assert compiled_readout_of(heads) is not None
    x = torch.randn(1, heads.hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        values, ids = candidates(heads)(x, k, log_probs=False)  # [K, 1, k]: the graph
        eager_values, eager_ids = top_candidates(heads, x, k, log_probs=False)
        first_values, first_ids = candidates(heads)(x, k, log_probs=False, first=True)  # [1, 1, k]: head 0's graph
    assert ids.shape == (heads.num_heads, 1, k) and torch.equal(ids, eager_ids)
    torch.testing.assert_close(values, eager_values)
    assert sorted(compiled_readout_of(heads).graphs) == [(k, False, False), (k, False, True)]  # both warmed at load
    assert first_ids.shape == (1, 1, k) and torch.equal(first_ids, eager_ids[:1])
    torch.testing.assert_close(first_values, eager_values[:1])


@pytest.mark.slow
def test_two_compiled_models_of_one_architecture_each_run_their_own_weights(compiled):
    """The target and its draft have the same architecture, and on a CPU each graph
    holds its model's weights as constants: each must still compute with its own, over its own cache, in each of its
    graphs (one token, two (STATIC_TOKENS), several)."""
    target, draft, _, _, _ = compiled
    register(draft, CompiledForward(draft))  # compiled lazily: the graphs this test calls
    ids = torch.randint(0, 96, (1, 14), generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            for model in (target, draft, target):
                forward = forward_for(model)
                cache = forward.new_cache(16)
                forward(ids[:, :8], cache)  # eager prefill
                one, two = forward(ids[:, 8:9], cache).logits, forward(ids[:, 9:11], cache).logits
                several = forward(ids[:, 11:], cache).logits
                whole = model(input_ids=ids).logits  # [1, 14, V], eager, no cache
                torch.testing.assert_close(torch.cat([one, two, several], 1), whole[:, 8:], atol=1e-4, rtol=1e-4)
    finally:
        uncompile(draft)


@pytest.mark.slow
def test_compiled_decoding_is_exact_for_every_method_and_never_recompiles(compiled):
    target, draft, eager, _, make = compiled
    calls = {}
    step = compiled_step_of(make["eagle3"]().head)  # count the head's compiled steps: drafting must run them
    step.one_row = counted(step.one_row, calls, "eagle3")
    readout = compiled_readout_of(make["medusa"]().heads)  # and Medusa's compiled read-outs (every head; head 0)
    for key in readout.graphs:
        readout.graphs[key] = counted(readout.graphs[key], calls, "medusa")
    forward = forward_for(target)  # and the target's two symbolic graphs: three or four tokens, more
    graph, few = forward.graph, forward.small_graph
    widths = {}

    def by_width(run, key):
        def call(moves, **kwargs):
            widths.setdefault(key, set()).add(kwargs["input_ids"].shape[1])
            return run(moves, **kwargs)

        return call

    forward.graph, forward.small_graph = by_width(graph, "graph"), by_width(few, "few")
    warmed_up = counters["stats"]["unique_graphs"]
    try:
        first = decode_all(target, make, PROMPTS)
    finally:
        forward.graph, forward.small_graph = graph, few
    assert first == eager
    assert calls["eagle3"] > NEW and calls["medusa"] > NEW / 4, calls
    assert widths["few"] <= {3, 4} and widths["few"] and max(widths["graph"]) > 4, widths
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == warmed_up  # nothing compiled since the warm-up, a three-token prompt's one-entry head cache too
    again = decode_all(target, make, PROMPTS[::-1])  # other prompt lengths, other tree sizes: the same graphs
    assert again == {m: t[::-1] for m, t in eager.items()}
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_compiled_batches_are_exact_and_compile_nothing_after_a_batched_warm_up(compiled):
    """The sweep warms up batched graphs before its timed cells; a batch run of every method must then find every
    graph it needs (a miss once cost vanilla's first batch-2 cell three compiles: 0.4x)."""
    target, draft, eager, _, make = compiled
    forward_for(target).warm_up(2)
    compiled_step_of(make["eagle3"]().head).warm_up(2)  # the head's batched drafting step, as the sweep warms it up
    medusa = make["medusa"]()  # and Medusa's batched read-out
    readout = compiled_readout_of(medusa.heads)
    readout.warm_up(medusa.topk, rows=2)
    rows_read = []
    for key, graph in list(readout.graphs.items()):  # every head's graph and head 0's
        readout.graphs[key] = lambda x, graph=graph: rows_read.append(x.shape[0]) or graph(x)
    graphs = counters["stats"]["unique_graphs"]
    for method in ("ar", "vanilla", "medusa", "eagle", "eagle3"):
        assert batch_decoder(target, make[method], max_new_tokens=NEW).generate_batch(PROMPTS).tokens == eager[method]
        # one row through the batch decoder (the sweep's B = 1 cells): the single-row graphs, with the batch
        # decoder's own positions (one-row graphs traced with a view for positions compiled again here: 0.1x)
        one = batch_decoder(target, make[method], max_new_tokens=NEW).generate_batch(PROMPTS[1:2]).tokens
        assert one == eager[method][1:2]
    assert counters["stats"]["unique_graphs"] == graphs
    assert max(rows_read) == len(PROMPTS) and 1 in rows_read  # the batch's read-out ran compiled, and one row's
    for method in ("ar", "eagle", "lookahead"):  # two rows, finished rows taking waiting prompts: each step's moves
        res = batch_decoder(target, make[method], max_new_tokens=NEW).generate_batch(
            PROMPTS, rows=2
        )  # wait for a graph
        assert res.tokens == eager[method] and res.prefills > 1, method  # that the joins' row edits settle first


@pytest.mark.slow
def test_two_rows_of_two_tokens_run_their_own_graph_exactly(compiled):
    """A batch of two rows verifying one-deep drafts runs a graph of its own (engine/runtime/forward.py: PAIR_ROWS),
    warmed
    up with the batched graphs: its logits are the eager model's, and it compiles nothing new."""
    target, _, _, _, _ = compiled
    forward = forward_for(target)
    forward.warm_up(2)
    calls: dict = {}
    pair = forward.pair_graph
    forward.pair_graph = counted(pair, calls, "pair")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(7))
    graphs = counters["stats"]["unique_graphs"]
    try:
        with torch.no_grad():
            cache = forward.new_cache(16)
            forward(ids[:, :8], cache)  # eager prefill
            mask = torch.zeros(2, 1, 2, 10)  # [B, 1, S, past + S] additive, per row as batches pass it: causal
            mask[:, :, 0, 9] = torch.finfo(mask.dtype).min
            out = forward(ids[:, 8:10], cache, mask)
            whole = target(input_ids=ids[:, :10]).logits  # [2, 10, V], eager, no cache
    finally:
        forward.pair_graph = pair
    assert calls == {"pair": 1} and counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(out.logits, whole[:, 8:], atol=1e-4, rtol=1e-4)
    assert torch.equal(out.greedy, out.logits.float().argmax(-1))


def counted(graph, calls: dict, key: str):
    def run(*args, **kwargs):
        calls[key] = calls.get(key, 0) + 1
        return graph(*args, **kwargs)

    return run


# ---- falling back ---------------------------------------------------------------------------------------------------


def test_a_head_that_fails_to_compile_drafts_eager_with_one_line(monkeypatch):
    target = tiny_model("llama", seed=0, sharpen=4.0)
    head = random_head(target)

    def broken(fn, **_):
        def run(*args, **kwargs):
            raise RuntimeError("InductorError: no working C++ compiler\n(long traceback)")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    report = compile_head(head, "the EAGLE head")
    assert not report.compiled and "\n" not in report.line()
    assert report.line().startswith("torch.compile failed for the EAGLE head (") and "eager" in report.line()
    assert compiled_step_of(head) is None and draft_step(head).compiled is None
    drafter = EagleDrafter(head, top_k=3, depth=3, total_tokens=8)
    assert (
        Decoder(target, drafter, max_new_tokens=NEW).generate(PROMPTS[1]).tokens == reference(target, PROMPTS[1])[:NEW]
    )


def _broken_graph(*args, **kwargs):
    """A compiled graph whose recompile fails mid-run."""
    raise RuntimeError("recompile failed")


def test_a_head_graph_that_fails_mid_run_finishes_the_run_eager():
    target = tiny_model("llama", seed=0, sharpen=4.0)
    head = random_head(target)
    step = CompiledDraftStep(head)

    step.one_row = _broken_graph
    draft_step(head).__dict__["compiled"] = step
    try:
        drafter = EagleDrafter(head, top_k=3, depth=3, total_tokens=8)
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(PROMPTS[1])
        assert res.tokens == reference(target, PROMPTS[1])[:NEW]
        assert step.failure.startswith("torch.compile failed (recompile failed)") and step.one_row is None
        assert compiled_step_of(head) is None  # the next run drafts eager from the start
    finally:
        uncompile_head(head)


def test_a_medusa_read_out_that_fails_mid_run_finishes_the_run_eager():
    target = tiny_model("llama", seed=0, sharpen=4.0)
    heads = random_heads(target)
    readout = CompiledReadout(heads)

    drafter = MedusaDrafter(heads, "cpu_16")
    readout.graphs[(drafter.topk, False, False)] = readout.graphs[(drafter.topk, False, True)] = _broken_graph
    candidates(heads).__dict__["compiled"] = readout
    try:
        res = Decoder(target, drafter, max_new_tokens=NEW).generate(PROMPTS[1])
        assert res.tokens == reference(target, PROMPTS[1])[:NEW]
        assert readout.failure == "torch.compile failed (recompile failed): reading the MedusaHeads out eager"
        assert compiled_readout_of(heads) is None  # the next run reads out eager from the start
    finally:
        uncompile_readout(heads)


def test_a_medusa_tree_that_reads_another_k_compiles_its_read_out_when_built():
    """The session compiles the default tree's read-out; a tree reading more candidates per head gets its graph when
    its drafter is built (before a run), so no run compiles mid-decode."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    heads = random_heads(target)
    default = MedusaDrafter(heads, "chain_4")  # k = 1
    assert compile_readout(heads, default.topk).compiled
    try:
        readout = compiled_readout_of(heads)
        assert list(readout.graphs) == [(1, False, False), (1, False, True)]  # every head's graph; head 0's
        wide = MedusaDrafter(heads, "cpu_16")
        assert wide.topk > 1 and {(wide.topk, False, False), (wide.topk, False, True)} <= set(readout.graphs)
        graphs = len(readout.graphs)
        res = Decoder(target, wide, max_new_tokens=NEW).generate(PROMPTS[1])
        assert res.tokens == reference(target, PROMPTS[1])[:NEW] and len(readout.graphs) == graphs
    finally:
        uncompile_readout(heads)


def test_a_failed_compile_leaves_the_model_eager_with_one_line(monkeypatch):
    target = tiny_model("llama", seed=0)

    def broken(fn, **_):
        def run(**kwargs):
            raise RuntimeError("InductorError: no working C++ compiler\n(long traceback)")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    report = compile_model(target, "the target")
    assert not report.compiled
    assert report.line().startswith("torch.compile failed for the target (")
    assert "running it eager" in report.line() and "\n" not in report.line()
    assert isinstance(forward_for(target), ModelForward)
    assert Decoder(target, max_new_tokens=6).generate([1, 2, 3]).tokens == reference(target, [1, 2, 3])[:6]


def test_a_graph_that_fails_mid_run_finishes_the_run_eager():
    target = tiny_model("llama", seed=0, sharpen=4.0)
    forward = CompiledForward(target, compile=False)

    def broken(moves, **kwargs):
        kwargs["cache"].layers[0].cumulative_length.add_(3)  # a half-run graph may have moved the counters
        raise RuntimeError("recompile failed")

    forward.graph = forward.one_graph = forward.small_graph = forward.pair_graph = broken
    register(target, forward)
    try:
        res = Decoder(target, VanillaDrafter(perturbed_copy(target, 0.3), gamma=3), max_new_tokens=NEW).generate(
            PROMPTS[1]
        )
        assert res.tokens == reference(target, PROMPTS[1])[:NEW]
        assert forward.failure.startswith("torch.compile failed (recompile failed)")
        assert isinstance(forward_for(target), ModelForward)  # the next run starts eager
    finally:
        uncompile(target)


@pytest.mark.slow
def test_the_compiled_graph_returns_every_rows_argmax(compiled):
    """Greedy verification, lookahead's guesses and vanilla's greedy drafts read the argmax the graph computes: it
    must be the argmax of the logits it returns, on one row and on several."""
    target, _, _, _, _ = compiled
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(5))
    forward = forward_for(target)
    with torch.no_grad():
        cache = forward.new_cache(16)
        assert greedy_ids(forward(ids[:, :8], cache)).shape == (2, 8)  # eager prefill: computed on demand
        for width in (1, 3):  # several rows under per-row masks, as batches call it (the graphs warmed up above)
            mask = torch.zeros(2, 1, width, cache_length(cache) + width)
            out = forward(ids[:, 8 : 8 + width], cache, mask)
            assert out.greedy is not None and torch.equal(out.greedy, out.logits.float().argmax(-1))


def test_forgetting_compiled_forwards_and_steps_frees_their_models_and_heads():
    """A new compiled session forgets earlier compiled forwards and drafting steps (Session.compile_models): each
    holds its model or head, and the registries' values kept their keys alive, so every reload leaked them."""
    import gc
    import weakref

    from engine.heads.compiled_step import forget_compiled_steps
    from engine.heads.readout import draft_steps
    from engine.runtime import forward
    from engine.runtime.forward import forget_compiled

    # what other tests compiled (this module's fixture) is compiled again afterwards: forgetting is global
    kept = dict(forward._REGISTRY)
    kept_steps = [(step, step.compiled) for step in draft_steps() if step.compiled is not None]
    target = tiny_model("llama", seed=0)
    head = random_head(target)
    register(target, CompiledForward(target, compile=False))
    draft_step(head).__dict__["compiled"] = CompiledDraftStep(head)  # torch.compile is lazy: nothing compiles
    refs = [weakref.ref(target), weakref.ref(head)]
    del target, head
    gc.collect()
    assert all(r() is not None for r in refs)  # held by the registries alone
    forget_compiled()
    forget_compiled_steps()
    gc.collect()
    try:
        assert all(r() is None for r in refs)
    finally:
        for model, compiled_forward in kept.items():
            register(model, compiled_forward)
        for step, compiled_step in kept_steps:
            step.__dict__["compiled"] = compiled_step
