"""Load a target, a draft and their tokenizer from a hub id or a local folder, on a chosen device and dtype.

Offline by default (`local_files_only=True`); `trust_remote_code` stays off unless the caller asks for it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import GlanceError, reason
from engine.models.gguf_header import one_reader_per_file
from engine.runtime.machine import native_bfloat16

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
BUNDLED_TARGET = RESOURCES / "models" / "target"
BUNDLED_DRAFT = RESOURCES / "models" / "draft"
BUNDLED = RESOURCES / "models"  # the bundled family: the target, and each drafter part under its part key

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    # A draft model whose LM head reads only these target ids (sorted; draft_vocab.safetensors beside its weights):
    # its logits' column i is target id draft_ids[i]. None: its logits cover the whole vocabulary.
    draft_ids: torch.Tensor | None = None

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def describe(self) -> dict:
        return {
            "name": self.name,
            "parameters": self.parameters,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "architecture": type(self.model).__name__,
        }


def resolve_device(device: str = "auto") -> torch.device:
    """auto picks cuda, then mps, then cpu; an explicit device that is not available is an error."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise GlanceError(f"unknown device {device!r}: use auto, cpu, cuda or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GlanceError("device 'cuda' asked for but no CUDA GPU is available: use --device cpu or auto")
    if device == "mps" and not torch.backends.mps.is_available():
        raise GlanceError("device 'mps' asked for but Metal is not available: use --device cpu or auto")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA and on a CPU with bfloat16 matrix instructions (about twice float32's speed there),
    float32 on a CPU without (bfloat16 is emulated there and slower: engine/runtime/machine.py), float16 on MPS.
    float32 is
    the one for exact comparisons."""
    if dtype == "auto":
        if device.type == "mps":
            return torch.float16
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        if device.type == "cpu" and not native_bfloat16():
            return torch.float32
        return torch.bfloat16
    if dtype not in DTYPES:
        raise GlanceError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


def _looks_local(name: str) -> bool:
    """An existing path, or something no hub id looks like (absolute, relative-dotted, or two slashes deep)."""
    return Path(name).expanduser().exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1


def _check_folder(path: Path) -> None:
    if not path.exists():
        raise GlanceError(f"model folder not found: {path}; give an existing folder or a hub id")
    if not path.is_dir():
        raise GlanceError(f"{path} is a file, not a model folder: point at the folder holding config.json")
    config = path / "config.json"
    if not config.exists():
        raise GlanceError(f"{path} holds no config.json: it is not a Hugging Face model folder")
    from engine.inputs import read_json_object

    try:
        read_json_object(config, "a model config")
    except GlanceError as exc:
        raise GlanceError(f"{exc}: the model folder is damaged") from None


def _check_hub_reachable(timeout: float = 5.0) -> None:
    """One quick connection to the hub before a download, so that no network fails in seconds with one line
    instead of after a minute of the hub client's retries."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise GlanceError(
            f"cannot reach {host} to download ({exc.strerror or exc}): check the network, or point --target at a "
            "local folder or .gguf file"
        ) from None


