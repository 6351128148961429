"""Chat templates: an instruct model gets the prompt as a user message in its own template, and generation stops
at the template's end of turn."""

from __future__ import annotations

from engine.errors import GlanceError

# End-of-turn markers of common templates; a run in chat mode also stops at whichever of them the vocabulary has.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat(tokenizer, chat: bool | None) -> bool:
    """chat None means: use the template when the tokenizer has one."""
    if chat and not has_template(tokenizer):
        raise GlanceError("this model's tokenizer has no chat template: send the prompt as plain text (--no-chat)")
    return has_template(tokenizer) if chat is None else chat


def encode_prompt(tokenizer, prompt: str, chat: bool, history: list[dict] | None = None) -> list[int]:
    """Token ids of `prompt`: as `apply_chat_template(history + [user message], add_generation_prompt=True)` gives
    them in chat mode, else the plain text's (earlier turns, if any, as lines before it)."""
    if not prompt.strip():
        raise GlanceError("the prompt is empty: give some text")
    history = list(history or [])
    if not chat:
        return list(tokenizer("\n\n".join([m["content"] for m in history] + [prompt]))["input_ids"])
    ids = tokenizer.apply_chat_template(history + [{"role": "user", "content": prompt}], add_generation_prompt=True)
    if not isinstance(ids, list):  # a BatchEncoding in some versions
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def stop_ids(model, tokenizer, chat: bool) -> list[int]:
    """The ids that end a run: the generation config's EOS (or the tokenizer's), plus the template's end of turn."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    out = [eos] if isinstance(eos, int) else list(eos or [])
    if chat:
        vocab = tokenizer.get_vocab()
        out += [vocab[t] for t in END_OF_TURN if t in vocab]
    return sorted(set(out))
