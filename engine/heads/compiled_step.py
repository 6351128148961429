"""EAGLE's drafting step compiled: the head's forward and its top-k read-out as one `torch.compile` graph per head.

A drafting depth on the bundled models is a one-layer forward of a few rows and a read-out over the vocabulary:
eager, transformers' layer and the separate read-out cost more in launches and Python than in arithmetic, and on a
CPU the graph's frozen weights are packed for oneDNN. The head keeps its own editable cache (a DynamicCache, or
EAGLE-3's), so the graph takes the cache's length as a symbolic size; the first call over an empty cache (the
prompt's pairs) runs eager, like the target's prefill. Graphs, per feature width the head is fed (EAGLE-3: the
fused target features, then its own outputs): one row with one new entry, one row with several, a batch (which
always feeds two or more). Cropped caches are made contiguous first: the graphs guard on strides.
"""

from __future__ import annotations

import types

import torch

from engine.errors import reason
from engine.heads.readout import draft_step, draft_steps, run_draft_step
from engine.runtime.cache import cache_length
from engine.runtime.forward import WARM_ROWS, CompileReport, compile_function, compile_timed, compiles_frozen, warmed
from engine.runtime.packed import pack_linears, warm_products

# Dynamo specializes a size of 0 or 1, so the graphs (warmed up over four cached entries) guard on a cache of at least
# two: a cache of one entry (a prompt of three tokens, such as "import unittest") compiled a new graph inside a timed
# run, 4 s for each head on the bf16 EPYC and 8-33 s in the suite's benchmark. Such a call runs eager instead.
MIN_CACHED = 2


def _step_function(head: torch.nn.Module, tag: str = ""):
    """`run_draft_step` bound to `head`, under a code object of its own (one short dynamo cache per head and kind of
    call)."""

    def step(tokens, features, positions, cache, mask, k):
        return run_draft_step(head, tokens, features, positions, cache, mask, k)

    code = step.__code__.replace(co_name=f"draft_step_{type(head).__name__}_{id(head):x}{tag}")
    return types.FunctionType(code, step.__globals__, code.co_name, None, step.__closure__)


class CompiledDraftStep:
    """The compiled drafting step of one head; falls back to the eager step for good when a graph fails."""

    def __init__(self, head: torch.nn.Module) -> None:
        self.head = head
        frozen = compiles_frozen(head)
        if frozen:  # one packed copy of its weights for all its graphs (engine/runtime/packed.py)
            pack_linears(head)
        # one row: inductor's C++ kernel for every product, untimed (engine.runtime.forward.SMALL_GRAPH_PRODUCTS)
        self.one_row = compile_function(_step_function(head, "_row"), frozen, generated_products=True)
        self.rows = compile_function(_step_function(head, "_rows"), frozen)  # a batch's rows: products timed
        self.strict = False  # while warming up: a compile error propagates
        self.failure: str | None = None

    def takes(self, cache) -> bool:
        """Whether the graph runs this call: compiled, and the cache already holds MIN_CACHED entries (else eager:
        the prefill, and a prompt too short for the graphs)."""
        return self.one_row is not None and cache_length(cache) >= MIN_CACHED

    def __call__(self, tokens, features, positions, cache, mask, k: int):
        _make_contiguous(cache)
        if mask is None:  # one row that sees everything: an explicit mask, so every call takes the same graph
            B, S = tokens.shape
            mask = torch.zeros(1, 1, S, cache_length(cache) + S, dtype=features.dtype, device=features.device)
        try:
            graph = self.one_row if tokens.shape[0] == 1 else self.rows
            return graph(tokens, features, positions, cache, mask, k)
        except Exception as exc:  # a compile error on a new shape: this run and the next ones go eager
            if self.strict:
                raise
            self.one_row = self.rows = None
            self.failure = f"torch.compile failed ({reason(exc)}): drafting with {type(self.head).__name__} eager"
            return run_draft_step(self.head, tokens, features, positions, cache, mask, k)

    def warm_up(self, rows: int = 1, k: int = 4) -> None:
        """Compile the graphs drafting uses now rather than in a timed run: one and several new entries after a
        cached run, per feature width the head reads, for `rows` rows (more than one: per-row masks as the batched
        draft passes them). A compile error propagates."""
        head = self.head
        p = next(head.parameters())
        if rows == 1:  # oneDNN's primitive per row count: catch-ups after plain steps and tree depths vary in size
            warm_products(head, WARM_ROWS)
        self.strict = True
        try:
            with torch.no_grad():
                for width in head.feature_widths():
                    cache = head.new_cache()
                    feed = (rows, 4)
                    run_draft_step(
                        head, *_inputs(feed, width, 0, p), cache, _causal(rows, 4, 0, p.dtype, p.device), k
                    )  # eager: the cache's first entries
                    for new in (1, 3) if rows == 1 else (3,):  # batches feed at least two (engine/drafters/eagle.py)
                        past = cache_length(cache)
                        mask = (
                            None
                            if rows == 1 and new == 1
                            else torch.zeros(rows, 1, new, past + new, dtype=p.dtype, device=p.device)
                        )
                        self(*_inputs((rows, new), width, past, p), cache, mask, k)
        finally:
            self.strict = False


