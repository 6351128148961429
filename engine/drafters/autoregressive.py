"""Plain autoregressive decoding: a drafter that proposes nothing, so each step emits the target's own token."""

from engine.drafters.base import Drafter
from engine.drafters.spec import BuildContext, DrafterSpec


class AutoregressiveDrafter(Drafter):
    name = "ar"


def build(ctx: BuildContext) -> AutoregressiveDrafter:
    return AutoregressiveDrafter()


SPEC = DrafterSpec(
    name="ar",
    reference="hf_generate",
    label="plain decoding",
    color="#9e9e9e",
    summary="nothing: plain autoregressive decoding, the baseline",
    build=build,
)
