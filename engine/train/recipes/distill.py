"""A vanilla draft distilled from its target: the target's own config cut to a few layers, initialised from evenly
spaced target layers, sharing the target's (frozen) embedding and LM head, trained to match the target's next-token
distribution (forward KL) on corpus text. Progress bar; resumable checkpoints.

The draft shares the target's tokenizer and vocabulary, so it drops into the vanilla drafter with no mapping. Because
the embedding is the target's, `save_layers` can store only what training changed (small enough to bundle), and
`assemble_draft` rebuilds an ordinary model folder from those layers plus the target. `start_from` goes on from
stored layers (layers in, layers out), or from a draft the user already has (its own embedding, every weight trained:
an ordinary model folder out).

`draft_vocab` gives a layer draft a draft vocabulary (draft_vocab.safetensors): its LM head reads those target ids
only, and the KL is taken against the target's distribution renormalised over them, the draft's best reachable q.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from engine.errors import GlanceError
from engine.heads.draft_vocab import narrow_lm_head, read_draft_vocab, save_draft_vocab
from engine.inputs import read_json_object
from engine.models.draft_layers import LAYERS_FILE, RECIPE_FILE, SHARED
from engine.models.loading import save_tokenizer
from engine.train.loop.heads import head_config, prepare, train_head, write_report
from engine.train.loop.precision import training_autocast


def kept_layers(total: int, keep: int) -> list[int]:
    """Evenly spaced target layer indices, first and last included: 30 layers, keep 4 -> [0, 10, 19, 29]."""
    if keep >= total:
        return list(range(total))
    if keep == 1:
        return [total - 1]
    return sorted({round(i * (total - 1) / (keep - 1)) for i in range(keep)})


def cut_target(target, idx: list[int]):
    """A fresh draft model: the target's architecture with its layers `idx` copied in, in float32."""
    from transformers import AutoModelForCausalLM

    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(idx)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in idx]
    draft = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    src = target.state_dict()
    own = draft.state_dict()
    for name in own:
        source = name
        if name.startswith("model.layers."):
            parts = name.split(".")
            parts[2] = str(idx[int(parts[2])])
            source = ".".join(parts)
        own[name].copy_(src[source].float())
    for name, p in draft.named_parameters():
        p.requires_grad_(name not in SHARED and "embed_tokens" not in name)
    return draft


def stored_layers(folder: Path, target):
    """A draft rebuilt from stored layers (a `train draft` output, or a bundled draft): the target cut at the
    recipe's layers, then the trained layers loaded. Returns the draft, its target layers and its draft vocabulary."""
    from safetensors.torch import load_file

    recipe = read_json_object(folder / RECIPE_FILE, "a draft's recipe")
    idx = [int(i) for i in recipe.get("target_layers", [])]
    if not idx or max(idx) >= target.config.num_hidden_layers:
        raise GlanceError(f"{folder / RECIPE_FILE} names target layers {idx}: not a draft cut from this target")
    draft = cut_target(target, idx)
    state = {k: v.float() for k, v in load_file(str(folder / LAYERS_FILE)).items()}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k not in SHARED and "embed_tokens" not in k]:
        raise GlanceError(f"{folder / LAYERS_FILE} does not fit the target cut at layers {idx}: made for another model")
    vocab = target.get_output_embeddings().weight.shape[0]
    return draft, idx, read_draft_vocab(folder, vocab)


def own_draft(path: str, target):
    """A draft model the user already has, in float32 with every weight trainable: it must share the target's
    vocabulary, since the loss compares the two distributions token by token."""
    from engine.models.loading import load_model

    draft = load_model(path, device="cpu", dtype="float32").model
    want, got = target.config.vocab_size, draft.config.vocab_size
    if want != got:
        raise GlanceError(f"the draft {path} has a vocabulary of {got} tokens, the target {want}: they must match")
    for p in draft.parameters():
        p.requires_grad_(True)
    return draft