def load_model(
    name: str | os.PathLike,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    allow_download: bool = False,
    trust_remote_code: bool = False,
    accept_missing_weights: bool = False,
) -> LoadedModel:
    """Load a causal LM and its tokenizer. Raises GlanceError with an actionable message on any failure, a weight
    the config needs but the files lack included (it would run as random values) unless `accept_missing_weights`."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    name = str(name)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    local = _looks_local(name)
    kwargs = {"local_files_only": not allow_download, "trust_remote_code": trust_remote_code}
    if not local:
        from engine.models.catalog import resolve

        folder = resolve(name)  # an installed catalog model by name ("SmolLM2-135M-Instruct", "smollm2")
        if folder is not None:
            name, local = str(folder), True
    if local and name.lower().endswith(".gguf"):
        return _load_gguf(Path(name).expanduser(), dev, dt, kwargs, accept_missing_weights)
    if not local and allow_download:
        _check_hub_reachable()
    if local:
        from engine.models.catalog import assembled_part

        path = Path(name).expanduser()
        path = (assembled_part(path) if path.is_dir() else None) or path
        _check_folder(path)
        name = str(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = _from_pretrained(name, dt, kwargs, accept_missing_weights)
    except GlanceError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for bad or missing models
        why = reason(exc)
        if "trust_remote_code" in str(exc) and not trust_remote_code:
            raise GlanceError(
                f"'{name}' needs its own Python code to load (a custom architecture): pass --trust-remote-code "
                "(in the app: tick 'trust remote code') only if you trust where it comes from"
            ) from None
        if "size mismatch" in str(exc) or "mismatched" in str(exc) or "above report" in str(exc):
            raise GlanceError(
                f"the weights in '{name}' do not have the shapes its config.json describes: the folder mixes "
                "files of different models, or its config was edited"
            ) from None
        if "does not recognize this architecture" in str(exc):
            raise GlanceError(
                f"'{name}' is an architecture this transformers does not know: a newer transformers may load it, "
                "or, if the model ships its own code, --trust-remote-code"
            ) from None
        if not local and not allow_download:
            raise GlanceError(
                f"'{name}' is not a local folder and could not be loaded from the local Hugging Face cache "
                f"({why}); pass --allow-download to fetch it from the hub"
            ) from None
        raise GlanceError(f"could not load model '{name}': {why}") from None
    return _ready(model, tokenizer, name, dev, dt)


def _from_pretrained(name: str, dt: torch.dtype, kwargs: dict, accept_missing: bool):
    """The model through sdpa attention (tree verification needs a custom 4D mask), else eager; refused when its
    files lack weights its config needs or hold ones it does not (transformers would fill the gaps randomly)."""
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            name, dtype=dt, attn_implementation="sdpa", output_loading_info=True, **kwargs
        )
    except ValueError as exc:
        if "sdpa" not in str(exc).lower():
            raise
        model, info = AutoModelForCausalLM.from_pretrained(
            name, dtype=dt, attn_implementation="eager", output_loading_info=True, **kwargs
        )
    missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    if (missing or unexpected) and not accept_missing:
        said = [f"{len(k)} {what} ({', '.join(k[:3])}{', ...' if len(k) > 3 else ''})"
                for k, what in ((missing, "missing"), (unexpected, "unexpected")) if k]  # fmt: skip
        raise GlanceError(
            f"the weights in '{kwargs.get('gguf_file') or name}' do not match its config: {' and '.join(said)} "
            "tensors; a missing one would run as random values. Use complete files, or pass "
            "--accept-missing-weights to run it anyway"
        )
    return model


def _ready(model, tokenizer, name: str, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    """A loaded model on its device in eval mode, attending through Glance's attention (one query row in bf16 on a
    CPU in float32, engine/runtime/attention_precision.py; never through cuDNN on CUDA,
    engine/runtime/attention_backend.py): the last
    step of every way a model is loaded."""
    from engine.runtime.attention_backend import avoid_cudnn_attention
    from engine.runtime.attention_precision import use_glance_sdpa

    model.to(dev).eval()
    use_glance_sdpa(model)
    avoid_cudnn_attention(dev)
    return LoadedModel(model, tokenizer, name, dev, dt)


def _load_gguf(path: Path, dev: torch.device, dt: torch.dtype, kwargs: dict, accept_missing: bool) -> LoadedModel:
    """A GGUF file (llama.cpp, LM Studio, ollama) through transformers' GGUF support, dequantised into `dt`; its
    header is checked first (engine/models/gguf_check.py)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from engine.models.gguf_check import check_gguf_header

    if not path.is_file():
        raise GlanceError(f"GGUF file not found: {path}")
    check_gguf_header(path)
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise GlanceError("reading GGUF files needs the gguf package: pip install gguf") from None
    hf_logging.enable_progress_bar()  # dequantising takes a while: show its progress bar
    folder, file = str(path.parent), path.name
    try:
        with one_reader_per_file():  # transformers parses the header three times otherwise
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file, **kwargs)
            model = _from_pretrained(folder, dt, {"gguf_file": file}, accept_missing)
    except GlanceError:
        raise
    except Exception as exc:  # an unsupported architecture or quantisation, a damaged file
        why = reason(exc)
        raise GlanceError(f"could not load the GGUF file {path}: {why}") from None
    finally:
        hf_logging.disable_progress_bar()
    return _ready(model, tokenizer, str(path), dev, dt)


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft must tokenise exactly like the target: same vocabulary, same special tokens."""
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        raise GlanceError(
            f"the draft '{draft.name}' does not share the target's vocabulary ({len(dv)} vs {len(tv)} tokens, "
            f"{only_t} target entries differ): pick a draft trained with the target's tokenizer"
        )
    # The draft must read every token the target can emit: its embedding covers the target's logits, or at least
    # every id the tokenizer has (LM heads padded past the tokenizer, as Qwen2.5's, never emit the padding rows).
    # Its own logits are padded or cut to the target's width by the vanilla drafter.
    readable = int(draft.model.get_input_embeddings().weight.shape[0])
    needed = min(target.vocab_size, len(target.tokenizer))
    if readable < needed:
        raise GlanceError(
            f"the draft '{draft.name}' reads {readable} token ids but the target can emit {needed}: "
            "pick a draft with the target's full vocabulary"
        )


LOAD_ONLY_KEYS = ("local_files_only", "trust_remote_code")  # how Glance loaded the tokenizer, not what it is


def save_tokenizer(tokenizer, out: Path) -> None:
    """Save `tokenizer` into the model folder `out`, without the keyword arguments Glance loaded it with (transformers
    writes them into tokenizer_config.json, and a folder saved with `local_files_only` would keep a user who loads it
    elsewhere offline)."""
    tokenizer.save_pretrained(str(out))
    config = Path(out) / "tokenizer_config.json"
    if config.exists():
        data = json.loads(config.read_text())
        if any(k in data for k in LOAD_ONLY_KEYS):
            config.write_text(json.dumps({k: v for k, v in data.items() if k not in LOAD_ONLY_KEYS}, indent=2))
