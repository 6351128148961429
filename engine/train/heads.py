"""The training loop Medusa and EAGLE heads share: frozen target, corpus windows, AdamW with warm-up and cosine
decay, bf16 autocast where the CPU has it in hardware (engine.train.precision), a progress bar and resumable
checkpoints (tensors only, loaded with weights_only=True)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from engine.train.lm import TrainConfig, lr_at, sample_batch
from engine.train.precision import training_autocast


def frozen_target(target_path: str):
    """The target on the CPU with gradients off, and its tokenizer: bfloat16 where the CPU multiplies it in hardware,
    float32 elsewhere (the dtype rule of `engine.models.loading.resolve_dtype`, so training sees what decoding will)."""
    from engine.models.loading import load_model

    loaded = load_model(target_path, device="cpu", dtype="auto")
    for p in loaded.model.parameters():
        p.requires_grad_(False)
    return loaded


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


def prepare(target_path: str, out: Path, data: str | None, seed: int):
    """What every head recipe starts from: the output folder, the frozen target, its training and held-out token
    streams, and the seed set. Returns (loaded target, train ids, held-out ids)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    loaded = frozen_target(target_path)
    train, held = text_stream(loaded.tokenizer, data)
    torch.manual_seed(seed)
    return loaded, train, held


def head_config(steps: int, batch_size: int, seq_len: int, lr: float, seed: int) -> TrainConfig:
    return TrainConfig(
        total_tokens=steps * batch_size * seq_len,
        seq_len=seq_len,
        batch_size=batch_size,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=20,
        seed=seed,
    )


def train_head(
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    step_loss: Callable[[torch.Tensor], tuple[torch.Tensor, dict]],
    stream: torch.Tensor,
    cfg: TrainConfig,
    checkpoint: Path,
    desc: str,
    clip: float | None = None,
) -> dict:
    """Run (or resume) the loop; `step_loss(batch [B, T])` returns the loss and numbers for the progress bar.
    Returns the last step's numbers."""
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    bar = tqdm(total=cfg.steps, initial=start, desc=desc, unit="step", dynamic_ncols=True, mininterval=2.0)
    shown: dict = {}
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        batch = sample_batch(stream, step, cfg)[:, :-1]
        with training_autocast():
            loss, shown = step_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        bar.update(1)
        bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if isinstance(v, float)}, refresh=False)
        if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"module": module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, checkpoint)  # atomic: a crash leaves the previous checkpoint intact
    bar.close()
    return shown
