"""How a model runs over its KV cache: eager over an editable DynamicCache (the default), or compiled over a static one.

Every caller (the decoders, the vanilla drafter) asks `forward_for(model)` for a cache (`new_cache`) and a forward
over it: ids, an additive mask over the cached entries and the new ones (None: causal), positions (None: right
after the cache). `compile_model` compiles one model with `torch.compile`, warms it up and registers the compiled
forward for it; every later `forward_for` of that model gets it. When compiling fails the model stays eager and the
reason comes back as one line.

The compiled forward runs over a `StaticKVCache`: the mask covers a window of it (its entries and the new ones,
rounded up; engine/attention_window.py), entries past the length masked, and attention reads the keys in the window
only. The sequence, window and batch dimensions are symbolic (`dynamic=True`), so a few graphs serve every draft or
tree size without padding: one for a single new token, symbolic ones for several (SMALL_TOKENS, SEVERAL_TOKENS; one
for batches), and graphs of their own for one row's two tokens and two rows' two (STATIC_TOKENS, PAIR_ROWS).
Prefill (an empty cache, any prompt length) runs eager.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from engine.attention_window import unwrap_attention, window, wrap_attention
from engine.cache import cache_length, new_cache
from engine.errors import Cancelled, reason
from engine.features import layer_inputs
from engine.packed import pack_linears, warm_products
from engine.static_cache import StaticKVCache, apply_moves

Progress = Callable[[int, int, str], None]
T = TypeVar("T")
RECOMPILE_LIMIT = 32
TUNE_PRODUCTS = "GLANCE_TUNE_PRODUCTS"  # "0": compile without timing each matrix product (tune_products)
COMPILE_STEPS = 4  # progress reports per compiled model: one token, two, a few, several
# A one-row forward of two new tokens (a one-deep draft verified, the budget's commonest choice off the suite; a
# draft model's or head's catch-up after it) runs in a graph specialised to two, as a one-token forward runs in one
# specialised to one (dynamo's rule for sizes 0 and 1); other sizes run in the symbolic graphs below. Specialised,
# inductor times each product for two rows (engine.forward.tune_products) where the symbolic graph takes one kernel
# for any. Measured on the bundled target (float32, the AVX2 EPYC, interleaved, 300 calls each after a 300-token
# prompt): one token 12.81 ms, two in the symbolic graph 16.14, two in their own graph 13.39; compiling it took 49 s.
STATIC_TOKENS = 2
# A one-row forward of three or four new tokens (spines two and three deep) runs in a symbolic graph of its own,
# traced at three, and five or more (trees, lookahead's window) in one traced at SEVERAL_TOKENS. Inductor picks each
# product's kernel once, at the size a graph is traced at (tune_products), and that pick serves every size the graph
# runs. One graph traced at three (as it was) scaled badly: forwards of 8 / 16 / 64 new tokens (bf16, this 2-core
# EPYC without AMX, 128 cached tokens) took 9.9 / 14.4-17.4 / 41-54 ms on the bundled target and 55.7 / 100 / 348 ms
# on SmolLM2-135M (eager: 46 / 53 / 100), where traced at 16 they took 5.4-6.5 / 6.5-6.6 / 15 ms and 26-28 / 31-32 /
# 74-77 ms. Traced at 16 alone, four tokens slowed from 5.3-5.9 to 6.4-6.6 ms (lookahead's fitted window, as decoded
# off the suite) and from about 16 to 20-24 ms on SmolLM2, and lookahead fell from 1.62x to 1.22x of plain decoding.
SMALL_TOKENS = 4
# Two rows of two new tokens each (one-deep drafts verified in a batch of two; every batch of four once two of its
# rows have finished) run in a graph of their own, its products inductor's C++ kernel (as one row's two tokens): in
# the batches' symbolic graph (then traced at three tokens, products timed) such a forward cost 1.4 one-token
# forwards of the two rows (the sweep's grid: 4.7 against 3.3 ms), where one row's two tokens cost 1.1 of its one.
# Interleaved in one process (bundled target, bf16 EPYC, 128 cached tokens each): 3.37 against 4.38 ms, a one-token
# forward of the two rows 3.1. A graph of its own at three and four rows (products timed, as at six and eight rows
# the C++ kernel ran slower: 9.8 against 6.0 ms at four rows) ran level with the symbolic graph (4.84 / 4.88 and
# 6.15 / 6.16 ms), so those stay in it.
PAIR_ROWS = 2
# Batches' symbolic graph (two tokens a row and more, but PAIR_ROWS') is traced at this many tokens a row, so the
# products' kernels are timed at rows x 8. Traced at three (as it was), interleaved in one process against traced at
# eight (bundled target, bf16 EPYC, 128 cached tokens, ms for 3 / 4 / 5 / 8 tokens a row): two rows 4.98 / 5.62 /
# 5.98 / 7.17 against 5.13 / 5.52 / 5.80 / 6.66, four rows 7.28 / 7.85 / 8.90 / 11.47 against 7.23 / 7.61 / 8.44 /
# 10.32: level at three tokens, 2-10% faster from four on (lookahead's windows, trees, spines three deep).
BATCH_TRACE_TOKENS = 8
SEVERAL_TOKENS = 16
# New tokens per forward whose packed products are warmed at load (engine/packed.py: warm_products): a verify of
# the largest default trees and lookahead's window (up to 33 tokens), a draft model's or head's catch-up after plain
# steps. Larger ones build their primitives when first seen.
WARM_ROWS = 40
# The one- and two-token graphs of one row take inductor's C++ kernel for every product it can write, untimed: timed
# product by product (tune_products), oneDNN's call won most of the two-token graph's products, and that graph ran a
# two-token forward of the bundled target at 1.25-1.35x a one-token one (bf16 EPYC, interleaved, 128 and 256 cached
# tokens). With the C++ kernel throughout it ran at 1.0-1.1x, and one-deep spines every step went from 0.85-0.99x to
# 0.95-1.15x of plain decoding off the suite. The symbolic graph (three tokens and more: trees, windows) keeps the
# timed choice: there the C++ kernel throughout ran 8 to 64 tokens 20-40% slower. Batched graphs keep it too.
# EAGLE's one-row drafting graph (engine/heads/compiled_step.py) takes it as well: interleaved in one process (300
# cached pairs), the EAGLE head's call took 1.02, 0.92, 0.98 ms for 1, 2, 4 new rows against 1.03, 1.08, 1.06 timed,
# EAGLE-3's 0.83, 0.77, 0.81 against 0.83, 0.99, 0.91; at 8 rows (a catch-up after plain steps) 2.17 and 1.81
# against 1.54 and 1.45, which drafting meets once per switch, where 2-4 rows come every drafted step.
SMALL_GRAPH_PRODUCTS = "CPP"


def _keep(model: torch.nn.Module, logits_at: list[int] | None, S: int, device) -> dict:
    """The model's `logits_to_keep` for `logits_at` (positions of the new tokens whose logits the caller reads; None:
    all): the LM head then runs on those rows only. A prompt's prefill needs the last row's; over a 150-token prompt
    the others cost about as much as a third of the prefill on the bundled target. {} where the model has no such
    argument, or all rows are wanted."""
    if logits_at is None or len(logits_at) == S or not _takes_logits_to_keep(type(model)):
        return {}
    return {"logits_to_keep": 1 if list(logits_at) == [S - 1] else torch.tensor(logits_at, device=device)}


@functools.cache
def _takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def _pick_logits(out, logits_at: list[int] | None, S: int) -> None:
    """Where the model ignored `logits_to_keep` (or a graph computed every row): keep the asked rows only, so every
    caller sees logits [B, len(logits_at), V]."""
    if logits_at is not None and out.logits.shape[1] == S and len(logits_at) != S:
        out.logits = out.logits[:, list(logits_at)]
        if getattr(out, "greedy", None) is not None:
            out.greedy = out.greedy[:, list(logits_at)]


class ModelForward:
    """The eager forward over transformers' DynamicCache, which engine/cache.py crops and compacts."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def new_cache(self, positions: int):
        """An empty cache for a run of at most about `positions` entries (eager caches grow as they go)."""
        return new_cache(self.model.config)

    def mask_width(self, cache, new: int) -> int:
        """Columns of the mask a forward of `new` tokens takes whole: the cached entries and the new ones."""
        return cache_length(cache) + new

    def __call__(
        self,
        ids: torch.Tensor,
        cache,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        hidden: bool = False,
        feature_layers: tuple[int, ...] | list[int] = (),
        logits_at: list[int] | None = None,
    ):
        """ids, positions: [B, S]; mask: additive [B or 1, 1, S, past + S]. The model's output, with
        `layer_features`: the inputs [B, S, H] of `feature_layers`; its logits [B, len(logits_at), V] at the new
        tokens `logits_at` (None: every one)."""
        kwargs = _keep(self.model, logits_at, ids.shape[1], ids.device)
        if mask is not None:
            kwargs["attention_mask"] = mask
        if positions is not None:
            kwargs["position_ids"] = positions
        with layer_inputs(self.model, feature_layers) as features:
            out = self.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=hidden, **kwargs)
        out.layer_features = features
        _pick_logits(out, logits_at, ids.shape[1])
        return out


