"""The training loop Medusa and EAGLE heads share: frozen target, corpus windows, AdamW with warm-up and cosine
decay, bf16 autocast where the CPU has it in hardware (engine.train.loop.precision), a progress bar and resumable
checkpoints (tensors only, loaded with weights_only=True)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from engine.train.loop.lm import TrainConfig, lr_at, sample_batch
from engine.train.loop.precision import training_autocast


def frozen_target(target_path: str):
    """The target on the CPU with gradients off, and its tokenizer: bfloat16 where the CPU multiplies it in hardware,
    float32 elsewhere (the dtype rule of `engine.models.loading.resolve_dtype`, so training sees what decoding will)."""
    from engine.models.loading import load_model

    loaded = load_model(target_path, device="cpu", dtype="auto")
    for p in loaded.model.parameters():
        p.requires_grad_(False)
    return loaded


def text_stream(tokenizer, data: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token streams: the stdlib split when data is None; a `train corpus` folder's own split; else
    a file or folder of text files split 98/2 by file order."""
    from engine.train.data.corpus import stdlib_corpus
    from engine.train.recipes.demo import encode_files

    if data is None:
        corpus = stdlib_corpus()
        return encode_files(tokenizer, corpus.train), encode_files(tokenizer, corpus.heldout)
    path = Path(data)
    if not path.exists():
        from engine.errors import GlanceError

        raise GlanceError(f"training data not found: {path}")
    if (path / "corpus.json").exists():
        return corpus_stream(tokenizer, path)
    files = (
        sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".py", ".txt", ".md"))
        if path.is_dir()
        else [path]
    )
    cut = max(1, len(files) * 98 // 100) if len(files) > 1 else 1
    train = encode_files(tokenizer, files[:cut])
    held = encode_files(tokenizer, files[cut:]) if len(files) > 1 else train[-20_000:]
    return train, held


def corpus_stream(tokenizer, folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A `train corpus` folder (engine/train/data/sharegpt_corpus.py): the target's own answers repeated until they are
    about half the training stream, since they are what drafting will see, and the teacher-forced conversations for
    breadth; held out: the target's answers to held-out prompts. Encoded once, then cached beside the text."""
    from engine.train.recipes.demo import encode_files

    answers_files = sorted((folder / "train").glob("answers-*.txt"))
    files = [*answers_files, folder / "train" / "teacher.txt", folder / "heldout" / "answers.txt"]
    key = f"{tokenizer.name_or_path}|{len(tokenizer)}|" + "|".join(f"{f.name}:{f.stat().st_size}" for f in files)
    cache = folder / "tokens.pt"
    saved = torch.load(cache, weights_only=True) if cache.exists() else {}
    if saved.get("key") != key:
        saved = {
            "key": key,
            "answers": encode_files(tokenizer, answers_files),
            "teacher": encode_files(tokenizer, [folder / "train" / "teacher.txt"]),
            "held": encode_files(tokenizer, [folder / "heldout" / "answers.txt"]),
        }
        tmp = cache.with_suffix(".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, cache)
    answers, teacher = saved["answers"], saved["teacher"]
    repeat = max(1, round(len(teacher) / max(1, len(answers))))
    return torch.cat([answers.repeat(repeat), teacher]), saved["held"]


def prepare(target_path: str, out: Path, data: str | None, seed: int):
    """What every head recipe starts from: the output folder, the frozen target, its training and held-out token
    streams, and the seed set. Returns (loaded target, train ids, held-out ids)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    loaded = frozen_target(target_path)
    train, held = text_stream(loaded.tokenizer, data)
    torch.manual_seed(seed)
    return loaded, train, held


def spread_windows(length: int, seq_len: int, windows: int) -> list[int]:
    """Starts of up to `windows` windows of `seq_len` tokens spread evenly over a held-out stream of `length`."""
    n = min(windows, length // seq_len)
    return [i * ((length - seq_len) // max(1, n - 1)) for i in range(n)] if n > 1 else [0] * n


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
    evaluate: Callable[[], list[dict]] | None = None,
    eval_every: int = 250,
) -> dict:
    """Run (or resume) the loop; `step_loss(batch [B, T])` returns the loss and numbers for the progress bar.
    `evaluate()` (held-out top-1 per depth) runs before a fresh run's first step, every `eval_every` steps and at
    the end; each result is a line of curve.jsonl beside the checkpoint, the training curve a model card plots.
    Returns the last step's numbers."""
    start = 0
    if not checkpoint.exists():
        (checkpoint.parent / "curve.jsonl").unlink(missing_ok=True)  # a fresh run starts a fresh curve
        if evaluate is not None:  # where it starts: chance for a new head, the old accuracy for one trained on
            log_curve(checkpoint.parent / "curve.jsonl", 0, cfg, module, evaluate)
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
        if evaluate is not None and ((step + 1) % eval_every == 0 or step + 1 == cfg.steps):
            log_curve(checkpoint.parent / "curve.jsonl", step + 1, cfg, module, evaluate)
    bar.close()
    return shown


def log_curve(path: Path, step: int, cfg: TrainConfig, module: torch.nn.Module, evaluate) -> None:
    """Append one point of the training curve: steps, tokens seen, held-out top-1 per depth."""
    import json

    module.eval()
    with training_autocast():
        accuracy = evaluate()
    module.train()
    point = {"step": step, "tokens": step * cfg.tokens_per_step, "top1": [a["top1"] for a in accuracy]}
    with path.open("a") as f:
        f.write(json.dumps(point) + "\n")


def write_report(out: Path, report: dict, data: str | None, seconds: float) -> dict:
    """training.json: this run's report, with every run into this folder listed under "runs" (a run that resumed a
    checkpoint adds a line, so the total time is the sum) and the corpus a `train corpus` folder describes."""
    import json
    import time

    from engine.records.files import write_text_checked

    path = Path(out) / "training.json"
    try:
        runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
    except (OSError, ValueError, AttributeError):
        runs = []
    runs.append({"steps": report.get("steps"), "seconds": round(seconds, 1), "ended": time.strftime("%Y-%m-%d %H:%M")})
    corpus = Path(data) / "corpus.json" if data else None
    if corpus is not None and corpus.exists():
        report["corpus"] = json.loads(corpus.read_text())
    report["runs"] = runs
    report["wall_seconds_total"] = round(sum(r["seconds"] for r in runs), 1)
    write_text_checked(path, json.dumps(report, indent=2))
    return report
