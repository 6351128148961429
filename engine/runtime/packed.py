"""One oneDNN-packed copy of a model's linear weights, shared by every graph of the model and by its eager prefill
(CPU, bfloat16 or float16).

Why: freezing (engine/runtime/forward.py) made inductor pack the weights into each compiled graph, so a model compiled
for one
token and for several held two packed copies, and the eager prefill read a third. A drafted step between plain ones
read the other copy, evicted the one-token graph's from the cache, and the plain steps after it ran slow for 10-20
steps (measured on the bundled target: 5.7 ms right after a drafted step, 4.6 ms twenty steps later). Packed here once,
every graph and the prefill read the same tensors. Projections of one input (q/k/v, gate/up) become one product, as
inductor's concat_linear made them: each oneDNN call costs tens of microseconds on top of its arithmetic.
Since graphs time each product against inductor's own C++ kernel (engine.runtime.forward.inductor_options), a product
that
kernel wins holds its own re-blocked weights per graph; the packed copy still serves the prefill and the rest.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
from torch import nn

# oneDNN builds (JIT-compiles) a primitive for every row count a packed product sees, about 0.5 ms each, 10x the
# product itself: a drafter's first catch-up of 13 pairs cost its head 5.2 ms, the next one of 13 pairs 2.1. Decoding
# warms the row counts it uses (`warm_products`), and the caches must hold them: ideep's and oneDNN's default of
# 1024 primitives can be passed by a target, a draft model and two heads with every prompt length their prefills
# meet, and an evicted one is rebuilt (measured: after 1,200 shapes, ten seen ones cost 6.4 ms again, 0.6 with 4096).
# Read at the first primitive, so set here, before any; a user's own setting stays.
for _cache in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
    os.environ.setdefault(_cache, "4096")

PACKED_DTYPES = (torch.bfloat16, torch.float16)  # where inductor packs for oneDNN too (float32 goes to MKL)
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # projections of one input, called in this order
PACK_ROWS = 1  # oneDNN's hint of the rows a product has: decoding's step (any row count runs on the packed weight)
_plain = [False]  # inside `unpacked()`: eager calls run nn.Linear's own product


@contextlib.contextmanager
def unpacked() -> Iterator[None]:
    """Eager calls inside run every packed layer as the nn.Linear it replaced: the benchmark's transformers rows
    time stock transformers, not Glance's packing. (Compiled graphs keep what they were traced with.)"""
    _plain[0] = True
    try:
        yield
    finally:
        _plain[0] = False


def _as_loaded() -> bool:
    """Whether a packed layer computes as the nn.Linear it replaced: with gradients (the packed product has no
    backward) or inside `unpacked()`."""
    return _plain[0] or torch.is_grad_enabled()


def packable(model: nn.Module) -> bool:
    """Whether `model`'s weights can be packed here: on a CPU with oneDNN, in a half-precision dtype this CPU's
    oneDNN computes in (tried once on a tiny product: nothing in the model changes unless it works)."""
    param = next(model.parameters(), None)
    return (
        param is not None
        and param.device.type == "cpu"
        and param.dtype in PACKED_DTYPES
        and torch.backends.mkldnn.is_available()
        and _runs_in(param.dtype)
    )


@functools.cache
def _runs_in(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies `dtype` on this CPU (float16 needs instructions not every CPU has)."""
    try:
        with torch.no_grad():
            weight = torch.ones(8, 8, dtype=dtype)
            y = _product(torch.ones(2, 8, dtype=dtype), _pack(weight), None, 8)
        return bool((y == 8).all())
    except RuntimeError:
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> oneDNN's blocked layout of the same weight (an opaque tensor only `_linear_pointwise` reads)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out: int) -> torch.Tensor:
    """x [..., in] @ weight.T + bias -> [..., out], on the packed weight."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")  # [N, out]
    return y.view(*x.shape[:-1], out)


