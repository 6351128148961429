"""The engine's one error type: a message a user can act on, printed by the CLI as one line (exit code 2)."""


class GlanceError(Exception):
    """Bad input or an unsupported model: the message names the problem and what to do."""


class Cancelled(GlanceError):
    """The user stopped a load or a compile: it passes through every fallback (a compile that is cancelled does not
    turn into "running it eager")."""


def one_line(text: str) -> str:
    """`text` on one line: line breaks and other control characters (a user's value may hold them) shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def reason(exc: BaseException, limit: int | None = None) -> str:
    """The first line of a library exception's message (its type's name when it has none), for a one-line error."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
