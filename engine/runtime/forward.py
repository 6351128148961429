"""How a model runs over its KV cache: eager over an editable DynamicCache (the default), or compiled over a static one.

Every caller (the decoders, the vanilla drafter) asks `forward_for(model)` for a cache (`new_cache`) and a forward
over it: ids, an additive mask over the cached entries and the new ones (None: causal), positions (None: right
after the cache). `compile_model` compiles one model with `torch.compile`, warms it up and registers the compiled
forward for it; every later `forward_for` of that model gets it. When compiling fails the model stays eager and the
reason comes back as one line.

The compiled forward runs over a `StaticKVCache`: the mask covers a window of it (its entries and the new ones,
rounded up; engine/runtime/attention_window.py), entries past the length masked, and attention reads the keys in the
window
only. The sequence, window and batch dimensions are symbolic (`dynamic=True`), so a few graphs serve every draft or
tree size without padding: one for a single new token, symbolic ones for several (SMALL_TOKENS, SEVERAL_TOKENS; one
for batches), and graphs of their own for one row's two tokens and two rows' two (STATIC_TOKENS, PAIR_ROWS).
Prefill (an empty cache, any prompt length) runs eager.
"""

from __future__ import annotations

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

from engine.errors import Cancelled, reason
from engine.runtime.attention_window import unwrap_attention, window, wrap_attention
from engine.runtime.cache import cache_length, new_cache
from engine.runtime.layer_features import layer_inputs
from engine.runtime.packed import pack_linears, warm_products
from engine.runtime.static_cache import StaticKVCache, apply_moves

Progress = Callable[[int, int, str], None]
T = TypeVar("T")
RECOMPILE_LIMIT = 32
TUNE_PRODUCTS = "GLANCE_TUNE_PRODUCTS"  # "0": compile without timing each matrix product (inductor_options)
COMPILE_STEPS = 4  # progress reports per compiled model: one token, two, a few, several
# A one-row forward of two new tokens (a one-deep draft verified, the budget's commonest choice on a CPU) runs in a
# graph specialised to two, as one token runs in one specialised to one: inductor then picks each product's kernel
# for exactly that shape, where a symbolic graph takes one kernel for every size.
STATIC_TOKENS = 2
# Three or four new tokens run in a symbolic graph traced at three, five or more (trees, lookahead's window) in one
# traced at SEVERAL_TOKENS: inductor picks each product's kernel at the size a graph is traced at, and one graph for
# every size either slowed 64-token forwards several-fold (traced small) or four-token ones by a fifth (traced large).
SMALL_TOKENS = 4
# Two rows of two new tokens (one-deep drafts verified in a batch of two, and every batch of four once two rows have
# finished) run in a graph of their own with inductor's C++ products, as one row's two tokens do; three and four
# rows ran level in the batches' symbolic graph and stay there.
PAIR_ROWS = 2
# Batches' symbolic graph is traced at this many tokens a row, so its products are picked for rows x 8: level with
# three tokens a row at three, faster from four on (lookahead's windows, trees).
BATCH_TRACE_TOKENS = 8
SEVERAL_TOKENS = 16
# New tokens per forward whose packed products are warmed at load (engine/runtime/packed.py: warm_products): a verify of
# the largest default trees and lookahead's window (up to 33 tokens), a draft model's or head's catch-up after plain
# steps. Larger ones build their primitives when first seen.
WARM_ROWS = 40
# The one- and two-token graphs of one row (and EAGLE's one-row drafting graph) take inductor's C++ kernel for every
# product, untimed: timed one product at a time, oneDNN won most of them, yet the whole forward then ran a quarter
# slower than with the C++ kernel throughout. Graphs of three tokens and more keep the timed choice.
SMALL_GRAPH_PRODUCTS = "CPP"
TIMED_PRODUCTS = "CPP,ATEN"  # the other graphs: inductor's C++ kernel or oneDNN's call, whichever times faster


def _keep(model: torch.nn.Module, logits_at: list[int] | None, S: int, device) -> dict:
    """The model's `logits_to_keep` for `logits_at` (positions of the new tokens whose logits the caller reads; None:
    all): the LM head then runs on those rows only. A prompt's prefill needs the last row's; over a 150-token prompt
    the others cost about as much as a third of the prefill on the bundled target. {} where the model has no such
    argument, or all rows are wanted."""
    if logits_at is None or len(logits_at) == S or not _takes_logits_to_keep(type(model)):
        return {}
    last = list(logits_at) == [S - 1] and not _drops_positions(model.config)
    return {"logits_to_keep": 1 if last else torch.tensor(logits_at, device=device)}


