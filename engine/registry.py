"""Every drafter Glance knows, in lane order. Adding one = a module under engine/drafters/ with a SPEC, plus its line
here (docs/ARCHITECTURE.md, "Add a drafter"); the CLI, the app, logs and benchmarks read this list."""

from __future__ import annotations

import importlib

from engine.drafters.spec import BudgetTraits, DrafterSpec, KnobField, PartSpec
from engine.errors import GlanceError

# the modules under engine/drafters/, in lane order: each defines its SPEC
DRAFTERS: tuple[DrafterSpec, ...] = tuple(
    importlib.import_module(f"engine.drafters.{module}").SPEC
    for module in (
        "autoregressive",
        "vanilla",
        "medusa",
        "eagle",
        "eagle3",
        "dflash",
        "mtp",
        "assistant",
        "lookahead",
        "prompt_lookup",
        "suffix",
    )
)

BY_NAME: dict[str, DrafterSpec] = {s.name: s for s in DRAFTERS}
METHODS: tuple[str, ...] = tuple(BY_NAME)
BASELINE = "ar"  # plain decoding: every other lane is compared with it


def spec(name: str) -> DrafterSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise GlanceError(f"unknown method '{name}': choose one of {', '.join(METHODS)}") from None


def traits(name: str) -> BudgetTraits:
    """How a draft budget may shape the drafts of the method `name` (defaults for a drafter the registry lacks)."""
    return BY_NAME[name].budget if name in BY_NAME else BudgetTraits()


def parts() -> list[PartSpec]:
    """Every part some drafter needs, once each, in registry order."""
    return list({s.part.key: s.part for s in DRAFTERS if s.part is not None}.values())


def knobs() -> list[tuple[DrafterSpec, KnobField]]:
    """Every option field of every drafter, with its drafter."""
    return [(s, k) for s in DRAFTERS for k in s.knobs]


def _check_unique() -> None:
    names = [k.name for _, k in knobs()]
    flags = [k.flag for _, k in knobs()] + [f"--{p.key}" for p in parts()]
    if len(set(names)) != len(names) or len(set(flags)) != len(flags):
        raise RuntimeError("two drafters declare the same option name or flag")


_check_unique()
