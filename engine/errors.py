"""The engine's one error type: a message a user can act on, printed by the CLI as one line (exit code 2)."""


class GlanceError(Exception):
    """Bad input or an unsupported model: the message names the problem and what to do."""
