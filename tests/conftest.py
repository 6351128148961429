"""Shared fixtures: tiny randomly initialised models of several architectures, and tiny model folders on disk."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Compile without timing each matrix product (engine/runtime/forward.py: inductor_options): the suite compiles dozens
# of tiny
# graphs whose speed nobody reads, and on a 2-core AMD EPYC with a cold inductor cache the timing made the suite take
# 28 minutes. test_packed's tuning test turns it back on for itself.
os.environ.setdefault("GLANCE_TUNE_PRODUCTS", "0")
# Time each forward width in one round, not three (engine/runtime/forward_timing.py): the budgets' choices are tested,
# not
# the precision of the costs they read, and a real model's first budgeted run timed forwards for half a minute.
os.environ.setdefault("GLANCE_TIMING_ROUNDS", "1")

VOCAB = 96
torch.set_num_threads(1)  # tiny models: one thread is as fast and avoids oversubscription
# The suite runs in two pytest-xdist workers on two cores: one thread each, and for the processes they start too
# (two processes with two OpenMP threads each on two cores slow a forward 40-fold).
PARALLEL = "PYTEST_XDIST_WORKER" in os.environ
if PARALLEL:
    os.environ["OMP_NUM_THREADS"] = "1"


# The shape every tiny Llama-like test model shares (2 layers, grouped-query attention, 256 positions).
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny_config(arch: str, vocab: int = VOCAB):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        return LlamaConfig(**SMALL, **common)
    if arch == "qwen2":
        return Qwen2Config(**SMALL, use_sliding_window=False, **common)
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **common)
    raise ValueError(arch)


def tiny_model(arch: str, seed: int = 0, vocab: int = VOCAB, sharpen: float = 1.0) -> torch.nn.Module:
    """A random tiny causal LM in float32. `sharpen` scales the output layer so distributions are peaked."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab), attn_implementation="sdpa").eval()
    if sharpen != 1.0:
        model.config.tie_word_embeddings = False
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone() * sharpen)
    return model


def perturbed_copy(model: torch.nn.Module, scale: float, seed: int = 1) -> torch.nn.Module:
    """The target with Gaussian noise on every weight: a draft that agrees often but not always."""
    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=1e-3))
    return draft


ARCHS = ["llama", "gpt2", "qwen2"]


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory):
    """Local Hugging Face folders: a target, a copy of it (draft), and a draft with another vocabulary."""
    from transformers import LlamaForCausalLM

    from engine.train.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("models")
    texts = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int\n    y: int\n"] * 20
    tok = train_tokenizer(texts, 300, root / "tok")
    other = train_tokenizer(["hello world, the quick brown fox"] * 20, 280, root / "tok_other")
    folders = {}
    for name, tk, seed in (("target", tok, 0), ("copy", tok, 0), ("other_vocab", other, 3)):
        cfg = tiny_config("llama", len(tk))
        cfg.eos_token_id = tk.eos_token_id
        cfg.bos_token_id = tk.bos_token_id
        cfg.tie_word_embeddings = False
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # greedy never picks a zero logit over ~300 random ones: runs last until max tokens
            model.lm_head.weight[tk.eos_token_id] = 0.0
        folders[name] = root / name
        model.save_pretrained(folders[name])
        tk.save_pretrained(folders[name])
    return folders


@pytest.fixture(autouse=True)
def fresh_budget_memory():
    """Every test starts with no remembered budget runs: the budget remembers the last run of each target and
    drafter for the whole process, and a test must not read what another test's run left there."""
    from engine.budget import draft_budget as budget

    budget._MEMORY.clear()
    yield


# Modules that compile graphs or run the real model take minutes where the rest take seconds: two workers finish
# together only if these start first. A stable sort on top of pytest-randomly's shuffle keeps each module's tests
# together and in their shuffled order, and the other modules in theirs; pytest-xdist hands modules out in
# collection order (--no-loadscope-reorder in pyproject.toml).
HEAVY_MODULES = (
    "test_compiled.py",
    "test_app.py",
    "test_real_model.py",
    "test_bundled.py",
    "test_packed.py",
    "test_dflash.py",
    "test_recipe.py",
    "test_hybrid.py",
    "test_mtp.py",
)


def _weight(item) -> int:
    module = item.path.name
    return HEAVY_MODULES.index(module) if module in HEAVY_MODULES else len(HEAVY_MODULES)


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=_weight)


def batch_decoder(target: torch.nn.Module, make=None, **kwargs):
    """A Decoder whose drafter `make()` builds (None: plain decoding): the tests' batches, each with a fresh drafter."""
    from engine.decoding.loop import Decoder

    return Decoder(target, make() if make is not None else None, **kwargs)
