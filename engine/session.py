"""The engine's facade for front ends: load a target and the parts its drafters need, build decoders for the chosen
methods, race them and log what happened. The CLI and the app both go through it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.budget.draft_budget import make_budget
from engine.decoding.loop import CancelCheck, Decoder
from engine.decoding.race import Lane, race
from engine.decoding.sampling import SamplingConfig
from engine.drafters.build import DrafterOptions, build_drafter, describe_parts, load_parts, parts_needed
from engine.drafters.serving import Serving, serving_for
from engine.errors import Cancelled, GlanceError
from engine.heads.compiled_readout import forget_compiled_readouts
from engine.heads.compiled_step import forget_compiled_steps
from engine.models.catalog import find, model_folder, part_folder
from engine.models.chat import encode_prompt, has_template, stop_ids, use_chat
from engine.models.loading import BUNDLED_TARGET, LoadedModel, load_model
from engine.records.events import RunSummary, StepEvent
from engine.records.session_log import SessionLogWriter
from engine.registry import METHODS, parts, spec
from engine.runtime.forward import COMPILE_STEPS, CompileReport, compile_model, forget_compiled


@dataclass
class RaceSettings:
    """What a race runs with, besides the models: recorded whole in the session log's header."""

    methods: list[str]
    max_new_tokens: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    options: DrafterOptions = field(default_factory=DrafterOptions)
    interleaved: bool = True
    chat: bool | None = None  # send the prompt as a user message in the chat template (None: when there is one)
    draft_budget: str = "auto"  # how deep each step drafts: "auto" (cost-aware) or "full" (the drafter's settings)

    def __post_init__(self) -> None:
        for m in self.methods:
            spec(m)  # unknown names fail here, with the list of known ones
        make_budget(self.draft_budget)
        if self.max_new_tokens < 1:
            raise GlanceError(f"max new tokens must be at least 1 (got {self.max_new_tokens})")

    def describe(self) -> dict:
        s = self.sampling
        return {
            "methods": list(self.methods),
            "max_new_tokens": self.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": s.seed,
            "drafters": self.options.flat(),
            "interleaved": self.interleaved,
            "chat": self.chat,
            "draft_budget": self.draft_budget,
        }


