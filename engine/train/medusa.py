"""Medusa-1 training: the target stays frozen; head k learns the target's own greedy prediction k + 1 positions
after the next token (self-distillation on corpus text, computed on the fly), with a progress bar and resumable
checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine.heads.medusa import MedusaHeads
from engine.train.lm import TrainConfig, lr_at, sample_batch


def text_stream(tokenizer, data: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token streams: the stdlib split when data is None, else a file or folder of text files
    split 98/2 by file order."""
    from engine.train.corpus import stdlib_corpus
    from engine.train.demo import encode_files

    if data is None:
        corpus = stdlib_corpus()
        return encode_files(tokenizer, corpus.train), encode_files(tokenizer, corpus.heldout)
    path = Path(data)
    if not path.exists():
        from engine.errors import GlanceError

        raise GlanceError(f"training data not found: {path}")
    files = (
        sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".py", ".txt", ".md"))
        if path.is_dir()
        else [path]
    )
    cut = max(1, len(files) * 98 // 100) if len(files) > 1 else 1
    train = encode_files(tokenizer, files[:cut])
    held = encode_files(tokenizer, files[cut:]) if len(files) > 1 else train[-20_000:]
    return train, held


@torch.no_grad()
def target_features(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states [B, T, H] and the target's greedy next tokens [B, T] over `batch` [B, T]."""
    out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits.argmax(-1)


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Head k at position t is trained towards greedy[t + k + 1] (the target's prediction of token t + k + 2)."""
    logits = heads(hidden)  # [K, B, T, V]
    total, per_head = 0.0, []
    for k in range(heads.num_heads):
        shift = k + 1
        pred = logits[k, :, :-shift]  # [B, T - shift, V]
        label = greedy[:, shift:]
        loss = F.cross_entropy(pred.float().reshape(-1, pred.shape[-1]), label.reshape(-1))
        total = total + loss * (0.8**k)  # nearer heads matter more (Medusa weights later heads down)
        per_head.append(loss.item())
    return total, per_head


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, target, stream: torch.Tensor, seq_len: int = 256, windows: int = 16) -> list:
    """Held-out top-1 / top-5 accuracy of each head against the target's own greedy predictions."""
    hits1 = [0] * heads.num_heads
    hits5 = [0] * heads.num_heads
    count = [0] * heads.num_heads
    n = min(windows, len(stream) // seq_len)
    for i in range(n):
        batch = stream[i * seq_len : (i + 1) * seq_len].long()[None]
        hidden, greedy = target_features(target, batch)
        logits = heads(hidden)
        for k in range(heads.num_heads):
            shift = k + 1
            top5 = logits[k, 0, :-shift].topk(5, dim=-1).indices  # [T - shift, 5]
            label = greedy[0, shift:]
            hits1[k] += int((top5[:, 0] == label).sum())
            hits5[k] += int((top5 == label[:, None]).any(-1).sum())
            count[k] += len(label)
    return [
        {"head": k, "top1": round(hits1[k] / count[k], 4), "top5": round(hits5[k] / count[k], 4)}
        for k in range(heads.num_heads)
    ]


def train_medusa(
    target_path: str,
    out: Path,
    num_heads: int = 4,
    num_layers: int = 1,
    steps: int = 500,
    data: str | None = None,
    shared_lm_head: bool = True,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> dict:
    """Train (or resume) Medusa heads for the target and save them in the published layout to `out`."""
    from engine.models import load_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model(target_path, device="cpu", dtype="bfloat16")
    target = loaded.model
    for p in target.parameters():
        p.requires_grad_(False)
    train, held = text_stream(loaded.tokenizer, data)
    torch.manual_seed(seed)
    heads = MedusaHeads.for_target(target, num_heads, num_layers, shared_lm_head, base_model=str(target_path))
    heads.float()
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    cfg = TrainConfig(
        total_tokens=steps * batch_size * seq_len,
        seq_len=seq_len,
        batch_size=batch_size,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=20,
        seed=seed,
    )
    ckpt = out / "train_state.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    bar = tqdm(total=cfg.steps, initial=start, desc="medusa", unit="step", dynamic_ncols=True, mininterval=2.0)
    t0, per_head = time.time(), []
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        batch = sample_batch(train, step, cfg)[:, :-1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, greedy = target_features(target, batch)
            loss, per_head = medusa_loss(heads, hidden.float(), greedy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
    bar.close()
    heads.save(out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        accuracy = head_accuracy(heads, target, held)
    report = {
        "target": str(target_path),
        "heads": num_heads,
        "layers": num_layers,
        "shared_lm_head": shared_lm_head,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "final_loss_per_head": per_head,
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_accuracy": accuracy,
    }
    (out / "training.json").write_text(json.dumps(report, indent=2))
    return report
