"""Next-token training of a causal LM on a flat token stream, with a progress bar and resumable checkpoints.

Checkpoints hold only tensors and plain numbers, so they load with `weights_only=True`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine.train.loop.precision import training_autocast, training_precision


@dataclass
class TrainConfig:
    total_tokens: int
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    checkpoint_every: int = 100
    compile: bool = True

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def steps(self) -> int:
        return max(1, self.total_tokens // self.tokens_per_step)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to `min_lr`."""
    warm = min(cfg.warmup_steps, max(1, cfg.steps // 10))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def sample_batch(stream: torch.Tensor, step: int, cfg: TrainConfig) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens, seeded by (seed, step) so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch_size,), generator=g)
    return torch.stack([stream[s : s + cfg.seq_len + 1] for s in starts.tolist()]).long()  # [B, T+1]


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `batch` [B, T+1]."""
    logits = model(input_ids=batch[:, :-1], use_cache=False).logits  # [B, T, V]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, stream: torch.Tensor, seq_len: int = 512, windows: int = 32) -> float:
    """Mean cross-entropy over the first `windows` non-overlapping windows of the held-out stream (deterministic)."""
    model.eval()
    n = min(windows, (len(stream) - 1) // (seq_len + 1))
    total = 0.0
    for i in range(n):
        w = stream[i * (seq_len + 1) : (i + 1) * (seq_len + 1)].long()[None]  # [1, T+1]
        total += lm_loss(model, w).item()
    return total / max(1, n)


def _save_checkpoint(path: Path, model, opt, step: int, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds}, tmp)
    os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact


def train_lm(
    model: torch.nn.Module,
    stream: torch.Tensor,
    cfg: TrainConfig,
    checkpoint: Path,
    desc: str = "train",
) -> dict:
    """Train `model` in place (bf16 autocast where the CPU has bfloat16 instructions, `engine.train.loop.precision`),
    resuming from `checkpoint` when it exists. Returns statistics."""
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        fused=False,
    )
    start, earlier = 0, 0.0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        earlier = float(state.get("seconds", 0.0))  # training time of earlier runs, so resumes add up
    step_fn = torch.compile(model) if cfg.compile and cfg.steps - start > 50 else model
    model.train()
    bar = tqdm(
        total=cfg.steps * cfg.tokens_per_step,
        initial=start * cfg.tokens_per_step,
        unit="tok",
        unit_scale=True,
        desc=desc,
        dynamic_ncols=True,
        mininterval=2.0,
    )
    t0, ema, last = time.time(), None, float("nan")
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = sample_batch(stream, step, cfg)
        with training_autocast():
            loss = lm_loss(step_fn, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = loss.item()
        ema = last if ema is None else 0.95 * ema + 0.05 * last
        bar.update(cfg.tokens_per_step)
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr_at(step, cfg):.1e}", refresh=False)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            _save_checkpoint(checkpoint, model, opt, step + 1, earlier + time.time() - t0)
    bar.close()
    model.eval()
    return {
        "steps": cfg.steps,
        "tokens": cfg.steps * cfg.tokens_per_step,
        "final_train_loss_ema": ema if ema is not None else last,
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "train_seconds_total": round(earlier + time.time() - t0, 1),
        "precision": training_precision(),
    }
