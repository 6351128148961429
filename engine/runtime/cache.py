"""KV-cache operations the speculative loop needs, over transformers' `DynamicCache`.

`crop` rolls a chain back; `keep_positions` compacts a tree-verified cache down to the accepted path. Both act on
each layer's key/value tensors `[B, H, S, D]` along S. Caches whose layers cannot be edited this way (sliding
windows, linear attention, quantized caches) raise a GlanceError; Glance's own static cache
(engine/runtime/static_cache.py,
the compiled forward's) edits itself in place.
"""

from __future__ import annotations

import torch

from engine.errors import GlanceError


def sliding_window(config) -> int | None:
    """The model's attention window when some of its layers slide (Mistral, Gemma 2/3), else None."""
    if getattr(config, "use_sliding_window", True) is False:  # Qwen2 carries a window it does not use
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    window = getattr(config, "sliding_window", None)
    return int(window) if window else None


def new_cache(config):
    """An empty cache whose every layer Glance can crop and compact. Sliding-window layers are created as full ones:
    while the sequence stays within the window (`check_window`), a full cache attends exactly as a sliding one."""
    from transformers import DynamicCache

    return DynamicCache() if sliding_window(config) else DynamicCache(config=config)


def context_limit(config) -> int | None:
    """The most positions the model was built for (max_position_embeddings, GPT-2's n_positions), or None."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_window(config, positions: int, who: str = "the target") -> None:
    """Refuse a run that would reach past the model's context length or a sliding attention window (Glance's
    caches do not slide), before anything runs."""
    limit = context_limit(config)
    if limit is not None and positions > limit:
        raise GlanceError(
            f"{who} takes at most {limit} positions and this run needs {positions} (prompt + new tokens + "
            "drafting): shorten the prompt or ask for fewer new tokens"
        )
    window = sliding_window(config)
    if window is not None and positions > window:
        raise GlanceError(
            f"{who} attends through a sliding window of {window} tokens and this run needs {positions} positions "
            "(prompt + new tokens + drafting): Glance's editable caches cannot slide, so keep the run within the "
            "window (fewer new tokens or a shorter prompt)"
        )


def _kinds():
    from transformers.cache_utils import DynamicLayer, LinearAttentionAndFullAttentionLayer, LinearAttentionLayer

    return DynamicLayer, LinearAttentionLayer, LinearAttentionAndFullAttentionLayer


def is_recurrent(layer) -> bool:
    """A layer holding recurrent state (Mamba's or Gated DeltaNet's convolution and SSM states)."""
    return isinstance(layer, _kinds()[1])


def check_editable(cache, recurrent_ok: bool = False) -> None:
    """Refuse, before anything runs, a cache with a layer Glance cannot edit: sliding or quantized layers, and
    recurrent state (transformers' linear-attention layers) unless the caller restores it itself (`recurrent_ok`:
    the decoding loop's replay, engine/decoding/loop.py). A static cache edits itself."""
    if getattr(cache, "edits_in_place", False):
        return
    dynamic, linear, both = _kinds()
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise GlanceError(f"{type(cache).__name__} has no per-layer KV tensors; Glance needs a DynamicCache")
    for layer in layers:
        if isinstance(layer, linear) and not recurrent_ok:
            raise GlanceError(
                f"this model's cache layer {type(layer).__name__} keeps recurrent state (Mamba or Gated DeltaNet "
                "layers): Glance undoes it for the target, one row at a time, not for a draft model or a batch"
            )
        if type(layer) not in (dynamic, linear, both) and type(layer).__name__ != "DummyLayer":  # (holds nothing)
            raise GlanceError(
                f"this model's cache layer {type(layer).__name__} cannot be rolled back or compacted; "
                "speculative decoding in Glance needs full-attention KV caches (no sliding window)"
            )


def _editable_layers(cache) -> list:
    """The layers with keys and values (a hybrid model's attention layers); recurrent state is the loop's."""
    check_editable(cache, recurrent_ok=True)
    return [
        layer
        for layer in cache.layers
        if isinstance(layer, _kinds()[0]) and layer.is_initialized and layer.keys is not None and layer.keys.numel()
    ]


def recurrent_snapshot(cache) -> list:
    """Copies of every recurrent layer's convolution and SSM states (and whether each has seen a token), taken
    before a verification forward so that `restore_recurrent` can undo it."""
    snap = []
    for layer in getattr(cache, "layers", []):
        if is_recurrent(layer):
            conv = {i: t.clone() for i, t in layer.conv_states.items() if t is not None}
            ssm = {i: t.clone() for i, t in layer.recurrent_states.items() if t is not None}
            snap.append((layer, conv, ssm, dict(layer.has_previous_state)))
    return snap


def restore_recurrent(snap: list) -> None:
    """Put the recurrent states back as `recurrent_snapshot` found them (in place: their addresses stay)."""
    for layer, conv, ssm, seen in snap:
        for i, t in conv.items():
            layer.conv_states[i].copy_(t)
        for i, t in ssm.items():
            layer.recurrent_states[i].copy_(t)
        layer.has_previous_state.update(seen)


def cache_length(cache) -> int:
    """Number of cached positions (0 for an empty or missing cache)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Keep the first `length` positions of every layer (chain rollback)."""
    if getattr(cache, "edits_in_place", False):  # a static cache (engine/runtime/static_cache.py) edits itself
        cache.crop(length)
        return
    for layer in _editable_layers(cache):
        layer.keys = layer.keys[..., :length, :]  # [B, H, length, D]
        layer.values = layer.values[..., :length, :]


def keep_positions(cache, positions: torch.Tensor | list[int]) -> None:
    """Keep only the given cache positions, in the given (ascending) order (tree compaction)."""
    layers = _editable_layers(cache)
    if not layers:
        return
    index = torch.as_tensor(positions, dtype=torch.long, device=layers[0].keys.device)
    for layer in layers:
        layer.keys = layer.keys.index_select(-2, index)  # [B, H, len(positions), D]
        layer.values = layer.values.index_select(-2, index)


def compact_tail(cache, start: int, offsets: list[int]) -> None:
    """Keep positions [0, start) plus start + each offset (ascending). A contiguous run 0..k is a plain crop; otherwise
    the kept entries are copied into place (a few rows) and the rest cropped, instead of rebuilding the whole cache."""
    if getattr(cache, "edits_in_place", False):
        cache.compact_tail(start, offsets)
        return
    if offsets == list(range(len(offsets))):
        crop(cache, start + len(offsets))
        return
    layers = _editable_layers(cache)
    if not layers:
        return
    index = torch.as_tensor(offsets, dtype=torch.long, device=layers[0].keys.device) + start
    end = start + len(offsets)
    for layer in layers:
        layer.keys[..., start:end, :] = layer.keys.index_select(-2, index)  # [B, H, len(offsets), D]
        layer.values[..., start:end, :] = layer.values.index_select(-2, index)
        layer.keys = layer.keys[..., :end, :]
        layer.values = layer.values[..., :end, :]


def gather_rows(cache, index: torch.Tensor) -> None:
    """Batched compaction: row b keeps positions index[b] (ascending; pad entries point anywhere and stay masked).
    index: [B, L] long. A cache with its own `gather_rows` (EAGLE-3's head cache, a static cache) does it itself."""
    if hasattr(cache, "gather_rows"):
        cache.gather_rows(index)
        return
    layers = _editable_layers(cache)
    if not layers:
        return
    index = index.to(layers[0].keys.device)
    for layer in layers:
        b, h, _, d = layer.keys.shape
        idx = index[:, None, :, None].expand(b, h, index.shape[1], d)  # [B, H, L, D]
        layer.keys = layer.keys.gather(2, idx)
        layer.values = layer.values.gather(2, idx)


def keep_batch_rows(cache, rows: list[int]) -> None:
    """Keep only the batch rows `rows` (ascending) of every layer: a batch drops the rows that finished, so that its
    forwards stop computing them. A cache with its own `keep_batch_rows` (a static cache) does it itself."""
    if hasattr(cache, "keep_batch_rows"):
        cache.keep_batch_rows(rows)
        return
    layers = _editable_layers(cache)
    if not layers:
        return
    index = torch.tensor(rows, dtype=torch.long, device=layers[0].keys.device)
    for layer in layers:
        layer.keys = layer.keys.index_select(0, index)  # [len(rows), H, L, D]
        layer.values = layer.values.index_select(0, index)


def write_rows(cache, source, rows: list[int], source_rows: list[int]) -> None:
    """Write row source_rows[i] of `source` (every entry it holds, at the same columns) into batch row rows[i] of
    `cache`, adding rows where rows[i] is past the batch: a batch that decodes continuously prefills waiting prompts
    in a cache of their own and adds them to its rows. The cache grows to the source's length where that is longer;
    each row's entries past its own length are stale and masked, as after any compaction. Both caches are of one
    kind (the same forward's)."""
    if hasattr(cache, "write_rows"):
        cache.write_rows(source, rows, source_rows)
        return
    length = cache_length(source)
    _editable_layers(cache)  # checks the kind of every layer
    layers = [layer for layer in cache.layers if layer.is_initialized and layer.keys is not None]  # even 0 rows
    sources = _editable_layers(source)
    if not layers or not rows:
        return
    device = layers[0].keys.device
    r, s = torch.tensor(rows, device=device), torch.tensor(source_rows, device=device)
    for layer, src in zip(layers, sources):
        for name in ("keys", "values"):
            buf = getattr(layer, name)  # [B, H, L, D]
            more_rows, more_cols = max(rows) + 1 - buf.shape[0], length - buf.shape[2]
            if more_rows > 0:  # new rows at the batch's end
                buf = torch.cat([buf, buf.new_zeros(more_rows, *buf.shape[1:])], dim=0)
            if more_cols > 0:  # a longer prompt than any row's text: every row gets masked columns
                buf = torch.cat([buf, buf.new_zeros(buf.shape[0], buf.shape[1], more_cols, buf.shape[3])], dim=2)
            setattr(layer, name, buf)
            buf[r, :, :length] = getattr(src, name)[s, :, :length]


def move_row_entries(cache, rows: list[int], src: list[int], dst: list[int], length: int) -> None:
    """Batched compaction of the newest entries: entry src[i] of row rows[i] is copied to dst[i] (every source read
    before any destination is written), then the cache keeps `length` positions. Only the accepted paths move, where
    `gather_rows` rewrote every row's whole prefix: at batch 4 on the bundled target, 16 gathers of 2.4 ms a step."""
    if getattr(cache, "edits_in_place", False):
        cache.move_row_entries(rows, src, dst, length)
        return
    layers = _editable_layers(cache)
    if not layers:
        return
    if rows:
        device = layers[0].keys.device
        r, s, d = (torch.tensor(x, device=device) for x in (rows, src, dst))
        for layer in layers:
            for buf in (layer.keys, layer.values):  # [B, H, L, D]
                buf[r, :, d] = buf[r, :, s]  # [M, H, D]: the right side is read whole first
    crop(cache, length)


def pack_columns(cache, cols: list[list[int]]) -> list[list[int]]:
    """A batched cache whose row b holds its entries at columns cols[b] (increasing), packed so that they sit at
    0..len(cols[b]) - 1; returns the new columns. Nothing moves when they already do."""
    longest = max(map(len, cols))
    if all(not c or c[-1] == len(c) - 1 for c in cols):  # (increasing) in place: what lies past the longest goes
        if cache_length(cache) > longest:
            crop(cache, longest) if hasattr(cache, "layers") else cache.crop(longest)  # (EAGLE-3's own cache)
        return cols
    gather_rows(cache, torch.tensor([c + [0] * (longest - len(c)) for c in cols]))  # [B, longest]
    return [list(range(len(c))) for c in cols]


def committed_kv(cache, layer_ids: tuple[int, ...], row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of `layer_ids`, batch row `row`'s first `length` entries (keys, values) [1, H, length, D] as views:
    what a drafter that attends to the target's own cache reads (Gemma 4's assistant)."""
    if hasattr(cache, "settle"):  # a static cache applies its pending moves first
        cache.settle()
    out = []
    for i in layer_ids:
        layer = cache.layers[i]
        out.append((layer.keys[row : row + 1, :, :length], layer.values[row : row + 1, :, :length]))
    return out
