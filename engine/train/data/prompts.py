"""Build the prompt suite from held-out standard-library files only: code prompts in several categories.

Each record is {id, category, prompt, source, line}. Prompts end at the end of a line (before its line break),
with a few lines of the file's preceding context, so a model trained on the training split continues code it has
never seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from engine.train.data.corpus import Corpus, read_text

CONTEXT_LINES = 4
MAX_CHARS = 600
PER_CATEGORY = 12

Finder = Callable[[list[str], str], list[int]]  # (lines, relative path) -> indices of the prompt's last line


def _def_lines(lines: list[str], rel: str) -> list[int]:
    return [i for i, s in enumerate(lines) if re.match(r"\s*def (?!test)\w+\(.*\).*:\s*$", s)]


def _docstring_ends(lines: list[str], rel: str) -> list[int]:
    out = []
    for i in _def_lines(lines, rel):
        if i + 1 < len(lines) and lines[i + 1].strip().startswith(('"""', "'''")):
            quote = lines[i + 1].strip()[:3]
            for j in range(i + 1, min(i + 15, len(lines))):
                body = lines[j].strip()[3:] if j == i + 1 else lines[j]
                if quote in body:
                    out.append(j)
                    break
    return out


def _class_lines(lines: list[str], rel: str) -> list[int]:
    return [i for i, s in enumerate(lines) if re.match(r"\s*class \w+.*:\s*$", s)]


def _test_lines(lines: list[str], rel: str) -> list[int]:
    return [i for i, s in enumerate(lines) if re.match(r"\s*def test\w*\(.*\).*:\s*$", s)]


def _repetitive(lines: list[str], rel: str) -> list[int]:
    """Third line of a run of lines sharing their first 8 characters (tables, assert runs, attribute lists)."""
    out, i = [], 0
    while i + 3 < len(lines):
        head = lines[i].strip()[:8]
        if len(head) == 8 and all(lines[i + k].strip()[:8] == head for k in range(1, 4)):
            out.append(i + 2)
            i += 12
        else:
            i += 1
    return out


def _comments(lines: list[str], rel: str) -> list[int]:
    """First line of a block of at least three comment lines."""
    return [
        i
        for i in range(len(lines) - 2)
        if all(lines[i + k].strip().startswith("# ") for k in range(3))
        and (i == 0 or not lines[i - 1].strip().startswith("#"))
    ]


def _imports(lines: list[str], rel: str) -> list[int]:
    """The first import line of a module, prompting for the rest of its header."""
    for i, s in enumerate(lines):
        if s.startswith(("import ", "from ")):
            return [i]
    return []


CATEGORIES: dict[str, Finder] = {
    "function_signature": _def_lines,
    "docstring_to_code": _docstring_ends,
    "class_scaffold": _class_lines,
    "test_method": _test_lines,
    "repetitive_edit": _repetitive,
    "comment_prose": _comments,
    "module_imports": _imports,
}


def _prompt(lines: list[str], end: int) -> str:
    """The line and its context, without the final line break: byte-level BPE merges a newline with the next
    line's indentation, so a prompt ending in a bare newline would split a token the model never saw split."""
    start = max(0, end - CONTEXT_LINES)
    text = "\n".join(lines[start : end + 1])
    return text[-MAX_CHARS:]


def build_prompt_suite(corpus: Corpus, per_category: int = PER_CATEGORY) -> list[dict]:
    """Pick prompts round-robin over the held-out files so no single file dominates a category."""
    files = [(p.relative_to(corpus.root).as_posix(), read_text(p).splitlines()) for p in corpus.heldout]
    records = []
    for category, finder in CATEGORIES.items():
        spots = [[(rel, lines, i) for i in finder(lines, rel)] for rel, lines in files]
        picked: list = []
        depth = 0
        while len(picked) < per_category and any(len(s) > depth for s in spots):
            for s in spots:
                if len(s) > depth and len(picked) < per_category:
                    # spread picks through the file: the depth-th pick of evenly spaced candidates
                    idx = (depth * 7919) % len(s)
                    picked.append(s[idx])
            depth += 1
        seen = {r["prompt"] for r in records}
        unique = []
        for rel, lines, i in picked:
            if _prompt(lines, i) not in seen:
                seen.add(_prompt(lines, i))
                unique.append((rel, lines, i))
        for k, (rel, lines, i) in enumerate(unique):
            records.append(
                {
                    "id": f"{category}-{k:02d}",
                    "category": category,
                    "prompt": _prompt(lines, i),
                    "source": rel,
                    "line": i + 1,
                }
            )
    return records


def write_prompt_suite(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def load_prompt_suite(path: Path) -> list[dict]:
    """Prompt records from a JSON Lines file: one object per line with a non-empty string "prompt", and optionally
    "id" and "category" (defaults: the line number, "custom") and "history" (the earlier turns of a chat, as
    messages). Anything else is a GlanceError naming the line."""
    from engine.errors import GlanceError
    from engine.inputs import read_text

    text = read_text(path, "a prompt file", 64 << 20)
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            why = getattr(exc, "msg", "nested too deeply")
            raise GlanceError(f"{path}:{n}: not JSON ({why}): each line is one object like "
                              '{"prompt": "def add(a, b):"}') from None  # fmt: skip
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"].strip():
            raise GlanceError(f'{path}:{n}: each line needs a non-empty string "prompt" (got {line.strip()[:80]})')
        history = rec.get("history", [])
        if not isinstance(history, list) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            for m in history
        ):
            raise GlanceError(f'{path}:{n}: "history" must be a list of {{"role": "user"|"assistant", "content": ...}}')
        rec.setdefault("id", f"line-{n}")
        rec.setdefault("category", "custom")
        rec["id"], rec["category"] = str(rec["id"]), str(rec["category"])
        records.append(rec)
    if not records:
        raise GlanceError(f"{path} holds no prompts")
    return records
