"""A distilled draft stored as its own layers only (it shares the target's embedding and LM head), and the
ordinary model folder rebuilt from those layers plus the target: what lets a bundled draft stay small. The rebuilt
folder records which layers it was built from, so new bundled layers (a retrained draft) rebuild it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from engine.errors import GlanceError, reason
from engine.heads.draft_vocab import DRAFT_VOCAB
from engine.inputs import read_json_object

SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # taken from the target, never trained or stored
LAYERS_FILE = "draft_layers.safetensors"
RECIPE_FILE = "draft.json"
BUILT_FROM = "built_from.json"  # in the rebuilt folder: the digest of the layers (and draft vocabulary) it holds


def layers_digest(layers_dir: Path) -> str:
    """sha256 over the stored layers, config and draft vocabulary: what a rebuilt folder must match to be current."""
    digest = hashlib.sha256()
    for name in (LAYERS_FILE, "config.json", DRAFT_VOCAB):
        path = layers_dir / name
        if path.exists():
            digest.update(name.encode())
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def assemble_draft(layers_dir: Path, target_dir: Path, out: Path) -> Path:
    """An ordinary model folder (config, bf16 safetensors, tokenizer) from stored draft layers and the target's
    embedding, and the draft vocabulary where the layers have one. Built again only when the layers changed; writes
    to a temporary folder and renames, so an interrupted run leaves nothing half-made."""
    from safetensors.torch import load_file, save_file

    if not (layers_dir / LAYERS_FILE).exists():
        raise GlanceError(f"{layers_dir} holds no {LAYERS_FILE}")
    digest = layers_digest(layers_dir)
    try:
        current = json.loads((out / BUILT_FROM).read_text()).get("digest") == digest
    except (OSError, ValueError, AttributeError):
        current = False
    if current and (out / "model.safetensors").exists():
        return out
    shards = sorted(target_dir.glob("*.safetensors"))
    if not shards:
        raise GlanceError(f"the target folder {target_dir} holds no safetensors weights to share with the draft")
    shared: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights = load_file(str(shard))
        shared.update({k: weights[k] for k in SHARED if k in weights})
    if "model.embed_tokens.weight" not in shared:
        raise GlanceError(f"no model.embed_tokens.weight in {target_dir}")
    try:
        state = load_file(str(layers_dir / LAYERS_FILE))
    except Exception as exc:  # safetensors' own error for a damaged or truncated header
        why = reason(exc, 160)
        raise GlanceError(f"{layers_dir / LAYERS_FILE} could not be read ({why}): a damaged file") from None
    config = read_json_object(layers_dir / "config.json", "a draft's config")
    wanted = SHARED[:1] if config.get("tie_word_embeddings", False) else SHARED
    for key in wanted:
        state[key] = shared.get(key, shared["model.embed_tokens.weight"]).to(torch.bfloat16).contiguous()
    tmp = out.with_name(out.name + ".partial")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config["torch_dtype"] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (target_dir / name).exists():
                shutil.copy(target_dir / name, tmp / name)
        if (layers_dir / DRAFT_VOCAB).exists():
            shutil.copy(layers_dir / DRAFT_VOCAB, tmp / DRAFT_VOCAB)
        (tmp / BUILT_FROM).write_text(json.dumps({"layers": str(layers_dir), "digest": digest}, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except Exception as exc:  # a read-only or full Glance home: OSError, or safetensors' own error
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(exc, "strerror", None) or reason(exc, 160)
        raise GlanceError(f"cannot write the draft model {out}: {why}") from None
    return out