def draft_picks(logits: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """The draft's greedy target ids from its logits (columns are `ids` where it has a draft vocabulary)."""
    best = logits.argmax(-1)
    return best if ids is None else ids[best]


def distill_loss(draft, batch: torch.Tensor, teacher: torch.Tensor, ids: torch.Tensor | None = None):
    """Forward KL(target || draft) per position, averaged (over the draft vocabulary `ids`, the target renormalised
    there); also returns top-1 agreement with the target's own argmax."""
    logits = draft(input_ids=batch, use_cache=False).logits.float()  # [B, T, V or len(ids)]
    logq = torch.log_softmax(logits, -1)
    p = torch.softmax((teacher if ids is None else teacher[..., ids]).float(), -1)
    kl = (p * (torch.log(p.clamp_min(1e-12)) - logq)).sum(-1).mean()
    agree = (draft_picks(logits, ids) == teacher.argmax(-1)).float().mean().item()
    return kl, agree


@torch.no_grad()
def heldout_agreement(draft, target, stream: torch.Tensor, seq_len: int = 256, windows: int = 8, ids=None) -> float:
    """Top-1 agreement of draft and target greedy tokens on held-out windows (what vanilla acceptance rides on)."""
    hits = count = 0
    n = min(windows, len(stream) // seq_len)
    for w in range(n):
        batch = stream[w * seq_len : (w + 1) * seq_len].long()[None]
        want = target(input_ids=batch, use_cache=False).logits.argmax(-1)
        got = draft_picks(draft(input_ids=batch, use_cache=False).logits, ids)
        hits += int((want == got).sum())
        count += want.numel()
    return round(hits / max(1, count), 4)


def save_layers(draft, out: Path, target_name: str, layers: list[int], ids: torch.Tensor | None) -> None:
    """What training changed (bf16 safetensors, no embedding), the recipe to rebuild the full model and the draft
    vocabulary."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items() if k not in SHARED}
    save_file(state, str(out / LAYERS_FILE))
    draft.config.to_json_file(str(out / "config.json"))
    recipe = {"target": target_name, "shared_from_target": list(SHARED), "target_layers": layers}
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2))
    save_draft_vocab(out, ids)


def train_draft(
    target_path: str,
    out: Path,
    layers: int = 4,
    steps: int = 500,
    data: str | None = None,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 5e-4,
    seed: int = 0,
    start_from: str | None = None,
    draft_vocab: int = 0,
) -> dict:
    """Distill (or resume) a `layers`-layer draft from the target, saving its layers and recipe; or go on training
    `start_from`: stored layers (saved as layers, their draft vocabulary kept) or a draft model folder (saved as an
    ordinary model folder). `draft_vocab` > 0: a layer draft new to one reads the most frequent training tokens."""
    from engine.train.loop.draft_vocab import kept_vocab, trained_vocab

    out = Path(out)
    loaded, train, held = prepare(target_path, out, data, seed)
    target = loaded.model
    if not hasattr(target.config, "num_hidden_layers") or not hasattr(target, "model"):
        raise GlanceError("draft distillation needs a decoder with model.layers (Llama, Qwen, Mistral, ...)")
    layered = start_from is None or (Path(start_from) / RECIPE_FILE).exists()
    if not layered and draft_vocab:
        raise GlanceError("a draft vocabulary is for drafts that share the target's LM head (cut from the target)")
    if start_from is None:
        idx = kept_layers(target.config.num_hidden_layers, layers)
        draft, had = cut_target(target, idx), None
    elif layered:
        draft, idx, had = stored_layers(Path(start_from), target)
    else:
        draft, idx, had = own_draft(start_from, target), [], None
    if had is not None:  # stored layers keep the vocabulary they were trained over
        ids, vocab_report = kept_vocab(loaded, had, held, start_from)
    else:
        ids, vocab_report = trained_vocab(loaded, train, held, draft_vocab)
    if ids is not None:
        narrow_lm_head(draft, ids)
    if start_from is not None:
        with training_autocast():
            before = heldout_agreement(draft, target, held, ids=ids)
    trainable = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    cfg = head_config(steps, batch_size, seq_len, lr, seed)

    def step_loss(batch: torch.Tensor):
        with torch.no_grad():
            teacher = target(input_ids=batch, use_cache=False).logits  # [B, T, V]
        loss, agree = distill_loss(draft, batch, teacher, ids)
        return loss, {"kl": loss.item(), "agree": agree}

    t0 = time.time()
    draft.train()

    def evaluate() -> list[dict]:
        return [{"depth": 1, "top1": heldout_agreement(draft, target, held, ids=ids)}]

    shown = train_head(draft, opt, step_loss, train, cfg, out / "train_state.pt", "draft", 1.0, evaluate)
    draft.eval()
    if layered:
        save_layers(draft, out, str(target_path), idx, ids)
    else:
        draft.to(torch.bfloat16).save_pretrained(str(out))
        save_tokenizer(loaded.tokenizer, out)
        draft.float()
    with training_autocast():
        agreement = heldout_agreement(draft, target, held, ids=ids)
    report = {
        "target": str(target_path),
        "layers": draft.config.num_hidden_layers,
        "target_layers": idx,
        "started_from": start_from,
        "steps": cfg.steps,
        "tokens": cfg.steps * batch_size * seq_len,
        "final_kl": shown.get("kl", float("nan")),
        "wall_seconds_this_run": round(time.time() - t0, 1),
        "heldout_top1_agreement": agreement,
        **vocab_report,
    }
    if start_from is not None:
        report["heldout_top1_agreement_before"] = before
    return write_report(out, report, data, time.time() - t0)