def trusted_guards(entries) -> list[bool]:
    """Which of dynamo's guards a compiled graph keeps checking on every call: those on its inputs (shapes, strides,
    dtypes, the cache's tensors and lengths), not those on nn modules' attributes or on globals. A graph compiled
    for a CPU already holds the weights as constants (freezing), so a model or head must not change after compiling
    anyway; checking those guards cost 0.35 ms per call of the bundled target (dynamo's lookup: 441 us, now 95)."""
    modules = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    globals_ = torch.compiler.skip_guard_on_globals_unsafe(entries)
    return [a and b for a, b in zip(modules, globals_)]


def tune_products() -> None:
    """Let inductor write each matrix product of a CPU graph as its own C++ kernel (its GEMM template: the weight
    re-blocked for AMX or AVX-512, the norm before it and the activation or residual after it fused in), timed against
    oneDNN's call once per shape while compiling, instead of calling oneDNN for every product. Measured here (bf16, two
    threads, off-suite prompts, two rounds in separate processes): plain decoding 194-203 -> 309-311 tok/s, the draft
    model's one-token forward 0.96 -> 0.70 ms; compiling the bundled models took 101 -> 215 s with an empty cache (70
    -> 87 s with inductor's cache warm). Global, as freezing is: read whenever a graph compiles. Its reports on
    stderr stay off (every timing, a JSON line per product, a deprecation warning from its benchmarking).
    `GLANCE_TUNE_PRODUCTS=0` skips the timing: compiling is several times faster, every forward slower (the test
    suite compiles dozens of tiny graphs whose speed nobody reads)."""
    if os.environ.get(TUNE_PRODUCTS, "1") == "0":
        return
    torch._inductor.config.max_autotune_gemm = True
    torch._inductor.config.max_autotune_gemm_backends = "CPP,ATEN"
    torch._inductor.config.autotune_num_choices_displayed = 0
    torch._inductor.config.max_autotune_report_choices_stats = False
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, "torch._inductor.select_algorithm")


