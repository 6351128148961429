"""What a drafter declares once, so the CLI flags, the app's knobs, saved settings, logs, benchmark tables and
colours are all generated from it (docs/ARCHITECTURE.md, "Add a drafter").

A drafter module defines a `SPEC = DrafterSpec(...)`: its name, label and colour, the part it needs loaded besides
the target (a draft model, heads, or nothing), an options dataclass whose fields are declared with `knob(...)`
(type from the annotation, default, range or choices, help), and a build function.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import GlanceError

if typing.TYPE_CHECKING:
    from engine.decoding.sampling import SamplingConfig
    from engine.drafters.base import Drafter
    from engine.models.loading import LoadedModel


@dataclass(frozen=True)
class Knob:
    """How an option is offered: help text, an inclusive range for numbers, strict `choices` or free-form
    `suggestions` for strings, and the CLI flag when it is not `--<field-name>`."""

    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    suggestions: tuple[str, ...] | None = None
    flag: str | None = None
    label: str | None = None


def knob(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field that carries its Knob: `gamma: int = knob(3, "draft tokens per step", lo=1, hi=16)`."""
    return field(default=default, metadata={"knob": Knob(help, **kwargs)})


@dataclass(frozen=True)
class KnobField:
    """One option field resolved: its name, unique across drafters because the drafter's name qualifies it
    (`eagle3_top_k`: EAGLE-3's `top_k`), its field in the options dataclass, Python type, default and Knob."""

    name: str
    field: str
    kind: type
    default: Any
    knob: Knob

    @property
    def flag(self) -> str:
        return self.knob.flag or "--" + self.name.replace("_", "-")

    @property
    def label(self) -> str:
        return self.knob.label or self.field.replace("_", " ")

    def check(self, value: Any) -> Any:
        """The value converted to this field's type, or a GlanceError that names the flag and the allowed values."""
        k = self.knob
        try:
            if self.kind is bool:
                if not isinstance(value, bool):
                    raise ValueError
            elif self.kind is int:
                if isinstance(value, bool) or int(value) != float(value):
                    raise ValueError
                value = int(value)
            else:
                value = self.kind(value)
        except (TypeError, ValueError, OverflowError):
            raise GlanceError(f"{self.flag} takes a {self.kind.__name__} (got {value!r})") from None
        if k.lo is not None and k.hi is not None and not k.lo <= value <= k.hi:
            raise GlanceError(f"{self.flag} must be between {_num(k.lo)} and {_num(k.hi)} (got {value})")
        if k.choices is not None and value not in k.choices:
            raise GlanceError(f"{self.flag} must be one of {', '.join(k.choices)} (got {value!r})")
        return value


def _num(x: float) -> str:
    return f"{x:g}"


def knob_fields(options: type | None, namespace: str) -> list[KnobField]:
    """The knob fields of an options dataclass, in declaration order, named within the drafter `namespace`."""
    if options is None:
        return []
    hints = typing.get_type_hints(options)
    return [
        KnobField(f"{namespace}_{f.name}", f.name, hints[f.name], f.default, f.metadata["knob"])
        for f in dataclasses.fields(options)
        if "knob" in f.metadata
    ]


@dataclass(frozen=True)
class PartSpec:
    """Something a drafter needs loaded besides the target: `load(path, target, access)` returns it (raising
    GlanceError when it does not fit the target) and `describe(part)` says what it is for logs and reports."""

    key: str  # also the CLI flag (--draft) and the app's model field
    help: str
    load: Callable[[str, LoadedModel, dict], Any]
    describe: Callable[[Any], dict]
    bundled: Path | None = None  # used with the bundled target when the user names none
    brief: Callable[[Any], str] | None = None  # one short line for the app's model panel ("4 heads")
    # how the part compiles with the target (`--compile`): compile(part, progress) -> CompileReport; None: it does not
    compile: Callable[[Any, Callable[[int, int, str], None]], Any] | None = None
    compile_steps: int = 1  # progress reports its compile makes
    # whether a local target folder ships the part in its own files (a target's MTP layers): with no part named, that
    # folder is the part's
    native: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class BudgetTraits:
    """What the draft budget (engine/budget) may do with a drafter: data the loop reads, not drafter methods."""

    depth_cap: str = "always"  # where a cost-aware budget caps draft depth: "always", "batches" (two rows up), "never"
    window: bool = False  # lookahead: a cost-aware budget sizes its window before a run and gates it at one row
    hindsight_depth: int | None = None  # how deep a catch-up's guesses tell (None: a chain's, as deep as the run)


@dataclass
class BuildContext:
    """What a build function gets: the target, the loaded part (or None), the drafter's options and the sampling."""

    target: LoadedModel
    part: Any
    options: Any
    sampling: SamplingConfig


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the method name on the command line, in logs and settings
    label: str  # human name in tables and the app
    color: str  # the lane colour, "#rrggbb"
    summary: str  # one line: what drafts
    build: Callable[[BuildContext], Drafter]
    options: type | None = None  # a dataclass of knob(...) fields, named within this drafter (`<name>_<field>`)
    part: PartSpec | None = None
    in_default_race: bool = True  # ticked in the app's race on first launch
    explain: Callable[[Any], str] | None = None  # options -> one line on what they build (the app shows it)
    reference: str | None = None  # transformers' row in the benchmark that does what this drafter does, if any
    budget: BudgetTraits = BudgetTraits()  # how a draft budget may shape its drafts
    # (options, part path) -> engine.drafters.serving.Serving: how vLLM, SGLang and transformers run it; None: none do
    serve: Callable[[Any, str | None], Any] | None = None

    @property
    def knobs(self) -> list[KnobField]:
        return knob_fields(self.options, self.name)
