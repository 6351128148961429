"""MTP layer training for a target that ships none (DeepSeek-V3's recipe on a frozen target): the layer at position i
reads (token x_{i+1}, the target's last hidden state h_i) and learns the target's distribution for the token after
x_{i+1}, teacher-forced over the draft vocabulary; drafting then chains it on its own outputs."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.heads.mtp import MtpHead, load_mtp_head
from engine.runtime.layer_features import decoder_layers
from engine.train.loop.draft_vocab import kept_vocab, trained_vocab
from engine.train.loop.heads import head_config, prepare, spread_windows, train_head, write_report
from engine.train.loop.precision import training_autocast


@torch.no_grad()
def target_view(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states [B, T, H] (what drafting feeds the layer) and its logits [B, T, V]."""
    out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


def layer_logits(head: MtpHead, batch: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """[B, T - 1, Vd]: row i reads (x_{i+1}, h_i), causally over the window, and drafts token i + 2."""
    b, t = batch.shape
    positions = torch.arange(t - 1, device=batch.device)[None].expand(b, -1)
    out = head(batch[:, 1:], hidden[:, :-1].to(next(head.parameters()).dtype), positions)
    return head.logits(out)


def mtp_loss(head: MtpHead, batch, hidden, logits, draft_ids) -> tuple[torch.Tensor, float]:
    """Soft cross-entropy against the target's distribution at i + 1 (its prediction of token i + 2)."""
    want = logits[:, 1:]
    want = torch.softmax((want if draft_ids is None else want[..., draft_ids]).float(), -1)  # [B, T - 1, Vd]
    ce = -(want * torch.log_softmax(layer_logits(head, batch, hidden).float(), -1)).sum(-1).mean()
    return ce, ce.item()


@torch.no_grad()
def layer_accuracy(head: MtpHead, target, stream, seq_len: int = 256, windows: int = 16) -> list[dict]:
    """Held-out top-1 agreement of the layer's first draft with the target's greedy token (teacher-forced)."""
    hits = count = 0
    for start in spread_windows(len(stream), seq_len, windows):
        batch = stream[start : start + seq_len].long()[None]
        hidden, logits = target_view(target, batch)
        got = head.to_target(layer_logits(head, batch, hidden).argmax(-1))  # [1, T - 1]
        ok = got[0, :-1] == logits[0, 1:-1].argmax(-1)
        hits += int(ok.sum())
        count += len(ok)
    return [{"depth": 1, "top1": round(hits / max(1, count), 4)}]


def train_mtp(
    target_path: str,
    out: Path,
    steps: int = 500,
    data: str | None = None,
    draft_vocab: int = 4096,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    start_from: str | None = None,
) -> dict:
    """Train (or resume) one MTP layer for the target and save it to `out` (GlanceMtpLayers). `start_from`: a trained
    folder to go on training (its draft vocabulary kept)."""
    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    if start_from:
        head = load_mtp_head(start_from, target).float()
        draft_ids, vocab_report = kept_vocab(loaded, head.draft_ids, held, start_from)
    else:
        head = MtpHead(target).float()
        with torch.no_grad():  # start from the target's last layer: a layer that already reads its hidden states
            last = decoder_layers(target)[-1].state_dict()
            head.layers[0].mtp_block.load_state_dict({k: v.float() for k, v in last.items()}, strict=False)
        draft_ids, vocab_report = trained_vocab(loaded, train, held, draft_vocab)
    head.set_draft_vocab(draft_ids)
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)

    def step_loss(batch: torch.Tensor):
        hidden, logits = target_view(target, batch)
        loss, ce = mtp_loss(head, batch, hidden.float(), logits, draft_ids)
        return loss, {"ce": ce}

    t0 = time.time()
    shown = train_head(head, opt, step_loss, train, cfg, out / "train_state.pt", "mtp", 1.0,
                       lambda: layer_accuracy(head, target, held))  # fmt: skip
    head.eval()
    head.save(out)
    with training_autocast():
        accuracy = layer_accuracy(head, target, held)
    report = {
        "target": str(target_path),
        "started_from": str(start_from) if start_from else None,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "layer_class": type(head.layers[0].mtp_block).__name__,
        **vocab_report,
        "final_cross_entropy": shown.get("ce"),
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_accuracy": accuracy,
    }
    return write_report(out, report, data, time.time() - t0)
