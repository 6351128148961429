"""The engine's facade: loading can be cancelled between the target and its parts."""

import pytest

from engine.errors import GlanceError
from engine.session import Session


def test_a_load_is_cancelled_between_the_target_and_its_parts(model_folders):
    calls = []

    def cancel_after_target() -> bool:
        calls.append(1)
        return True

    with pytest.raises(GlanceError, match="loading cancelled"):
        Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["ar", "vanilla"],
                     cancel=cancel_after_target)  # fmt: skip
    assert calls == [1]  # asked once, right after the target: the draft was never loaded
    loaded = Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["vanilla"],
                          cancel=lambda: False)  # fmt: skip
    assert loaded.available("vanilla")
