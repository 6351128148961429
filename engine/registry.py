"""Every drafter Glance knows, in lane order. Adding one = a module under engine/drafters/ with a SPEC, plus its line
here (docs/ARCHITECTURE.md, "Add a drafter"); the CLI, the app, logs and benchmarks read this list."""

from __future__ import annotations

from engine.drafters import autoregressive, eagle, eagle3, lookahead, medusa, prompt_lookup, vanilla
from engine.drafters.spec import BudgetTraits, DrafterSpec, KnobField, PartSpec
from engine.errors import GlanceError

DRAFTERS: tuple[DrafterSpec, ...] = (
    autoregressive.SPEC,
    vanilla.SPEC,
    medusa.SPEC,
    eagle.SPEC,
    eagle3.SPEC,
    lookahead.SPEC,
    prompt_lookup.SPEC,
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
