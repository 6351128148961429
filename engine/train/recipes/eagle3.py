"""EAGLE-3 head training with training-time test: frozen target; the head is unrolled on its own outputs for
`ttt_steps` steps, each step attending to the committed (teacher-forced) keys plus its own chain, exactly as drafting
does at inference. Loss: cross-entropy against the target's distribution restricted to the draft vocabulary,
weighted 0.8^step. The draft vocabulary is the most frequent target tokens of the training data. Progress bar;
resumable checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.decoding.tree import additive_mask
from engine.heads.eagle3 import Eagle3Head, load_eagle3_head
from engine.runtime.layer_features import layer_inputs
from engine.train.loop.heads import head_config, prepare, spread_windows, train_head, write_report
from engine.train.loop.precision import training_autocast

STEP_DECAY = 0.8


def frequent_tokens(stream: torch.Tensor, vocab: int, size: int, always: list[int] = ()) -> torch.Tensor:
    """The `size` most frequent ids of `stream` (plus `always`, such as end-of-turn tokens), sorted ascending."""
    counts = torch.bincount(stream.long(), minlength=vocab)[:vocab].float()
    for t in always:
        if 0 <= t < vocab:
            counts[t] = float("inf")
    size = min(size, vocab)
    return counts.topk(size).indices.sort().values


def coverage(stream: torch.Tensor, draft_ids: torch.Tensor, vocab: int) -> float:
    """Share of the tokens of `stream` that the draft vocabulary holds."""
    inside = torch.zeros(vocab, dtype=torch.bool)
    inside[draft_ids] = True
    return round(float(inside[stream.long().clamp(max=vocab - 1)].float().mean()), 4)


@torch.no_grad()
def target_view(target, layer_ids, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused-input features [B, T, 3H] (inputs of the three layers) and the target's logits [B, T, V]."""
    with layer_inputs(target, layer_ids) as feats:
        logits = target(input_ids=batch, use_cache=False).logits
    return torch.cat(feats, dim=-1), logits


def ttt_visibility(n: int, step: int) -> torch.Tensor:
    """[n, n * (step + 1)] bool: at unroll step s, query q sees step-0 keys j <= q - s and, in block t = 1..s, the
    key j = q - (s - t) of its own chain (what a depth-(s + 1) draft node sees at inference)."""
    q = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    blocks = [j <= q - step] + [j == q - (step - t) for t in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def unrolled(head: Eagle3Head, batch: torch.Tensor, feats: torch.Tensor, steps: int):
    """Yields (step, draft logits [B, N, Vd]) for s = 0..steps-1, N = T - 1; row q of step s predicts the target's
    token at position q + 1, drafted s steps past the committed position q - s (valid for q >= s)."""
    b, t = batch.shape
    n = t - 1
    tokens = batch[:, 1:]  # x_{q+1}
    hidden = head.fuse(feats[:, :-1])  # [B, N, H]: g_q, fused
    positions = torch.arange(n, device=batch.device)[None].expand(b, -1)
    cos, sin = head.rotary(hidden, positions)
    embeds = head.embed(tokens).to(hidden.dtype)
    keys, values = [], []
    for s in range(steps):
        q, k, v = head.midlayer.project(embeds, hidden, cos, sin)
        keys.append(k)
        values.append(v)
        mask = additive_mask(ttt_visibility(n, s), q.dtype, q.device)  # [1, 1, N, N (s + 1)]
        out = head.midlayer.finish(hidden, q, torch.cat(keys, 2), torch.cat(values, 2), mask)  # [B, N, H]
        yield s, head.logits(out)
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # row q reads o[q - 1]


def ttt_loss(head: Eagle3Head, batch, feats, logits, draft_ids, steps: int) -> tuple[torch.Tensor, list[float]]:
    """Weighted cross-entropy of every unroll step against the target's distribution over the draft vocabulary."""
    want = torch.softmax(logits[:, 1:, draft_ids].float(), -1)  # [B, N, Vd]: target at position q + 1
    total, per_step = 0.0, []
    for s, got in unrolled(head, batch, feats, steps):
        ce = -(want[:, s:] * torch.log_softmax(got[:, s:].float(), -1)).sum(-1).mean()
        total = total + ce * STEP_DECAY**s
        per_step.append(ce.item())
    return total, per_step


@torch.no_grad()
def depth_accuracy(head, target, stream, steps: int = 4, seq_len: int = 256, windows: int = 32) -> list[dict]:
    """Held-out top-1 agreement of the head's draft at each depth with the target's greedy token (a target token
    outside the draft vocabulary counts as a miss)."""
    hits, count = [0] * steps, [0] * steps
    ids = head.target_ids()
    for start in spread_windows(len(stream), seq_len, windows):
        batch = stream[start : start + seq_len].long()[None]
        feats, logits = target_view(target, head.layer_ids, batch)
        greedy = logits[0, 1:].argmax(-1)  # [N]
        for s, got in unrolled(head, batch, feats.to(next(head.parameters()).dtype), steps):
            ok = ids[got[0, s:].argmax(-1)] == greedy[s:]
            hits[s] += int(ok.sum())
            count[s] += len(ok)
    return [{"depth": s + 1, "top1": round(hits[s] / max(1, count[s]), 4)} for s in range(steps)]


def train_eagle3(
    target_path: str,
    out: Path,
    steps: int = 500,
    data: str | None = None,
    draft_vocab: int = 2048,
    ttt_steps: int = 4,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    start_from: str | None = None,
) -> dict:
    """Train (or resume) an EAGLE-3 head for the target and save it in the published layout to `out`. `start_from`:
    a trained head's folder to go on training (its weights, feature layers and draft vocabulary; `draft_vocab` is
    then ignored)."""
    from engine.models.chat import stop_ids

    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    vocab = target.get_output_embeddings().weight.shape[0]
    if start_from:
        head = load_eagle3_head(start_from, target).float()
        draft_ids = head.target_ids()
    else:
        draft_ids = frequent_tokens(train, vocab, draft_vocab, stop_ids(target, loaded.tokenizer, True))
        head = Eagle3Head.for_target(target, draft_ids).float()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)

    def step_loss(batch: torch.Tensor):
        feats, logits = target_view(target, head.layer_ids, batch)
        loss, per_step = ttt_loss(head, batch, feats.float(), logits, draft_ids, ttt_steps)
        return loss, {f"ce{s}": v for s, v in enumerate(per_step)}

    t0 = time.time()

    def evaluate() -> list[dict]:
        return depth_accuracy(head, target, held, steps=ttt_steps)

    shown = train_head(head, opt, step_loss, train, cfg, out / "train_state.pt", "eagle3", 1.0, evaluate)
    head.save(out)
    with training_autocast():
        accuracy = depth_accuracy(head, target, held, steps=ttt_steps)
    report = {
        "target": str(target_path),
        "started_from": str(start_from) if start_from else None,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "ttt_steps": ttt_steps,
        "draft_vocab": len(draft_ids),
        "feature_layers": list(head.layer_ids),
        "heldout_vocab_coverage": coverage(held, draft_ids, vocab),
        "final_cross_entropy_per_step": [shown.get(f"ce{s}") for s in range(ttt_steps)],
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_accuracy": accuracy,
    }
    return write_report(out, report, data, time.time() - t0)
