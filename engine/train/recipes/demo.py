"""Recipe for the bundled demo family: tokenizer, Llama target and Llama draft trained from scratch on the stdlib.

`python main.py train demo --out DIR` writes DIR/tokenizer, DIR/target, DIR/draft (Hugging Face folders, bfloat16
safetensors) and DIR/training.json (corpus, sizes, tokens, wall time, held-out losses). Work lives in DIR/work and
is resumed when the command is run again.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from engine.runtime.machine import cpu_name
from engine.train.data.corpus import read_text, stdlib_corpus
from engine.train.data.prompts import build_prompt_suite, write_prompt_suite
from engine.train.data.tokenizer import train_tokenizer
from engine.train.loop.lm import TrainConfig, heldout_loss, train_lm


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    mlp: int
    heads: int


TARGET = Size(layers=8, hidden=512, mlp=1408, heads=8)
DRAFT = Size(layers=2, hidden=256, mlp=704, heads=4)
VOCAB = 8192
SEQ_LEN = 512


def llama_config(size: Size, tokenizer, max_positions: int = 2048):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.mlp,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_files(tokenizer, files: list[Path]) -> torch.Tensor:
    """One flat stream: BOS file EOS BOS file EOS ... as int16-safe uint16 ids."""
    ids: list[int] = []
    texts = [read_text(f) for f in files]
    for enc in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int32)


def export_model(model, tokenizer, out: Path) -> None:
    """Save as a Hugging Face folder in bfloat16 with the tokenizer and a greedy generation config beside it."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    model.to(torch.float32)
    tokenizer.save_pretrained(str(out))
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    ).save_pretrained(str(out))


def run_demo_recipe(
    out: Path,
    total_tokens: int,
    seed: int = 0,
    draft_tokens: int | None = None,
    compile: bool = True,
    max_files: int | None = None,
) -> dict:
    """Run (or resume) the whole recipe and return the training report written to out/training.json."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    out = Path(out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = stdlib_corpus()
    if max_files:  # quick trials: a slice of the corpus, recorded as such
        corpus = replace(corpus, train=corpus.train[:max_files], heldout=corpus.heldout[: max(2, max_files // 50)])
    report: dict = {"corpus": corpus.describe(), "seed": seed, "machine": _machine()}
    write_prompt_suite(build_prompt_suite(corpus), out / "prompts.jsonl")

    tok_dir = out / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    else:
        print(f"training tokenizer on {len(corpus.train)} files ...", flush=True)
        tokenizer = train_tokenizer((read_text(f) for f in corpus.train), VOCAB, tok_dir)

    streams = {}
    for split, files in (("train", corpus.train), ("heldout", corpus.heldout)):
        cache = work / f"{split}_tokens.pt"
        if cache.exists():
            streams[split] = torch.load(cache, weights_only=True)
        else:
            streams[split] = encode_files(tokenizer, files)
            torch.save(streams[split], cache)
    report["corpus"]["tokens_train"] = int(len(streams["train"]))
    report["corpus"]["tokens_heldout"] = int(len(streams["heldout"]))
    print(f"corpus: {report['corpus']}", flush=True)

    for name, size, tokens in (
        ("target", TARGET, total_tokens),
        ("draft", DRAFT, draft_tokens or total_tokens),
    ):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config(size, tokenizer))
        cfg = TrainConfig(
            total_tokens=tokens, seq_len=min(SEQ_LEN, len(streams["train"]) // 4), seed=seed, compile=compile
        )
        stats = train_lm(model, streams["train"], cfg, work / f"{name}.ckpt", desc=name)
        export_model(model, tokenizer, out / name)
        reloaded = LlamaForCausalLM.from_pretrained(str(out / name), dtype=torch.float32)
        loss = heldout_loss(reloaded, streams["heldout"], seq_len=cfg.seq_len)
        report[name] = {
            "architecture": asdict(size) | {"vocab": len(tokenizer), "tied_embeddings": True},
            "parameters": sum(p.numel() for p in reloaded.parameters()),
            "train": asdict(cfg) | stats,
            "train_wall_seconds": stats["train_seconds_total"],
            "heldout_loss": round(loss, 4),
            "heldout_perplexity": round(float(torch.exp(torch.tensor(loss))), 2),
        }
        print(f"{name}: held-out loss {loss:.4f}", flush=True)

    report["total_wall_seconds"] = round(time.time() - started, 1)
    (out / "training.json").write_text(json.dumps(report, indent=2))
    return report


def _machine() -> dict:
    import os

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
