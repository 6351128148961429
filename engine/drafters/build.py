"""Drafters built from the registry: options for every method, the parts they need, and a fresh drafter per run."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from engine.decoding.sampling import SamplingConfig
from engine.drafters.base import Drafter
from engine.drafters.spec import BuildContext
from engine.drafters.vanilla import DEFAULT_GAMMA
from engine.errors import Cancelled, GlanceError
from engine.models.loading import LoadedModel
from engine.registry import DRAFTERS, METHODS, knobs, parts, spec

__all__ = ["DEFAULT_GAMMA", "METHODS", "NEEDS", "DrafterOptions", "build_drafter", "load_parts", "parts_needed"]

NEEDS: dict[str, str] = {s.name: s.part.key for s in DRAFTERS if s.part is not None}  # method -> part key


class DrafterOptions:
    """Every drafter's options, built from their qualified names (`DrafterOptions(vanilla_gamma=2, eagle_top_k=8)`:
    the drafter's name, then its field); each value is checked against its knob's type and range, so a bad value
    fails here with the flag's name."""

    def __init__(self, **values: Any) -> None:
        fields = {k.name: (s, k) for s, k in knobs()}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise TypeError(f"unknown drafter option(s): {', '.join(unknown)}")
        self.by_method: dict[str, Any] = {}
        for s in DRAFTERS:
            if s.options is None:
                continue
            given = {k.field: k.check(values[k.name]) for k in s.knobs if k.name in values}
            self.by_method[s.name] = s.options(**given)

    def for_method(self, method: str) -> Any:
        return self.by_method.get(method)

    def flat(self) -> dict[str, Any]:
        """Every option by its qualified name, for logs, settings and reports."""
        out: dict[str, Any] = {}
        for method, opts in self.by_method.items():
            out |= {f"{method}_{k}": v for k, v in dataclasses.asdict(opts).items()}
        return out

    def __getattr__(self, name: str) -> Any:
        """An option by its qualified name (`options.eagle_top_k`)."""
        for method, opts in self.__dict__.get("by_method", {}).items():
            field = name.removeprefix(f"{method}_")
            if field != name and hasattr(opts, field):
                return getattr(opts, field)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"DrafterOptions({self.flat()})"


def build_drafter(
    method: str,
    target: LoadedModel,
    parts: dict | None = None,
    options: DrafterOptions | None = None,
    sampling: SamplingConfig | None = None,
) -> Drafter:
    """A fresh drafter for `method` from the loaded parts ({"draft": LoadedModel, "medusa": heads, ...})."""
    s = spec(method)
    part = None
    if s.part is not None:
        part = (parts or {}).get(s.part.key)
        if part is None:
            raise GlanceError(f"method '{method}' needs {s.part.key} weights: pass --{s.part.key}")
    opts = (options or DrafterOptions()).for_method(method)
    return s.build(BuildContext(target, part, opts, sampling or SamplingConfig()))


def parts_needed(methods) -> set[str]:
    """Part keys the methods need besides the target."""
    return {NEEDS[m] for m in methods if m in NEEDS}


def load_parts(
    target: LoadedModel,
    methods,
    paths: dict[str, str | None] | None = None,
    allow_download: bool = False,
    trust_remote_code: bool = False,
    accept_missing_weights: bool = False,
    cancel=None,
    on_part=None,
    **named: str | None,
) -> dict:
    """Load what the methods need besides the target, by part key (`paths={"draft": ..., "medusa": ...}`, or the
    same as keywords); each part's loader checks that it fits the target. `on_part(key)` is called before each."""
    paths = {**(paths or {}), **named}
    access = {
        "allow_download": allow_download,
        "trust_remote_code": trust_remote_code,
        "accept_missing_weights": accept_missing_weights,
    }
    out: dict = {}
    for part in parts():
        path = paths.get(part.key)
        if part.key in parts_needed(methods) and path:
            if cancel is not None and cancel():
                raise Cancelled("loading cancelled")
            if on_part is not None:
                on_part(part.key)
            out[part.key] = part.load(str(path), target, access)
            if isinstance(out[part.key], torch.nn.Module):
                out[part.key].source = str(path)  # heads do not know their folder: logs and reports name it
    return out


def describe_parts(loaded: dict) -> dict:
    """What each loaded part is, for session logs and benchmark reports; heads also get their folder, parameter
    count and dtype, like models."""
    out = {}
    for p in parts():
        obj = loaded.get(p.key)
        if obj is None:
            continue
        info = dict(p.describe(obj))
        if isinstance(obj, torch.nn.Module):
            params = list(obj.parameters())
            info.setdefault("name", getattr(obj, "source", p.key))
            info.setdefault("parameters", sum(x.numel() for x in params))
            if params:
                info.setdefault("dtype", str(params[0].dtype).removeprefix("torch."))
        out[p.key] = info
    return out