def small_graph_products(applies: bool) -> contextlib.AbstractContextManager:
    """Where products are tuned (a frozen CPU graph), graphs compiled inside take SMALL_GRAPH_PRODUCTS only when
    `applies`; a graph compiled later, for a new shape, takes the timed choice."""
    if not (applies and torch._inductor.config.freezing and torch._inductor.config.max_autotune_gemm):
        return contextlib.nullcontext()
    return torch._inductor.config.patch(max_autotune_gemm_backends=SMALL_GRAPH_PRODUCTS)


def compile_function(fn: Callable) -> Callable:
    """`fn` under torch.compile as Glance compiles every decoding graph: symbolic sizes, input guards only."""
    return torch.compile(fn, dynamic=True, options={"guard_filter_fn": trusted_guards})


def _mark_tokens_static(kwargs: dict, rows: bool = False) -> None:
    """Mark the new-token dimension of a forward's inputs static (and the batch's, with `rows`): dynamo compiles (or
    picks) the graph for exactly that many tokens (STATIC_TOKENS) and rows."""
    torch._dynamo.mark_static(kwargs["input_ids"], 1)  # [B, S]
    torch._dynamo.mark_static(kwargs["position_ids"], 1)  # [B, S]
    torch._dynamo.mark_static(kwargs["attention_mask"], 2)  # [B, 1, S, width]
    if rows:
        for name in ("input_ids", "position_ids", "attention_mask"):
            torch._dynamo.mark_static(kwargs[name], 0)


