"""Medusa's read-out compiled: every head's residual blocks, the vocabulary projection and the top-k as one
`torch.compile` graph for one row (the single-row decoder's proposal) and one for a batch's rows.

Eager, the read-out of the bundled heads is four small products, a stack, the projection and a top-k: 0.71 ms alone,
1.0 ms inside a decoding step, against 0.48 compiled (the blocks fused, the projection inductor's own product). A
drafted step on this CPU costs 4.8 ms where a plain one costs 2.9, so the read-out was a fifth of what a draft adds.
One function per (k, log_probs, first) a caller asks for, with a graph for one row and one for any number of rows (the
batch sweep warms that one up before its timed cells). `first` reads head 0 alone: a draft one token deep, the draft
budget's commonest choice off the suite, needs nothing deeper, and the one-head graph skips three quarters of the
read-out.
"""

from __future__ import annotations

import types

import torch

from engine.errors import reason
from engine.heads.readout import candidates, readouts, top_candidates
from engine.runtime.forward import CompileReport, compile_function, compile_timed, compiles_frozen, warmed


def _readout_function(heads: torch.nn.Module, k: int, log_probs: bool, first: bool):
    """`top_candidates` of `heads` for fixed `k`, `log_probs` and `first`, under a code object of its own (one short
    dynamo cache per graph)."""

    def readout(x):
        return top_candidates(heads, x, k, log_probs, first)

    tag = f"{k}_{int(log_probs)}_{int(first)}"
    code = readout.__code__.replace(co_name=f"readout_{type(heads).__name__}_{id(heads):x}_{tag}")
    return types.FunctionType(code, readout.__globals__, code.co_name, None, readout.__closure__)


class CompiledReadout:
    """The compiled read-out of one set of heads; falls back to the eager one for good when a graph fails."""

    def __init__(self, heads: torch.nn.Module) -> None:
        self.heads = heads
        self.graphs: dict[tuple[int, bool, bool], object] | None = {}  # (k, log_probs, first) -> graph
        self.strict = False  # while warming up: a compile error propagates
        self.failure: str | None = None

    def takes(self, x: torch.Tensor) -> bool:
        """Whether a graph runs this call: compiled, and rows of hidden states [rows, H]."""
        return self.graphs is not None and x.dim() == 2

    def __call__(self, x: torch.Tensor, k: int, log_probs: bool = True, first: bool = False):
        """(values, indices) [K, rows, k] ([1, rows, k] with `first`), as `top_candidates` gives them."""
        key = (k, log_probs, first)
        try:
            graph = self.graphs.get(key)
            if graph is None:
                graph = self.graphs[key] = compile_function(
                    _readout_function(self.heads, k, log_probs, first), compiles_frozen(self.heads)
                )
            return graph(x)
        except Exception as exc:  # a compile error: this run and the next ones read out eager
            if self.strict:
                raise
            self.graphs = None
            self.failure = f"torch.compile failed ({reason(exc)}): reading the {type(self.heads).__name__} out eager"
            return top_candidates(self.heads, x, k, log_probs, first)

    def warm_up(self, k: int, rows: int = 1) -> None:
        """Compile the graphs a proposal of `k` candidates per head for `rows` rows uses (one row; more than one: every
        batch) now rather than in a timed run: every head's and, where the heads have one (Medusa's), head 0's alone."""
        p = next(self.heads.parameters())
        firsts = [False, True] if hasattr(self.heads, "first_logits") else [False]
        self.strict = True
        try:
            with torch.no_grad():
                x = torch.zeros(rows, p.shape[-1], dtype=p.dtype, device=p.device)
                for f in firsts:
                    self(x, k, log_probs=False, first=f)
        finally:
            self.strict = False


def compile_readout(heads: torch.nn.Module, k: int, name: str = "the heads") -> CompileReport:
    """Compile the read-out of `heads` for `k` candidates per head and warm it up for one row; every later
    `candidates(heads)` call over rows [rows, H] runs it. On any failure the heads read out eager and the report says
    why in one line."""
    compiled, report = compile_timed(name, lambda: warmed(CompiledReadout(heads), k), "reading them out eager")
    if compiled is not None:
        candidates(heads).__dict__["compiled"] = compiled
    return report


def compiled_readout_of(heads: torch.nn.Module) -> CompiledReadout | None:
    """The heads' compiled read-out while it is in use, else None."""
    compiled = candidates(heads).compiled
    return compiled if compiled is not None and compiled.graphs is not None else None


def uncompile_readout(heads: torch.nn.Module) -> None:
    """Read `heads` out eager again (tests, a new session)."""
    candidates(heads).__dict__["compiled"] = None


def forget_compiled_readouts() -> None:
    """Every head reads out eager again: a compiled read-out holds its heads, which would keep earlier sessions'
    heads in memory."""
    for readout in readouts():
        readout.__dict__["compiled"] = None