def _drops_positions(config) -> bool:
    """Gemma 4 with KV-shared layers runs those layers on the kept positions only when `logits_to_keep` is an int,
    so its hidden states and their layers' inputs lose every other position (even with output_hidden_states): such
    a model gets the index form, which keeps them all."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "num_kv_shared_layers", 0))


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
    """The eager forward over transformers' DynamicCache, which engine/runtime/cache.py crops and compacts."""

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
    anyway; checking those guards cost a twentieth of a plain decoding step on a CPU."""
    modules = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    globals_ = torch.compiler.skip_guard_on_globals_unsafe(entries)
    return [a and b for a, b in zip(modules, globals_)]


def inductor_options(frozen: bool, generated_products: bool = False) -> dict:
    """Inductor's options for one graph, passed to its own `torch.compile` and so scoped to it (nothing is set
    process-wide). `frozen` (a CPU graph without gradients): the weights become constants that inductor packs, and
    linears reading one input (q/k/v, gate/up) become one product, since each oneDNN call costs tens of microseconds
    on top of its arithmetic. Unless `GLANCE_TUNE_PRODUCTS=0`, inductor also writes each matrix product as its own
    C++ kernel (its GEMM template, the weight re-blocked and its neighbours fused), timed against oneDNN's call once
    per shape while compiling; `generated_products` takes that kernel untimed (SMALL_GRAPH_PRODUCTS). Timing makes
    every forward faster and compiling about twice as slow, so the test suite turns it off."""
    if not frozen:
        return {}
    options: dict = {"freezing": True, "cpp.enable_concat_linear": True}
    if os.environ.get(TUNE_PRODUCTS, "1") != "0":
        options.update(
            max_autotune_gemm=True,
            max_autotune_gemm_backends=SMALL_GRAPH_PRODUCTS if generated_products else TIMED_PRODUCTS,
            autotune_num_choices_displayed=0,  # inductor's timing reports stay off the user's terminal
            max_autotune_report_choices_stats=False,
        )
    return options


# Inductor's product timing warns once per process through a deprecated storage API; the warning says nothing to
# a Glance user.
warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, "torch._inductor.select_algorithm")


class ScopedGraph:
    """A function under `torch.compile` whose settings hold only while it runs. Inductor's options go to the compile
    itself; what dynamo reads while tracing (freezing, duck shapes, the recompile limit) is set around each call
    with torch's low-overhead patcher (a few microseconds) and restored after it: torch keeps these settings per
    thread, and a graph traced lazily, on a later call, must see the same ones as its warm-up did."""

    def __init__(self, fn: Callable, options: dict) -> None:
        self.options = options
        self.compiled = torch.compile(fn, dynamic=True, options={"guard_filter_fn": trusted_guards, **options})
        # Sizes that happen to be equal at tracing must not become one symbol (dynamo's "duck shaping"): a 64-wide
        # window traced beside 64-wide heads specialised every graph to windows of 64.
        self._patchers = [
            torch.fx.experimental._config._make_closure_patcher(use_duck_shape=False),
            # one model at one and several tokens, one and several rows, can pass dynamo's default of 8 graphs
            torch._dynamo.config._make_closure_patcher(recompile_limit=RECOMPILE_LIMIT),
        ]
        if options.get("freezing"):  # dynamo makes the weights graph constants only while freezing is on
            self._patchers.append(torch._inductor.config._make_closure_patcher(freezing=True))

    def __call__(self, *args, **kwargs):
        reverts = [patch() for patch in self._patchers]
        try:
            return self.compiled(*args, **kwargs)
        finally:
            for revert in reversed(reverts):
                revert()


def compiles_frozen(module: torch.nn.Module) -> bool:
    """Whether `module`'s graphs compile with frozen weights: on a CPU, where packing them for oneDNN made a
    one-token forward of the bundled target about 40% faster."""
    param = next(module.parameters(), None)
    return param is not None and param.device.type == "cpu"


def compile_function(fn: Callable, frozen: bool = False, generated_products: bool = False) -> ScopedGraph:
    """`fn` under torch.compile as Glance compiles every decoding graph: symbolic sizes, input guards only, its own
    inductor options (inductor_options)."""
    return ScopedGraph(fn, inductor_options(frozen, generated_products))


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
        self.frozen = compile and compiles_frozen(model)
        if self.frozen:
            # One packed copy of the weights for every graph and the eager prefill (engine/runtime/packed.py): with a
            # copy
            # per graph, a drafted step evicted the one-token graph's and the plain steps after it ran slow.
            pack_linears(model)
        # Masks span the live entries (rounded up), not the capacity, and attention reads only those keys (engine/
        # attention_window.py); a model whose attention does not dispatch through transformers' registry keeps
        # masks over the whole capacity.
        self.windowed = wrap_attention(model)
        graph = functools.partial(self._compile, compile)
        # one row, one or two new tokens (STATIC_TOKENS): products as inductor's C++ kernel, untimed
        self.one_graph = graph("_one", generated_products=True)
        # one row, three or four new tokens (SMALL_TOKENS): products timed for a few rows
        self.small_graph = graph("_few")
        # two rows, two new tokens each (PAIR_ROWS): C++ kernels, untimed
        self.pair_graph = graph("_pair", generated_products=True)
        # everything else: one row's several tokens, batches
        self.graph = graph("")
        self.strict = False  # while warming up: a compile error propagates instead of falling back
        self.failure: str | None = None
        self._ramp: torch.Tensor | None = None  # the causal mask's row template (_causal)

    def _compile(self, compile: bool, tag: str, generated_products: bool = False) -> ScopedGraph | None:
        """The compiled graph function for one kind of call (`tag`), or None when running eager."""
        if not compile:
            return None
        return compile_function(_graph_function(self.model, tag), self.frozen, generated_products)

    def _graph_for(self, B: int, S: int) -> Callable:
        """The graph a forward of B rows of S new tokens runs (every graph is set, or none is)."""
        if B == 1:
            return self.one_graph if S <= STATIC_TOKENS else self.small_graph if S <= SMALL_TOKENS else self.graph
        return self.pair_graph if (B, S) == (PAIR_ROWS, STATIC_TOKENS) else self.graph

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
            pair = B == PAIR_ROWS and S == STATIC_TOKENS
            if S == STATIC_TOKENS and B == 1 or pair:
                _mark_tokens_static(kwargs, rows=pair)
            graph = self._graph_for(B, S)
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
                    self(torch.zeros(b, width, dtype=torch.long, device=device), cache, mask)
        finally:
            self.strict = False

    def _give_up(self, exc: Exception) -> None:
        self.graph = self.one_graph = self.small_graph = self.pair_graph = None
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