def _graph_function(model: torch.nn.Module, tag: str = "") -> Callable:
    """What gets compiled for `model`: its forward plus each row's argmax (greedy verification and lookahead's
    guesses read it; fused into the graph it is nearly free, while aten's argmax over bf16 logits of 17 rows took
    0.2-0.4 ms here). It runs `model.forward`, not the module call, so the benchmark clock's hooks stay outside the
    graph. Each model gets its own code object, so dynamo keeps a short cache of graphs per model: a cache shared
    across models costs a guard check per cached graph that does not match."""

    def decode(moves, **kwargs):
        # [MOVE_SLOTS] each: the last compaction's sources, destinations (and a batch's rows), before this writes
        apply_moves(kwargs["cache"].layers, *moves)
        out = model.forward(**kwargs)
        return out, out.logits.argmax(-1)  # [B, S]

    code = decode.__code__.replace(co_name=f"decode_{type(model).__name__}_{id(model):x}{tag}")
    return types.FunctionType(code, decode.__globals__, code.co_name, None, decode.__closure__)


def greedy_ids(out) -> torch.Tensor:
    """[B, S]: each row's argmax token of a forward's output. The compiled graph computes it; otherwise it is
    computed here once (over float32 logits: aten's bfloat16 argmax is about twice as slow on a CPU) and kept."""
    ids = getattr(out, "greedy", None)
    if ids is None:
        ids = out.logits.float().argmax(-1)
        out.greedy = ids
    return ids


