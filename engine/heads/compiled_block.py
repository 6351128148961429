"""DFlash's block step compiled: the draft's forward over the block and its read-out (logits and argmax of every
drafted position) as one `torch.compile` graph per head, the context's length a symbolic size.

Eager, a block forward on a CPU is mostly launches and Python: a few layers over 16 rows, each a dozen small
products. Two graphs: one row (no mask: the block sees its whole context) and a batch (a mask hides each row's
padding). The context projection of newly committed positions stays eager: it is one product per layer.
"""

from __future__ import annotations

import types

import torch

from engine.errors import reason
from engine.runtime.forward import CompileReport, compile_function, compile_timed, compiles_frozen, warmed
from engine.runtime.packed import pack_linears


def run_block(head, ids, positions, ctx, mask):
    """(logits [B, S - 1, V or Vd], their argmax [B, S - 1]) of every drafted position of the block."""
    out = head.block(ids, positions, ctx, mask)
    logits = head.logits(out[:, 1:])
    return logits, logits.argmax(-1)


def _block_function(head, tag: str):
    """`run_block` bound to `head` under a code object of its own (one short dynamo cache per head and kind)."""

    def block(ids, positions, ctx, mask):
        return run_block(head, ids, positions, ctx, mask)

    code = block.__code__.replace(co_name=f"dflash_block_{id(head):x}{tag}")
    return types.FunctionType(code, block.__globals__, code.co_name, None, block.__closure__)


class CompiledBlock:
    """The compiled block step of one DFlash head; it falls back to eager for good when a graph fails."""

    def __init__(self, head) -> None:
        self.head = head
        frozen = compiles_frozen(head)
        if frozen:
            pack_linears(head)
        self.one_row = compile_function(_block_function(head, "_row"), frozen, generated_products=True)
        self.rows = compile_function(_block_function(head, "_rows"), frozen)
        self.strict = False  # while warming up: a compile error propagates
        self.failure: str | None = None

    def __call__(self, ids, positions, ctx, mask):
        if self.one_row is None or ctx[0][0].shape[2] < 2:  # a one-token context specialises: eager
            return run_block(self.head, ids, positions, ctx, mask)
        try:
            return (self.one_row if mask is None else self.rows)(ids, positions, ctx, mask)
        except Exception as exc:  # a compile error on a new shape: this run and the next ones go eager
            if self.strict:
                raise
            self.one_row = self.rows = None
            self.failure = f"torch.compile failed ({reason(exc)}): drafting with the DFlash draft eager"
            return run_block(self.head, ids, positions, ctx, mask)

    def warm_up(self) -> None:
        """Compile both graphs now, over contexts of two lengths (so the length is symbolic), not in a timed run."""
        from engine.decoding.tree import additive_mask

        head = self.head
        p = next(head.parameters())
        S = head.block_size
        self.strict = True
        try:
            with torch.no_grad():
                for rows, lengths in ((1, (5, 9)), (2, (6, 10))):
                    for n in lengths:
                        feats = torch.zeros(rows, n, head.fc.in_features, dtype=p.dtype, device=p.device)
                        ctx = head.context(feats, torch.arange(n, device=p.device)[None].expand(rows, -1))
                        ids = torch.full((rows, S), head.mask_token_id, dtype=torch.long, device=p.device)
                        # a fresh tensor, not a view: the graphs guard on a view's base (engine/runtime/forward.py)
                        positions = (torch.arange(S, device=p.device) + n).repeat(rows, 1)
                        mask = None
                        if rows > 1:
                            visible = torch.ones(rows, S, n + S, dtype=torch.bool)
                            mask = additive_mask(visible, p.dtype, p.device)
                        self(ids, positions, ctx, mask)
        finally:
            self.strict = False


def compile_block(head, progress) -> CompileReport:
    """The DFlash part's compile (its PartSpec's): the block step compiled and warmed up, or eager with a reason."""
    progress(0, 1, "compiling the DFlash draft's block step (once per session)")
    compiled, report = compile_timed("the DFlash draft", lambda: warmed(CompiledBlock(head)), "drafting with it eager")
    head.__dict__["compiled"] = compiled
    return report