def _make_contiguous(cache) -> None:
    """A cropped cache holds views with the strides of its longer past; the graph guards on strides, so every crop
    would compile a new one. Copying the few cached entries into place costs microseconds."""
    for layer in getattr(cache, "layers", None) or [cache]:
        for name in ("keys", "values", "k", "v"):
            tensor = getattr(layer, name, None)
            if tensor is not None and not tensor.is_contiguous():
                setattr(layer, name, tensor.contiguous())


def _inputs(shape: tuple[int, int], width: int, past: int, p: torch.Tensor):
    rows, new = shape
    tokens = torch.zeros(rows, new, dtype=torch.long, device=p.device)
    features = torch.zeros(rows, new, width, dtype=p.dtype, device=p.device)
    positions = torch.arange(past, past + new, device=p.device)[None].repeat(rows, 1)
    return tokens, features, positions


def _causal(rows: int, new: int, past: int, dtype, device) -> torch.Tensor:
    low = torch.finfo(dtype).min
    block = torch.full((new, new), low, dtype=dtype, device=device).triu(1)
    return torch.cat([torch.zeros(new, past, dtype=dtype, device=device), block], 1)[None, None].expand(
        rows, 1, new, past + new
    )


def compiles_drafting(part) -> bool:
    """Whether `part` is a head whose drafting step can be compiled (EAGLE's and EAGLE-3's)."""
    return isinstance(part, torch.nn.Module) and hasattr(part, "feature_widths")


def compile_head(head: torch.nn.Module, name: str = "the head") -> CompileReport:
    """Compile `head`'s drafting step and warm it up for one row; every later `draft_step(head)` call runs it.
    On any failure the head stays eager and the report says why in one line."""
    compiled, report = compile_timed(name, lambda: warmed(CompiledDraftStep(head), 1), "drafting with it eager")
    if compiled is not None:
        draft_step(head).__dict__["compiled"] = compiled
    return report


def compiled_step_of(head: torch.nn.Module) -> CompiledDraftStep | None:
    """The head's compiled drafting step while it is in use, else None."""
    compiled = draft_step(head).compiled
    return compiled if compiled is not None and compiled.one_row is not None else None


def forget_compiled_steps() -> None:
    """Every head drafts eager again: a compiled step holds its head, which would keep earlier sessions' heads
    in memory."""
    for step in draft_steps():
        step.__dict__["compiled"] = None


def uncompile_head(head: torch.nn.Module) -> None:
    """Draft with `head` eager again (tests, and a user who turns compiling off)."""
    draft_step(head).__dict__["compiled"] = None
