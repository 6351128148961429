"""An EAGLE or Medusa head's draft vocabulary: the target ids it reads its candidates from (engine/heads/draft_vocab.py,
`draft_vocab.safetensors`). Counted from training text (the most frequent tokens plus the end-of-turn ones), or taken
from another head trained on the same text (an EAGLE-3 head's `d2t`, another head's draft vocabulary)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import GlanceError
from engine.heads.draft_vocab import DRAFT_VOCAB, check_draft_ids, read_draft_vocab
from engine.train.recipes.eagle3 import coverage, frequent_tokens


def vocab_of_head(folder: str | Path, vocab: int) -> torch.Tensor:
    """The draft vocabulary of a head folder: its draft_vocab.safetensors, or an EAGLE-3 head's d2t."""
    folder = Path(folder)
    ids = read_draft_vocab(folder, vocab)
    if ids is not None:
        return ids
    path = folder / "model.safetensors"
    if path.exists():
        with safe_open(str(path), "pt") as f:
            if "d2t" in f.keys():
                d2t = f.get_tensor("d2t").long()
                return check_draft_ids(torch.arange(len(d2t)) + d2t, vocab, f"{path}'s d2t")
    raise GlanceError(f"{folder} has neither {DRAFT_VOCAB} nor an EAGLE-3 d2t to take a draft vocabulary from")


def counted_vocab(loaded, stream: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent ids of the training `stream` plus the target's end-of-turn tokens, sorted: the draft
    vocabulary of a head trained on that text (`loaded`: the target and its tokenizer)."""
    from engine.models.chat import stop_ids

    target = loaded.model
    vocab = target.get_output_embeddings().weight.shape[0]
    return frequent_tokens(stream, vocab, size, stop_ids(target, loaded.tokenizer, True))


def trained_vocab(loaded, train: torch.Tensor, held: torch.Tensor, size: int) -> tuple[torch.Tensor | None, dict]:
    """What `train eagle` and `train medusa` give the heads they trained (`size` 0: none, the whole vocabulary), and
    the training report's lines on it: its size and the held-out text's share of tokens inside it."""
    if not size:
        return None, {"draft_vocab": None, "heldout_vocab_coverage": None}
    ids = counted_vocab(loaded, train, size)
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    return ids, {"draft_vocab": len(ids), "heldout_vocab_coverage": coverage(held, ids, vocab)}


def kept_vocab(loaded, ids: torch.Tensor | None, held: torch.Tensor, source: str) -> tuple[torch.Tensor | None, dict]:
    """A head trained on from `source` keeps its draft vocabulary `ids` (None: the whole vocabulary); the report's
    lines on it, as `trained_vocab` gives them."""
    if ids is None:
        return None, {"draft_vocab": None, "heldout_vocab_coverage": None}
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    ids = ids.cpu()
    return ids, {"draft_vocab": len(ids), "heldout_vocab_coverage": coverage(held, ids, vocab), "kept_from": source}


@contextmanager
def drafting_over(heads, ids: torch.Tensor | None, restore: torch.Tensor | None):
    """Heads set to draft over `ids` for the block (held-out accuracy is measured as they will draft), then back to
    `restore`, the vocabulary they train over."""
    heads.set_draft_vocab(ids)
    try:
        yield heads
    finally:
        heads.set_draft_vocab(restore)


def write_draft_vocab(
    target_path: str, head: str, size: int = 2048, data: str | None = None, like: str | None = None
) -> dict:
    """Give the EAGLE head or Medusa heads folder `head` a draft vocabulary: the `size` most frequent tokens of the
    training text `data` (None: the stdlib, as `train eagle`) with the end-of-turn tokens, or `like`'s (another head
    folder).
    Returns what it wrote: size, source and the held-out text's share of tokens inside it."""
    from engine.heads.eagle import load_eagle_head
    from engine.heads.medusa import load_medusa_heads
    from engine.train.loop.heads import frozen_target, text_stream

    if size < 1:
        raise GlanceError("--size must be positive")
    loaded = frozen_target(target_path)
    target = loaded.model
    vocab = target.get_output_embeddings().weight.shape[0]
    try:
        medusa = "medusa_num_heads" in json.loads((Path(head) / "config.json").read_text())
    except (OSError, json.JSONDecodeError, TypeError):
        medusa = False  # the loader says what is wrong with the folder
    load = load_medusa_heads if medusa else load_eagle_head
    head_model = load(head, target)  # checks the head fits the target before anything is written
    if like is not None:
        ids, source, held = vocab_of_head(like, vocab), f"the draft vocabulary of {like}", None
    else:
        train, held = text_stream(loaded.tokenizer, data)
        ids = counted_vocab(loaded, train, size)
        source = f"the {len(ids)} most frequent tokens of {data or 'the stdlib'}"
    head_model.set_draft_vocab(ids)
    head_model.save(head)  # the weights as they were (bfloat16) and the vocabulary
    report = {"draft_vocab": len(ids), "source": source}
    if held is not None:
        report["heldout_vocab_coverage"] = coverage(held, ids, vocab)
    info = Path(head) / "training.json"
    if info.exists():
        try:
            training = json.loads(info.read_text())
            training["draft_vocab"] = report
            info.write_text(json.dumps(training, indent=2))
        except (OSError, json.JSONDecodeError):
            pass  # the card stays as it was; the vocabulary is written
    return report
