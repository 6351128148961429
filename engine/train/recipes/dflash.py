"""DFlash draft training, the paper's recipe on a frozen target: blocks anchored at random positions of each window,
the anchor's token then masks as the block's input, the context the target's features before the anchor; the loss
is cross-entropy against the target's distribution at each block position (over the draft vocabulary), weighted
towards the block's first positions, whose misses end the accepted run."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from engine.decoding.tree import additive_mask
from engine.heads.dflash import DFlashHead, load_dflash_head
from engine.runtime.layer_features import layer_inputs
from engine.train.loop.draft_vocab import kept_vocab, trained_vocab
from engine.train.loop.heads import head_config, prepare, spread_windows, train_head, write_report
from engine.train.loop.precision import training_autocast

POSITION_DECAY = 7.0  # the paper's weight exp(-(k - 1) / 7) on block position k: early misses end the run


@torch.no_grad()
def target_view(target, head: DFlashHead, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's context features [B, T, kH] (outputs of its target layers) and the target's logits [B, T, V]."""
    with layer_inputs(target, head.feature_layers) as feats:
        logits = target(input_ids=batch, use_cache=False).logits
    return torch.cat(feats, dim=-1), logits


def anchors_for(length: int, block: int, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`count` sorted anchor positions in [1, length - block]: each block's first token, the pending one."""
    top = length - block
    if top < 1:
        raise ValueError(f"a window of {length} tokens holds no block of {block}")
    count = min(count, top)
    return (torch.randperm(top, generator=generator)[:count] + 1).sort().values


def block_outputs(head: DFlashHead, batch: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Every block at once: outputs [B, n * bs, H] for blocks anchored at `anchors` [n] of each window; block j's
    queries see the context before its anchor and its own block, as drafting does."""
    b, t = batch.shape
    bs, n = head.block_size, len(anchors)
    offsets = torch.arange(bs, device=batch.device)
    where = (anchors.to(batch.device)[:, None] + offsets[None]).reshape(-1)  # [n * bs] text positions
    ids = torch.full((b, n * bs), head.mask_token_id, dtype=torch.long, device=batch.device)
    ids[:, ::bs] = batch[:, anchors]
    positions = where[None].expand(b, -1)
    ctx = head.context(feats, torch.arange(t, device=batch.device)[None].expand(b, -1))
    owner = torch.arange(n, device=batch.device).repeat_interleave(bs)  # [n * bs] block of each query
    sees_ctx = torch.arange(t, device=batch.device)[None, :] < anchors.to(batch.device)[owner][:, None]
    sees_block = owner[:, None] == owner[None, :]
    mask = additive_mask(torch.cat([sees_ctx, sees_block], dim=1), feats.dtype, feats.device)  # [1, 1, nbs, t + nbs]
    return head.block(ids, positions, ctx, mask)


def position_weights(block: int) -> torch.Tensor:
    """[bs - 1]: the loss weight of drafted positions 1..bs-1."""
    return torch.tensor([math.exp(-k / POSITION_DECAY) for k in range(block - 1)])


def dflash_loss(head, batch, feats, logits, draft_ids, anchors) -> tuple[torch.Tensor, list[float]]:
    """Weighted soft cross-entropy of every drafted position against the target's distribution there, and the mean
    cross-entropy of the first, middle and last drafted positions (for the progress bar)."""
    bs, n = head.block_size, len(anchors)
    out = block_outputs(head, batch, feats, anchors).view(batch.shape[0], n, bs, -1)[:, :, 1:]  # [B, n, bs - 1, H]
    got = torch.log_softmax(head.logits(out).float(), -1)  # [B, n, bs - 1, Vd]
    # drafted position k of block j predicts the token at anchor + k, which the target predicts at anchor + k - 1
    at = anchors.to(batch.device)[:, None] + torch.arange(bs - 1, device=batch.device)[None]  # [n, bs - 1]
    want = logits[:, at]  # [B, n, bs - 1, V]
    want = torch.softmax((want if draft_ids is None else want[..., draft_ids]).float(), -1)
    ce = -(want * got).sum(-1).mean(dim=(0, 1))  # [bs - 1]
    w = position_weights(bs).to(ce.device)
    return (ce * w).sum() / w.sum(), [ce[0].item(), ce[len(ce) // 2].item(), ce[-1].item()]


@torch.no_grad()
def block_acceptance(head, target, stream, seq_len: int = 256, windows: int = 16, blocks: int = 8) -> list[dict]:
    """Held-out, per drafted position k: top-1 agreement with the target's greedy token (`top1`) and the share of
    blocks whose first k drafts all agreed (`accepted`, what greedy verification would keep). Teacher-forced on the
    held-out text."""
    bs = head.block_size
    hits, runs, count = [0] * (bs - 1), [0] * (bs - 1), 0
    ids = head.draft_ids
    g = torch.Generator().manual_seed(0)
    for start in spread_windows(len(stream), seq_len, windows):
        batch = stream[start : start + seq_len].long()[None]
        feats, logits = target_view(target, head, batch)
        anchors = anchors_for(seq_len, bs, blocks, g)
        out = block_outputs(head, batch, feats.to(next(head.parameters()).dtype), anchors)
        best = head.logits(out.view(len(anchors), bs, -1)[:, 1:]).argmax(-1)  # [n, bs - 1]
        best = best if ids is None else ids.to(best.device)[best]
        at = anchors[:, None] + torch.arange(bs - 1)[None]
        ok = best == logits[0, at].argmax(-1)  # [n, bs - 1]
        run = ok.long().cumprod(-1)
        for k in range(bs - 1):
            hits[k] += int(ok[:, k].sum())
            runs[k] += int(run[:, k].sum())
        count += len(anchors)
    return [
        {"depth": k + 1, "top1": round(hits[k] / max(1, count), 4), "accepted": round(runs[k] / max(1, count), 4)}
        for k in range(bs - 1)
    ]


def expected_tau(acceptance: list[dict]) -> float:
    """Tokens a greedy step would emit on average: the target's own plus every drafted position whose run held."""
    return round(1 + sum(a["accepted"] for a in acceptance), 3)


def train_dflash(
    target_path: str,
    out: Path,
    steps: int = 500,
    data: str | None = None,
    layers: int = 2,
    feature_layers: int = 3,
    block_size: int = 16,
    blocks: int = 8,
    draft_vocab: int = 4096,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    start_from: str | None = None,
) -> dict:
    """Train (or resume) a DFlash draft for the target and save it in the published layout to `out`. `start_from`: a
    trained draft's folder to go on training (its shape, target layers and draft vocabulary kept)."""
    from engine.heads.dflash import spread_layers

    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    if start_from:
        head = load_dflash_head(start_from, target).float()
        draft_ids, vocab_report = kept_vocab(loaded, head.draft_ids, held, start_from)
    else:
        n = target.config.num_hidden_layers
        draft_ids, vocab_report = trained_vocab(loaded, train, held, draft_vocab)
        mask = mask_token(train, target.get_input_embeddings().weight.shape[0])
        ids = spread_layers(n, feature_layers)
        head = DFlashHead.for_target(target, layers, block_size, mask, ids).float()
    head.set_draft_vocab(draft_ids)
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)
    g = torch.Generator().manual_seed(seed)

    def step_loss(batch: torch.Tensor):
        head.set_draft_vocab(draft_ids)  # the read-out rows follow the (frozen) LM head's dtype under autocast
        feats, logits = target_view(target, head, batch)
        anchors = anchors_for(batch.shape[1], head.block_size, blocks, g)
        loss, shown = dflash_loss(head, batch, feats.float(), logits, draft_ids, anchors)
        return loss, {"ce_first": shown[0], "ce_mid": shown[1], "ce_last": shown[2]}

    t0 = time.time()
    shown = train_head(head, opt, step_loss, train, cfg, out / "train_state.pt", "dflash", 1.0,
                       lambda: block_acceptance(head, target, held))  # fmt: skip
    head.eval()
    head.save(out)
    with training_autocast():
        acceptance = block_acceptance(head, target, held)
    report = {
        "target": str(target_path),
        "started_from": str(start_from) if start_from else None,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "block_size": head.block_size,
        "blocks_per_window": blocks,
        "draft_layers": len(head.layers),
        "target_layer_ids": list(head.target_layer_ids),
        "mask_token_id": head.mask_token_id,
        **vocab_report,
        "final_cross_entropy": shown,
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_acceptance": acceptance,
        "heldout_expected_tau": expected_tau(acceptance),
    }
    return write_report(out, report, data, time.time() - t0)


def mask_token(stream: torch.Tensor, vocab: int) -> int:
    """The id a fresh draft feeds at masked positions: the one the training text holds least (an id the text never
    holds, where there is one), so a mask never looks like the anchor."""
    return int(torch.bincount(stream.long().clamp(0, vocab - 1), minlength=vocab)[:vocab].argmin())
