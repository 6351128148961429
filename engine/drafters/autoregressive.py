"""Plain autoregressive decoding: a drafter that proposes nothing, so each step emits the target's own token."""

from engine.drafters.base import Drafter


class AutoregressiveDrafter(Drafter):
    name = "ar"
