"""The engine's facade: loading reports its progress and can be cancelled between the target and its parts."""

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


def test_a_load_reports_each_model_and_part_before_it_starts(model_folders):
    seen = []
    Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["ar", "vanilla"],
                 progress=lambda done, total, what: seen.append((done, total, what)))  # fmt: skip
    assert seen == [(0, 2, "loading the target target"), (1, 2, "loading draft")]
    seen.clear()
    Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["ar"],
                 progress=lambda *a: seen.append(a))  # fmt: skip
    assert seen == [(0, 1, "loading the target target")]  # a part no chosen method needs is not counted