@dataclass
class Session:
    """A loaded target and the parts (draft model, heads) its drafters need, keyed by part key."""

    target: LoadedModel
    parts: dict[str, Any] = field(default_factory=dict)
    compiled: list[CompileReport] = field(default_factory=list)  # what compile_models did, per model
    sources: tuple[str, dict[str, str]] = ("", {})  # where the target and each part came from (`resolve`)

    @classmethod
    def load(
        cls,
        target: str | None = None,
        paths: dict[str, str | None] | None = None,
        methods: list[str] | tuple[str, ...] = METHODS,
        device: str = "auto",
        dtype: str = "auto",
        allow_download: bool = False,
        trust_remote_code: bool = False,
        accept_missing_weights: bool = False,
        cancel: Callable[[], bool] | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        compile: bool = False,
        time_forwards: bool = False,
    ) -> Session:
        """Load `target` (the bundled demo target when empty) and the parts `methods` need. With the bundled target,
        a part the user names none for is the bundled one; with their own target, only what they name. `cancel()`
        true stops the load between the target and its parts, and a compile between its warm-up shapes (Cancelled,
        "loading cancelled"); `progress(done, total, what)` is told before each model or part starts loading.
        `compile`: compile the target's and the draft model's forwards (engine/runtime/forward.py) and the EAGLE heads'
        drafting steps (engine/heads/compiled_step.py), and warm them up now; one that fails to compile stays eager
        and its report says why. `time_forwards`: then time the target's forwards that sizing drafts reads
        (`Session.time_forwards`), so that the first race starts at once."""
        if not target and not (BUNDLED_TARGET / "config.json").exists():
            raise GlanceError(f"nothing bundled at {BUNDLED_TARGET}: pass --target with a folder or hub id")
        access = {
            "allow_download": allow_download,
            "trust_remote_code": trust_remote_code,
            "accept_missing_weights": accept_missing_weights,
        }
        source, chosen = cls.resolve(target, paths)
        to_load = [k for k in chosen if k in parts_needed(methods)]
        compiling = sum(p.compile_steps for p in parts() if p.key in to_load and p.compile is not None)
        total = len(to_load) + 1 + (COMPILE_STEPS + compiling if compile else 0)
        total += time_forwards
        steps = iter(range(total))

        def report(what: str) -> None:
            if progress is not None:
                progress(next(steps), total, what)

        report(f"loading the target {Path(str(target or BUNDLED_TARGET)).name}")
        loaded = load_model(target or BUNDLED_TARGET, device=device, dtype=dtype, **access)
        if cancel is not None and cancel():
            raise Cancelled("loading cancelled")
        parts_ = load_parts(loaded, methods, chosen, cancel=cancel, on_part=lambda k: report(f"loading {k}"), **access)
        session = cls(loaded, parts_, sources=(source, {k: v for k, v in chosen.items() if k in parts_}))
        if compile:
            session.compile_models(lambda done, of, what: report(what), cancel)
        if time_forwards:
            if cancel is not None and cancel():
                raise Cancelled("loading cancelled")
            report("timing the target's forwards (once per session)")
            session.time_forwards(methods, cancel)
        return session

    def time_forwards(
        self, methods: list[str] | tuple[str, ...] = METHODS, cancel: Callable[[], bool] | None = None
    ) -> None:
        """Time, once a session, the target forwards that the cost-aware budget and lookahead's window read before
        a run (engine/runtime/forward_timing.py: `measured_once`), for the loaded methods among `methods`. After a
        compile:
        the compiled forward has costs of its own. `cancel()` true stops it between forwards (Cancelled): on
        SmolLM2-135M, eager, it takes about 14 s."""
        settings = RaceSettings([m for m in methods if self.available(m)])
        for m in settings.methods:
            self.decoder(m, settings).time_forwards(cancel)
            if cancel is not None and cancel():
                raise Cancelled("loading cancelled")

    def forward_costs(self, widths, cancel: Callable[[], bool] | None = None) -> dict[int, float]:
        """The target's steady seconds for one forward over each of `widths` new tokens (one row, after a short
        prompt), measured once a session: where this device stops being memory bound."""
        from engine.runtime.forward_timing import measured_once

        costs = measured_once(self.target.model, 1, widths, cancel)
        if cancel is not None and cancel():
            raise Cancelled("timing cancelled")
        return costs

    def plain_step_seconds(self) -> float | None:
        """A one-token forward of the target as the load timed it (for the budget), or None: what stands for plain
        decoding's step where a race has no plain lane. Never times anything itself."""
        from engine.budget.draft_budget import PRICE_WIDTHS
        from engine.runtime.forward_timing import remembered_costs

        return (remembered_costs(self.target.model, 1, PRICE_WIDTHS) or {}).get(1)

    @property
    def device_name(self) -> str:
        """The device the target runs on, in words."""
        from engine.runtime.machine import cpu_name

        device = next(self.target.model.parameters()).device
        return torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} ({cpu_name()})"

    def compile_models(self, progress=None, cancel: Callable[[], bool] | None = None) -> list[CompileReport]:
        """Compile the target's forward, then each loaded part as its drafter's spec declares (`PartSpec.compile`:
        the draft model's forward, the EAGLE heads' drafting steps, Medusa's read-out), warmed up; the reports say how
        long each took, or why it stays eager."""
        torch._dynamo.reset()  # graphs of earlier models hold their weights (frozen in, on a CPU): drop them
        forget_compiled()  # and the compiled forwards and drafting steps, which hold their models and heads
        forget_compiled_steps()
        forget_compiled_readouts()

        def checked(done: int, of: int, what: str) -> None:
            """Progress that also stops the compile between warm-up shapes (each one compiles a graph: up to a
            minute on a 2-core AVX2 CPU), so closing the window does not wait for every model to compile."""
            if cancel is not None and cancel():
                raise Cancelled("loading cancelled")
            if progress is not None:
                progress(done, of, what)

        self.compiled.append(compile_model(self.target.model, "the target", checked))
        for part in parts():  # each part compiles as its drafter declares (a draft's forward, a head's drafting step)
            loaded = self.parts.get(part.key)
            if loaded is not None and part.compile is not None:
                self.compiled.append(part.compile(loaded, checked))
        return self.compiled

    @classmethod
    def resolve(cls, target: str | None, paths: dict[str, str | None] | None = None) -> tuple[str, dict[str, str]]:
        """(the target's folder or hub id, each part's folder) as `load` chooses them, loading nothing: an installed
        catalog model brings the parts trained for it."""
        entry = find(target) if target else None
        source = str(model_folder(entry)) if entry is not None else str(target or BUNDLED_TARGET)
        chosen = cls._part_paths(not target, entry, paths)
        for part in parts():  # parts the target ships in its own files (MTP layers), where nothing else was chosen
            if part.key not in chosen and part.native is not None and part.native(source):
                chosen[part.key] = source
        return source, chosen

    def serving(self, method: str, options: DrafterOptions) -> Serving:
        """How vLLM, SGLang and transformers would run `method` with these options and this session's parts."""
        part = spec(method).part
        return serving_for(method, options.for_method(method), self.sources[1].get(part.key) if part else None)

    @staticmethod
    def _part_paths(bundled: bool, entry, paths: dict[str, str | None] | None) -> dict[str, str]:
        """Which folder each part comes from: what the user named, else the bundled part (bundled target), else
        the part installed with a catalog model."""
        chosen = {}
        for part in parts():
            given = (paths or {}).get(part.key)
            own = part_folder(entry, part.key) if entry and not given else None
            if given:
                chosen[part.key] = str(given)
            elif bundled and part.bundled is not None and Path(part.bundled).exists():
                chosen[part.key] = str(part.bundled)
            elif own is not None and Path(own).exists():
                chosen[part.key] = str(own)
        return chosen

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def has_chat_template(self) -> bool:
        return has_template(self.target.tokenizer)

    def uses_chat(self, chat: bool | None) -> bool:
        return use_chat(self.target.tokenizer, chat)

    def stop_ids(self, chat: bool | None = None) -> list[int]:
        """The ids that end a run: the target's EOS, plus the chat template's end of turn in chat mode."""
        return stop_ids(self.target.model, self.target.tokenizer, self.uses_chat(chat))

    def available(self, method: str) -> bool:
        """True when `method`'s part is loaded (or it needs none)."""
        s = spec(method)
        return s.part is None or self.parts.get(s.part.key) is not None

    def summary_lines(self) -> list[str]:
        """One short line per loaded model or part, for a front end's model panel."""
        t = self.target
        lines = [f"target: {Path(t.name).name} · {t.parameters / 1e6:.1f}M · {t.device} · {t.describe()['dtype']}"]
        for part in parts():
            loaded = self.parts.get(part.key)
            if loaded is not None:
                lines.append(f"{part.key}: {part.brief(loaded) if part.brief else 'loaded'}")
        return lines + [report.line() for report in self.compiled]

    def describe(self) -> dict:
        """The target and every loaded part, for logs and reports."""
        return {"target": self.target.describe(), **describe_parts(self.parts)}

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        """The prompt's ids: in the chat template when `chat` (None: when the model has one), else plain text."""
        return encode_prompt(self.target.tokenizer, prompt, self.uses_chat(chat))

    def decoder(self, method: str, settings: RaceSettings) -> Decoder:
        drafter = build_drafter(method, self.target, self.parts, settings.options, settings.sampling)
        return Decoder(
            self.target.model,
            drafter,
            settings.sampling,
            settings.max_new_tokens,
            self.stop_ids(settings.chat),
            variant=method,
            budget=make_budget(settings.draft_budget),
        )

    def race(
        self, prompt_ids: list[int], settings: RaceSettings, cancel: CancelCheck = None
    ) -> Iterator[tuple[str, StepEvent | RunSummary]]:
        """(lane, event) for every chosen method until each has yielded its summary; drafters are built first, so
        a bad option fails before any lane starts."""
        lanes = [Lane(m, self.decoder(m, settings)) for m in settings.methods]
        return race(lanes, prompt_ids, cancel, interleaved=settings.interleaved)

    def open_log(
        self, path: str | Path, settings: RaceSettings, prompt: str, prompt_ids: list[int]
    ) -> SessionLogWriter:
        """A session log whose header names the models, every loaded part, the prompt and the settings."""
        writer = SessionLogWriter(path)
        try:
            header = settings.describe() | {
                "prompt": prompt,
                "chat": self.uses_chat(settings.chat),
                "prompt_ids": prompt_ids,
                "dtype": str(self.target.dtype).removeprefix("torch."),
            }
            writer.header(self.describe(), str(self.target.device), header)
        except BaseException:
            writer.close()
            raise
        return writer
