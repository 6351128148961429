"""A step's text as a reader sees it: each emitted token's piece, decoded in context, and the rejected draft
tokens by name. The app and the CLI write it beside each step of a session log, so a log opens with its text."""

from __future__ import annotations

from engine.records.events import StepEvent
from engine.records.session_log import StepText


class PieceDecoder:
    """Text of each new token, decoded in context so multi-token characters and spaces come out right."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def pieces(self, tokens: list[int]) -> list[str]:
        out = []
        for t in tokens:
            self.ids.append(t)
            text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
            out.append(text[len(self.text) :])
            self.text = text
        return out

    def step_text(self, ev: StepEvent) -> StepText:
        """The event's pieces, and its rejected draft tokens' text."""
        rejected = [readable(self.tokenizer, t) for t in rejected_tokens(ev)]
        return StepText(self.pieces(ev.tokens), rejected)


def readable(tokenizer, token: int) -> str:
    """One token's text; a special token (an end of turn) by its name, as `[im_end]`, not its raw markup."""
    if token in set(tokenizer.all_special_ids):
        return "[" + str(tokenizer.convert_ids_to_tokens(token)).strip("<|>") + "]"
    return tokenizer.decode([token])


def rejected_tokens(ev: StepEvent) -> list[int]:
    """Draft tokens after the accepted path, along first children: the guess the target corrected."""
    node = ev.accepted_nodes[-1] if ev.accepted_nodes else -1
    out = []
    while True:
        child = next((i for i, p in enumerate(ev.draft_parents) if p == node), None)
        if child is None:
            return out
        out.append(ev.draft_tokens[child])
        node = child