class CompiledForward(torch.nn.Module):
    """The model's forward under `torch.compile` over a StaticKVCache. A module, so that the benchmark's clock times
    its calls with the same hooks as the eager model's."""

    def __init__(self, model: torch.nn.Module, compile: bool = True) -> None:
        """`compile=False`: the same static cache and masks, run eager (what a failed compile falls back to)."""
        super().__init__()
        self.__dict__["model"] = model  # not a submodule: the model stays the caller's
        # Each model has its own code object (_graph_function), but one model at one and several tokens, one and
        # several rows, with and without per-row masks, can pass dynamo's default limit of 8 graphs.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        # On a CPU, freezing folds the weights into the graph as constants, so inductor packs them for oneDNN's
        # matrix products: a one-token forward of the bundled target took 5.3 ms against 8.8 without (and 14-18 eager).
        # (Set globally: per-call options did not reach the lazily compiled graphs. It applies to graphs compiled
        # without gradients only, so training's compiled steps are untouched.)
        self.frozen = next(model.parameters()).device.type == "cpu" and compile
        if self.frozen:
            torch._inductor.config.freezing = True
            # Frozen linears that read the same input (q/k/v, gate/up) become one matrix product: each oneDNN call
            # costs tens of microseconds on top of its arithmetic, and a one-token forward makes 57 of them.
            # Interleaved here: the bundled target 12.3 -> 10.8 ms per one-token forward, the draft 2.1 -> 1.8 ms.
            torch._inductor.config.cpp.enable_concat_linear = True
            tune_products()
            # One packed copy of the weights for every graph and the eager prefill (engine/packed.py): with a copy
            # per graph, a drafted step evicted the one-token graph's and the plain steps after it ran slow.
            pack_linears(model)
        # Masks span the live entries (rounded up), not the capacity, and attention reads only those keys (engine/
        # attention_window.py); a model whose attention does not dispatch through transformers' registry keeps
        # masks over the whole capacity.
        self.windowed = wrap_attention(model)
        # Sizes that happen to be equal at tracing must not become one symbol (dynamo's "duck shaping"): a 64-wide
        # window traced beside 64-wide heads specialised every graph to windows of 64, and each later width compiled
        # a graph of its own. (Global, as freezing is: read whenever dynamo traces.)
        torch.fx.experimental._config.use_duck_shape = False
        self.graph = compile_function(_graph_function(model)) if compile else None
        # one row, three or four new tokens (SMALL_TOKENS): products picked for a few rows
        self.small_graph = compile_function(_graph_function(model, "_few")) if compile else None
        # two rows, two new tokens each (PAIR_ROWS): its own graph, products picked for four
        self.pair_graph = compile_function(_graph_function(model, "_pair")) if compile else None
        self.strict = False  # while warming up: a compile error propagates instead of falling back
        self.failure: str | None = None
        self._ramp: torch.Tensor | None = None  # the causal mask's row template (_causal)

    def new_cache(self, positions: int) -> StaticKVCache:
        cache = StaticKVCache(self.model.config, positions)
        cache.pinned = not self.frozen
        return cache

    def mask_width(self, cache: StaticKVCache, new: int) -> int:
        """Columns of the mask a forward of `new` tokens takes whole (a caller's mask that wide goes to the graph as
        it is): the window over the entries and the new ones, or every slot of the buffers where attention is not
        windowed; the entries and the new ones when the forward must grow the cache."""
        needed = cache.length + new
        if self.windowed or needed > cache.capacity:
            return window(needed, cache.capacity)
        return cache.slots

    def _full_mask(self, mask: torch.Tensor | None, S: int, past: int, width: int, device) -> torch.Tensor:
        """The additive mask [B or 1, 1, S, width] the graph takes: what the caller gave over [0, past + S) (None:
        causal), every column after it masked; a caller's mask already that wide, as it is."""
        dtype = self.model.dtype
        if mask is not None and mask.shape[-1] == width and mask.dtype == dtype:
            return mask
        low = torch.finfo(dtype).min
        if mask is None:
            return self._causal(S, past, width, dtype, device)
        full = torch.full((*mask.shape[:3], width), low, dtype=dtype, device=device)
        keep = min(mask.shape[-1], width)  # a caller's mask wider than the window masks every column past it
        full[..., :keep] = mask[..., :keep]
        return full

    def _causal(self, S: int, past: int, width: int, dtype, device) -> torch.Tensor:
        """[1, 1, S, width] additive: new token i (at position past + i) sees columns up to its own. Cut from a kept
        row template (a slice and one copy, two for several rows, where arange, compare and fill took five ops: tens
        of microseconds on each of a draft model's one-millisecond forwards). Template: `ramp[j]` is 0 for j < n,
        the lowest value after, so `ramp[n - 1 - r : n - 1 - r + width]` is position r's row; a fresh tensor, never a
        view (see forward)."""
        n = max(width, past + S)
        ramp = self._ramp
        if ramp is None or ramp.shape[0] < 2 * n or ramp.dtype != dtype or ramp.device != device:
            n = max(n, 2 * (ramp.shape[0] // 2 if ramp is not None else 0), 1024)
            ramp = torch.zeros(2 * n, dtype=dtype, device=device)
            ramp[n:] = torch.finfo(dtype).min
            self._ramp = ramp
        n = ramp.shape[0] // 2
        rows = ramp.unfold(0, width, 1)  # [2n - width + 1, width]: row i = ramp[i : i + width] (a view)
        start = n - past - S  # position past + S - 1's row; earlier positions' rows follow it
        # [1, 1, S, width]: positions past .. past + S - 1, in a fresh tensor laid out as torch.zeros lays it out
        # (the graphs guard on strides, a size-1 dimension's too: flip's output kept the windows' and compiled 2-4
        # graphs more)
        out = torch.empty((1, 1, S, width), dtype=dtype, device=device)
        src = rows[start : start + S]
        out[0, 0].copy_(src if S == 1 else src.flip(0))
        return out

    def forward(
        self,
        ids: torch.Tensor,
        cache: StaticKVCache,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        hidden: bool = False,
        feature_layers: tuple[int, ...] | list[int] = (),
        logits_at: list[int] | None = None,
    ):
        B, S = ids.shape
        past = cache.length
        cache.reserve(S)
        device = ids.device
        if positions is None:
            # [B, S], contiguous and not a view, as callers' are: the graphs guard on a view's base, and a one-row
            # graph traced with a view compiled again for the first caller's positions (the batch decoder's, B = 1)
            positions = torch.tensor([list(range(past, past + S))] * B, device=device)
        if ids.stride() != (S, 1):  # the graphs guard on strides: a caller's slice would compile graphs of its own
            ids = ids.clone(memory_format=torch.contiguous_format)
        kwargs = {
            "input_ids": ids,
            "attention_mask": self._full_mask(mask, S, past, self.mask_width(cache, S), device),
            "position_ids": positions.contiguous(),
            "cache": cache,
            "use_cache": True,
            "output_hidden_states": True,  # always: one graph for every drafter (features come from it)
        }
        if past == 0 or self.graph is None:  # prefill (any prompt length): eager
            cache.settle()
            out = self.model(**kwargs, **_keep(self.model, logits_at, S, device))
            if not cache.pinned:
                cache.unpin()  # the buffers exist now (created by the first write)
        else:
            pair = B == PAIR_ROWS and S == STATIC_TOKENS and self.pair_graph is not None
            if S == STATIC_TOKENS and B == 1 or pair:
                _mark_tokens_static(kwargs, rows=pair)
            few = B == 1 and STATIC_TOKENS < S <= SMALL_TOKENS and self.small_graph is not None
            graph = self.pair_graph if pair else self.small_graph if few else self.graph
            try:
                out, greedy = graph(cache.move_inputs(device, B), **kwargs)
                cache.moves_done()
                out.greedy = greedy
            except Exception as exc:  # a compile error on a new shape: this run and the next ones go eager
                if self.strict:
                    raise
                self._give_up(exc)
                cache.set_length(past)
                cache.settle()  # a graph that failed to compile did not run: its moves are still pending
                out = self.model(**kwargs)
        _pick_logits(out, logits_at, S)  # the graph computes every row's (one graph for every caller)
        cache.advance(S)
        out.layer_features = [out.hidden_states[i] for i in feature_layers]
        return out

    def warm_up(self, rows: int = 1, name: str = "the model", progress: Progress | None = None) -> None:
        """Compile the graphs decoding `rows` rows at a time uses (one new token; several; with `rows` > 1 only under
        per-row masks, the only way the batch decoder and the batched draft call it) now rather than in the middle of
        a timed run: the sweep's first batch-2 cell of vanilla once compiled three graphs and ran at 0.4x. A compile
        error propagates."""
        device = next(self.model.parameters()).device
        if rows == 1:  # one row: no mask (fresh input, as callers' strides are)
            # oneDNN's primitive per row count of every packed product: drafts and verifies vary in size
            warm_products(self.model, WARM_ROWS)
            shapes = [(1, 1, "one token"), (1, STATIC_TOKENS, "two tokens")]
            shapes += [(1, STATIC_TOKENS + 1, "a few tokens"), (1, SEVERAL_TOKENS, "several tokens")]
        else:  # batches run one symbolic graph from two tokens on, but two rows of two tokens (see forward)
            shapes = [(rows, 1, "one token"), (rows, BATCH_TRACE_TOKENS, "several tokens")]
            if self.pair_graph is not None:  # a batch of more rows comes down to two as its rows finish
                shapes.append((PAIR_ROWS, STATIC_TOKENS, "two tokens"))
        self.strict = True
        try:
            with torch.no_grad():
                caches: dict[int, StaticKVCache] = {}
                for i, (b, width, what) in enumerate(shapes):
                    if progress is not None:
                        batch = f" in batches of {b}" if b > 1 else ""
                        progress(i, COMPILE_STEPS, f"compiling {name} for {what}{batch} (once per session)")
                    cache = caches.get(b)
                    if cache is None:
                        cache = caches[b] = self.new_cache(32)
                        self(torch.zeros(b, 4, dtype=torch.long, device=device), cache)  # eager prefill
                    mask = None  # batches always pass a mask per row [B, 1, S, past + S]: only those graphs
                    if b > 1:
                        mask = torch.zeros(b, 1, width, cache.length + width, dtype=self.model.dtype, device=device)
                    # SMALL_GRAPH_PRODUCTS: one row's one and two tokens, two rows' two (PAIR_ROWS)
                    generated = width <= STATIC_TOKENS if b == 1 else width == STATIC_TOKENS
                    with small_graph_products(self.frozen and generated):
                        self(torch.zeros(b, width, dtype=torch.long, device=device), cache, mask)
        finally:
            self.strict = False

    def _give_up(self, exc: Exception) -> None:
        self.graph = self.small_graph = self.pair_graph = None
        self.failure = f"torch.compile failed ({reason(exc)}): running {type(self.model).__name__} eager"
        _REGISTRY.pop(self.model, None)


_REGISTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> CompiledForward
_LOCK = threading.Lock()


def forward_for(model: torch.nn.Module) -> ModelForward | CompiledForward:
    """The forward registered for `model` by `compile_model`, else the eager one."""
    compiled = _REGISTRY.get(model)
    return compiled if compiled is not None else ModelForward(model)


@dataclass
class CompileReport:
    """What compiling one model gave: the compiled forward is in use, the seconds it took, or why not."""

    name: str
    compiled: bool
    seconds: float
    note: str = ""

    def line(self) -> str:
        if self.compiled:
            return f"compiled {self.name} in {self.seconds:.0f} s"
        return self.note


def compile_timed(name: str, build: Callable[[], T], eager: str, undo: Callable[[], None] | None = None):
    """(what `build()` compiled and warmed up, or None; its CompileReport): how every part gets compiled. Any failure
    (no C compiler, an unsupported op or architecture, out of memory...) leaves the part eager, after `undo()`, and
    the report says why in one line ending in `eager` ("running it eager")."""
    t0 = time.perf_counter()
    try:
        built = build()
    except Cancelled:
        if undo is not None:
            undo()
        raise
    except Exception as exc:
        if undo is not None:
            undo()
        note = f"torch.compile failed for {name} ({reason(exc)}): {eager}"
        return None, CompileReport(name, False, time.perf_counter() - t0, note)
    return built, CompileReport(name, True, time.perf_counter() - t0)


def warmed(part: T, *args) -> T:
    """`part` after `part.warm_up(*args)`: a compiled part is built and warmed up in one `compile_timed` build."""
    part.warm_up(*args)
    return part


def compile_model(model: torch.nn.Module, name: str = "the model", progress: Progress | None = None) -> CompileReport:
    """Compile `model`'s forward and warm it up on the shapes decoding uses (one new token; several), so that the
    first run does not pay for it. On any failure the model stays eager and the report says why in one line."""
    with _LOCK:
        if model in _REGISTRY:
            return CompileReport(name, True, 0.0)
        fwd, report = compile_timed(
            name,
            lambda: warmed(CompiledForward(model), 1, name, progress),
            "running it eager",
            lambda: unwrap_attention(model),
        )
        if fwd is not None:
            register(model, fwd)
        return report


def register(model: torch.nn.Module, forward: CompiledForward) -> None:
    """Every later `forward_for(model)` gets `forward`."""
    _REGISTRY[model] = forward


def forget_compiled() -> None:
    """Drop every registered compiled forward. Each one holds its model (the registry's values keep their keys
    alive), so without this a reloaded session kept every earlier compiled model in memory."""
    _REGISTRY.clear()


def uncompile(model: torch.nn.Module) -> None:
    """Go back to the eager forward for `model` (tests, and a user who turns compiling off)."""
    _REGISTRY.pop(model, None)
    unwrap_attention(model)
