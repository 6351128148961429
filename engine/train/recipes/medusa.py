"""Medusa-1 training: the target stays frozen; head k learns the target's own greedy prediction k + 1 positions
after the next token (self-distillation on corpus text, computed on the fly), with a progress bar and resumable
checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.heads.medusa import MedusaHeads, load_medusa_heads
from engine.train.loop.heads import head_config, prepare, train_head, write_report
from engine.train.loop.precision import training_autocast


@torch.no_grad()
def target_features(target, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states [B, T, H] and the target's greedy next tokens [B, T] over `batch` [B, T]."""
    out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits.argmax(-1)


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Head k at position t is trained towards greedy[t + k + 1] (the target's prediction of token t + k + 2). With
    a draft vocabulary set, over that vocabulary only (labels outside it are skipped: they cannot be drafted)."""
    logits = heads(hidden)  # [K, B, T, V] (V: the draft vocabulary's size where set)
    if heads.draft_ids is not None:
        to_draft = torch.full((heads.vocab,), -100, dtype=torch.long, device=greedy.device)
        to_draft[heads.draft_ids] = torch.arange(len(heads.draft_ids), device=greedy.device)
        greedy = to_draft[greedy]
    total, per_head = 0.0, []
    for k in range(heads.num_heads):
        shift = k + 1
        pred = logits[k, :, :-shift]  # [B, T - shift, V]
        label = greedy[:, shift:]
        loss = F.cross_entropy(pred.float().reshape(-1, pred.shape[-1]), label.reshape(-1), ignore_index=-100)
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
            top5 = heads.to_target(logits[k, 0, :-shift].topk(5, dim=-1).indices)  # [T - shift, 5] target ids
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
    draft_vocab: int = 4096,
    start_from: str | None = None,
) -> dict:
    """Train (or resume) Medusa heads for the target and save them in the published layout to `out`, with a draft
    vocabulary of the `draft_vocab` most frequent training tokens (0: none, the whole vocabulary): trained over the
    whole vocabulary, the heads then read their candidates from those rows only (engine/heads/draft_vocab.py).
    `start_from`: trained heads to go on training (their shape and draft vocabulary win over the arguments)."""
    from engine.train.loop.draft_vocab import drafting_over, kept_vocab, trained_vocab

    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    if start_from:
        heads = load_medusa_heads(start_from, target)
        ids, vocab_report = kept_vocab(loaded, heads.draft_ids, held, start_from)
    else:
        heads = MedusaHeads.for_target(target, num_heads, num_layers, shared_lm_head, base_model=str(target_path))
        ids, vocab_report = trained_vocab(loaded, train, held, draft_vocab)
    heads.float()
    # Heads sharing the frozen LM head train over the rows they will read (a twelfth of the vocabulary costs a twelfth
    # of the read-out); heads with their own projections train them over the whole vocabulary.
    train_ids = ids if heads.shared_lm_head is not None else None
    heads.set_draft_vocab(train_ids)
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)

    def step_loss(batch: torch.Tensor):
        hidden, greedy = target_features(target, batch)
        loss, per_head = medusa_loss(heads, hidden.float(), greedy)
        return loss, {"loss": loss.item(), "per_head": per_head}

    def evaluate() -> list[dict]:
        with drafting_over(heads, ids, train_ids):
            return head_accuracy(heads, target, held)

    t0 = time.time()
    shown = train_head(heads, opt, step_loss, train, cfg, out / "train_state.pt", "medusa", evaluate=evaluate)
    heads.set_draft_vocab(ids)
    heads.save(out)
    with training_autocast():
        accuracy = head_accuracy(heads, target, held)
    report = {
        "target": str(target_path),
        "started_from": str(start_from) if start_from else None,
        "heads": heads.num_heads,
        "layers": heads.num_layers,
        "shared_lm_head": heads.shared_lm_head is not None,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "final_loss_per_head": shown.get("per_head", []),
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_accuracy": accuracy,
        **vocab_report,
    }
    return write_report(out, report, data, time.time() - t0)
