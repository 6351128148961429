"""How the engines people deploy with would run a drafter with the settings a race used: vLLM's
`--speculative-config`, SGLang's server flags and transformers' `generate` arguments. Each drafter's spec says its
own mapping (`DrafterSpec.serve`); this module holds the shape and writes it out (`python main.py serve-config`,
the app's File > Export serving config)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from engine.errors import GlanceError


@dataclass(frozen=True)
class Serving:
    """One drafter in each serving engine: vLLM's speculative_config, SGLang's flags (name -> value), transformers'
    generate() keywords (a part's path where it takes a model), or None where the engine lacks the method; `notes`
    say what is missing or means something else there."""

    vllm: dict[str, Any] | None = None
    sglang: dict[str, Any] | None = None
    transformers: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def serving_for(method: str, options: Any, part: str | None) -> Serving:
    """The serving recipe of `method` with its options dataclass `options` and its part's path (a draft model or a
    heads folder; None for drafters that need none)."""
    from engine.registry import BASELINE
    from engine.registry import spec as spec_of

    spec = spec_of(method)  # a GlanceError naming the methods for an unknown one
    if method == BASELINE:
        return Serving(notes=["plain decoding is every engine's default: serve the target with no speculative config"])
    if spec.serve is None:
        return Serving(notes=[f"{spec.label} has no counterpart in vLLM, SGLang or transformers"])
    if spec.part is not None and not part:
        raise GlanceError(f"{spec.label} is served with its {spec.part.key}: give --{spec.part.key}")
    return spec.serve(options, part)


def render(method: str, target: str, serving: Serving) -> str:
    """A Markdown page: for each engine, the command or call to paste, or why it cannot run this drafter."""
    out = [f"# Serving `{method}` on `{target}`", ""]
    out += ["## vLLM", ""]
    if serving.vllm is not None:
        cfg = json.dumps(serving.vllm)
        out += ["```bash", f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(cfg)}", "```", ""]
    else:
        out += ["vLLM has no such method.", ""]
    out += ["## SGLang", ""]
    if serving.sglang is not None:
        flags = " ".join(f"--{k} {shlex.quote(str(v))}" for k, v in serving.sglang.items())
        out += ["```bash", f"python -m sglang.launch_server --model-path {shlex.quote(target)} {flags}", "```", ""]
    else:
        out += ["SGLang has no such method.", ""]
    out += ["## transformers", ""]
    if serving.transformers is not None:
        kw = dict(serving.transformers)
        lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
        lines += [f"model = AutoModelForCausalLM.from_pretrained({target!r})"]
        lines += [f"tokenizer = AutoTokenizer.from_pretrained({target!r})"]
        if "assistant_model" in kw:
            lines += [f"assistant = AutoModelForCausalLM.from_pretrained({kw.pop('assistant_model')!r})"]
            kw = {"assistant_model": "assistant"} | kw
        args = ", ".join(f"{k}={v}" if k == "assistant_model" else f"{k}={v!r}" for k, v in kw.items())
        lines += ['inputs = tokenizer("def fib(n):", return_tensors="pt")']
        lines += [f"out = model.generate(**inputs, max_new_tokens=128, {args})"]
        out += ["```python", *lines, "```", ""]
    else:
        out += ["transformers has no such method.", ""]
    if serving.notes:
        out += ["## Notes", "", *[f"- {n}" for n in serving.notes], ""]
    return "\n".join(out)


def as_json(method: str, target: str, serving: Serving) -> dict:
    """The same, as data: what tests and scripts read."""
    return {
        "method": method,
        "target": target,
        "vllm": serving.vllm,
        "sglang": serving.sglang,
        "transformers": serving.transformers,
        "notes": serving.notes,
    }
