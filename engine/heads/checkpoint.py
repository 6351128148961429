"""Reading a head's checkpoint safely: tensors only (safetensors, else a weights_only torch file, never unpickled
code), and every way a file or a config can be wrong turned into one GlanceError that names the folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.errors import GlanceError, reason


def read_tensors(folder: Path, safetensors_name: str, torch_name: str) -> dict:
    """The tensors of `folder/safetensors_name`, else `folder/torch_name` (weights_only); a truncated or foreign
    file is a GlanceError, not a library traceback."""
    safe, pt = folder / safetensors_name, folder / torch_name
    try:
        if safe.exists():
            from safetensors.torch import load_file

            return load_file(str(safe))
        if pt.exists():
            state = torch.load(pt, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise ValueError("it holds something other than a dictionary of tensors")
            return state
    except GlanceError:
        raise
    except Exception as exc:  # safetensors, pickle and zip errors have no common base: name the file instead
        name = safe if safe.exists() else pt
        raise GlanceError(f"{name} could not be read ({reason(exc, 160)}): a truncated or foreign file?") from None
    raise GlanceError(f"{folder} holds neither {safetensors_name} nor {torch_name}")


@contextmanager
def config_errors(folder: Path, kind: str, needs: str) -> Iterator[None]:
    """Building a head from its config.json and loading its tensors: a missing key, a value of the wrong type or a
    tensor of the wrong shape becomes one GlanceError that says which."""
    try:
        yield
    except GlanceError:
        raise
    except KeyError as exc:
        raise GlanceError(f"{folder}/config.json lacks {exc} (the {kind} needs {needs})") from None
    except Exception as exc:  # transformers' config validation, torch's size mismatches, bad types: no common base
        raise GlanceError(
            f"{folder}: the checkpoint does not fit the {kind} its config.json describes ({reason(exc, 200)})"
        ) from None
