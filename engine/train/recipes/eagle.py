"""EAGLE head training: frozen target; loss = smooth-L1 on the predicted next feature + 0.1 x cross-entropy of the
target's LM head on it against the target's own distribution (EAGLE's recipe), with small uniform noise on the
input features. Features are computed on the fly from corpus text. Progress bar; resumable checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.heads.eagle import EagleHead, load_eagle_head
from engine.train.loop.heads import head_config, prepare, train_head, write_report
from engine.train.loop.precision import training_autocast

NOISE = 0.1  # half-width of the uniform noise added to input features
CLS_WEIGHT = 0.1


@torch.no_grad()
def target_view(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (last hidden states) [B, T, H] and the target's next-token logits [B, T, V]."""
    out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


def eagle_loss(
    head: EagleHead, batch: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor, noise: float = NOISE
) -> tuple[torch.Tensor, float, float]:
    """Pair i = (x_{i+1}, f_i) predicts f_{i+1}; returns (loss, regression part, classification part)."""
    b, t = batch.shape
    inp = feats[:, :-1]
    if noise:
        inp = inp + (torch.rand_like(inp) * 2 - 1) * noise
    positions = torch.arange(t - 1, device=batch.device)[None].expand(b, -1)
    pred = head(batch[:, 1:], inp, positions)  # [B, T-1, H]
    reg = F.smooth_l1_loss(pred.float(), feats[:, 1:].float())
    p = torch.softmax(logits[:, 1:].float(), -1)
    logq = torch.log_softmax(head.logits(pred).float(), -1)
    cls = -(p * logq).sum(-1).mean()
    return reg + CLS_WEIGHT * cls, reg.item(), cls.item()


@torch.no_grad()
def depth_accuracy(
    head: EagleHead, target, stream: torch.Tensor, depths: int = 4, seq_len: int = 256, windows: int = 8
) -> list[dict]:
    """Held-out top-1 agreement with the target's greedy token when the head runs on its own predicted features for
    d steps (d = 1 is teacher-forced), computed in parallel passes over each window."""
    hits = [0] * depths
    count = [0] * depths
    n = min(windows, len(stream) // seq_len)
    for w in range(n):
        batch = stream[w * seq_len : (w + 1) * seq_len].long()[None]
        feats, logits = target_view(target, batch)
        greedy = logits.argmax(-1)  # [1, T]
        positions = torch.arange(seq_len - 1)[None]
        inp = feats[:, :-1]
        for d in range(depths):
            pred = head(batch[:, 1:], inp.to(feats.dtype), positions)  # [1, T-1, H]
            guess = head.to_target(head.logits(pred).argmax(-1))  # predicts x_{i+2} (a draft vocabulary's too)
            ok = guess[0, d:] == greedy[0, 1 + d :]
            hits[d] += int(ok.sum())
            count[d] += len(ok)
            inp = torch.cat([feats[:, :1], pred[:, :-1]], dim=1)  # next pass reads its own predictions
    return [{"depth": d + 1, "top1": round(hits[d] / count[d], 4)} for d in range(depths)]


def train_eagle(
    target_path: str,
    out: Path,
    steps: int = 500,
    data: str | None = None,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    draft_vocab: int = 2048,
    start_from: str | None = None,
) -> dict:
    """Train (or resume) an EAGLE head for the target and save it in the published layout to `out`, with a draft
    vocabulary of the `draft_vocab` most frequent training tokens (0: none, the whole vocabulary). `start_from`: a
    trained head's folder to go on training (its weights and draft vocabulary; `draft_vocab` is then ignored)."""
    from engine.train.loop.draft_vocab import drafting_over, kept_vocab, trained_vocab

    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    if start_from:
        head = load_eagle_head(start_from, target).float()
        ids, vocab_report = kept_vocab(loaded, head.draft_ids, held, start_from)
    else:
        head = EagleHead.for_target(target).float()
        ids, vocab_report = trained_vocab(loaded, train, held, draft_vocab)
    head.set_draft_vocab(None)  # trained over the whole vocabulary; drafts over `ids`
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)

    def step_loss(batch: torch.Tensor):
        feats, logits = target_view(target, batch)
        loss, reg, cls = eagle_loss(head, batch, feats.float(), logits)
        return loss, {"reg": reg, "cls": cls}

    def evaluate() -> list[dict]:
        with drafting_over(head, ids, None):
            return depth_accuracy(head, target, held)

    t0 = time.time()
    shown = train_head(head, opt, step_loss, train, cfg, out / "train_state.pt", "eagle", 1.0, evaluate)
    head.set_draft_vocab(ids)
    head.save(out)
    with training_autocast():
        accuracy = depth_accuracy(head, target, held)
    report = {
        "target": str(target_path),
        "started_from": str(start_from) if start_from else None,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "final_regression_loss": shown.get("reg", float("nan")),
        "final_classification_loss": shown.get("cls", float("nan")),
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_accuracy": accuracy,
        **vocab_report,
    }
    return write_report(out, report, data, time.time() - t0)
