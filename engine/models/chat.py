"""Chat templates: an instruct model gets the prompt as a user message in its own template, and generation stops
at the template's end of turn."""

from __future__ import annotations

import sys
import time

from engine.errors import GlanceError, reason

TEMPLATE_SECONDS = 1.0  # a chat template renders in milliseconds; one that runs a second loops or is hostile

# End-of-turn markers of common templates; a run in chat mode also stops at whichever of them the vocabulary has.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


class _TooLong(BaseException):
    """Raised inside a template that runs past its time; a BaseException, so no `except Exception` in it stops it."""


def _with_deadline(render, seconds: float):
    """`render()`, stopped with _TooLong once it runs `seconds`: a line tracer on this thread only (templates are
    compiled to Python, so a template's endless loop runs traced lines), restored after."""
    end = time.monotonic() + seconds
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        if count % 512 == 0 and time.monotonic() > end:
            raise _TooLong
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return render()
    finally:
        sys.settrace(previous)


def render_template(tokenizer, messages: list[dict], seconds: float = TEMPLATE_SECONDS) -> str:
    """The conversation in the tokenizer's chat template, rendered in transformers' sandbox with a time limit; any
    failure of the template (an error it raises, a syntax error, a sandbox refusal, a loop) is one GlanceError."""
    plain = "fix the template, or send the prompt as plain text (--no-chat; in the app untick 'as a chat message')"
    try:
        text = _with_deadline(
            lambda: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), seconds
        )
    except _TooLong:
        raise GlanceError(f"the chat template did not finish in {seconds:g} s (an endless loop?): {plain}") from None
    except RecursionError:
        raise GlanceError(f"the chat template recurses without end: {plain}") from None
    except Exception as exc:  # jinja2's TemplateError family, SecurityError, and whatever a template's code raises
        raise GlanceError(f"the chat template fails ({type(exc).__name__}: {reason(exc, 160)}): {plain}") from None
    if not isinstance(text, str) or not text.strip():
        raise GlanceError(
            f"the chat template rendered {'no text' if isinstance(text, str) else type(text).__name__}: {plain}"
        )
    given = sum(len(str(m.get("content", ""))) for m in messages)
    if len(text) > 2 * given + 100_000:  # markup around each message, never megabytes of its own
        raise GlanceError(f"the chat template made {len(text):,} characters of {given:,}: {plain}")
    return text


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
    text = render_template(tokenizer, history + [{"role": "user", "content": prompt}])
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


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