class _PackedLayer(nn.Module):
    """What a packed layer keeps of the nn.Linear it replaces: `weight` and `bias` stay (tied embeddings, EAGLE
    reading the target's LM head, parameter counts); with gradients on or inside `unpacked()`, it runs nn.Linear's
    own product, otherwise its packed one."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _as_loaded():
            return nn.functional.linear(x, self.weight, self.bias)
        return self.packed_forward(x)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def product(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """The packed product this layer runs: packed weight, bias, output width."""
        raise NotImplementedError


class PackedLinear(_PackedLayer):
    """nn.Linear's forward on a packed copy of its weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.register_buffer("packed", _pack(linear.weight), persistent=False)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.packed, self.bias, self.out_features)

    def product(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        return self.packed, self.bias, self.out_features


class _FusedProduct:
    """Several projections of one input as one product: the first member called computes every member's output,
    the others take their slice of it. `pending`: [input, output, members served], until the last one is."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.members = len(linears)
        biases = [lin.bias for lin in linears]
        bias = None
        if any(b is not None for b in biases):
            parts = [
                b.detach() if b is not None else lin.weight.new_zeros(lin.out_features)
                for b, lin in zip(biases, linears)
            ]
            bias = torch.cat(parts)
        self.bias = bias
        self.packed = _pack(torch.cat([lin.weight.detach() for lin in linears]))  # [sum of outs, in], packed
        self.width = sum(lin.out_features for lin in linears)
        self.pending: list | None = None

    def take(self, member: FusedLinear, x: torch.Tensor) -> torch.Tensor:
        if self.pending is None or self.pending[0] is not x:  # a new input (or a member called out of turn)
            self.pending = [x, _product(x, *member.product()), 0]
        out = self.pending[1][..., member.start : member.stop]
        self.pending[2] += 1
        if self.pending[2] == self.members:
            self.pending = None  # nothing held between forwards
        return out


class FusedLinear(_PackedLayer):
    """One member of a fused product (q_proj of q/k/v): its output is its slice of the product over every member's
    weights. Exact for any call order: a member whose input differs from the pending one computes afresh."""

    def __init__(self, linear: nn.Linear, group: _FusedProduct, start: int) -> None:
        super().__init__(linear)
        self.register_buffer("packed", group.packed, persistent=False)  # the same tensor in every member
        self.register_buffer("fused_bias", group.bias, persistent=False)  # None without biases
        self.start, self.stop = start, start + linear.out_features
        self.__dict__["group"] = group  # not a module: nothing of it in state dicts or module walks

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.take(self, x)

    def product(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        return self.packed, self.fused_bias, self.group.width


def warm_products(model: nn.Module, rows: int) -> int:
    """Run each packed product of `model` once at every row count from 1 to `rows`, so that oneDNN has built its
    primitives before a timed run needs them (a forward over 13 new tokens in a run that has not seen 13 yet cost
    the bundled EAGLE head 3 ms more than the next one); the number of products run. About 0.5 ms each. Layers of
    one shape share their primitives, so each shape runs once."""
    products: dict[tuple, tuple] = {}
    for module in model.modules():
        if isinstance(module, _PackedLayer):
            packed, bias, out = module.product()
            key = (module.in_features, out, bias is not None, module.weight.dtype)
            products.setdefault(key, (packed, bias, out))
    with torch.no_grad():
        for (width, _, _, dtype), product in products.items():
            for m in range(1, rows + 1):
                _product(torch.zeros(m, width, dtype=dtype), *product)
    return len(products) * rows


def pack_linears(model: nn.Module) -> int:
    """Replace `model`'s nn.Linear layers by packed ones (fusing q/k/v and gate/up where a module has them all);
    the number replaced. Nothing where `packable` says no; a model packed already stays as it is."""
    if not packable(model):
        return 0
    replaced = 0
    for module in list(model.modules()):
        for names in FUSED:
            linears = [getattr(module, name, None) for name in names]
            if not all(type(lin) is nn.Linear for lin in linears):
                continue
            if len({lin.in_features for lin in linears}) != 1:
                continue
            group, start = _FusedProduct(linears), 0
            for name, lin in zip(names, linears):
                setattr(module, name, FusedLinear(lin, group, start))
                start += lin.out_features
                replaced += 1
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child))
                replaced += 1
    return replaced
