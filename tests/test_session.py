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


def test_auto_dtype_is_bfloat16_only_where_the_cpu_multiplies_it_in_hardware(monkeypatch):
    """On a CPU without bfloat16 matrix instructions (AVX2 only) bfloat16 is emulated and runs slower than float32,
    so auto picks float32 there; with AVX512-BF16, AMX or Arm's BF16 it picks bfloat16."""
    import torch

    from engine.models import loading as models
    from engine.runtime.machine import native_bfloat16

    assert native_bfloat16(["fpu", "avx2", "avx512f", "avx512_bf16"])
    assert native_bfloat16(["fpu", "amx_bf16", "amx_tile"])
    assert native_bfloat16(["fp", "asimd", "bf16"])  # Arm's Features line
    assert not native_bfloat16(["fpu", "avx2", "fma", "avx512f"])
    assert not native_bfloat16([])  # no /proc/cpuinfo (macOS): float32, which is never slower than emulation
    cpu = torch.device("cpu")
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(models, "native_bfloat16", lambda native=native: native)
        assert models.resolve_dtype("auto", cpu) == want
        assert models.resolve_dtype("bfloat16", cpu) == torch.bfloat16  # asked for by name: always what was asked


@pytest.mark.slow
def test_a_compile_is_cancelled_between_its_warm_up_shapes(model_folders):
    """Closing the window while compiling: the load stops after the graph being compiled, not after every model (a
    whole compile took minutes on a 2-core AVX2 CPU), and the target is left eager, not half compiled."""
    import engine.runtime.forward as forward
    from engine.errors import Cancelled

    seen = []
    asked_after_first_shape = lambda: any("for one token" in what for what in seen)  # noqa: E731
    with pytest.raises(Cancelled, match="loading cancelled"):
        Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["ar", "vanilla"],
                     compile=True, cancel=asked_after_first_shape,
                     progress=lambda done, total, what: seen.append(what))  # fmt: skip
    assert any("for one token" in what for what in seen)
    assert not any("several tokens" in what or what.startswith("compiling the draft") for what in seen), seen
    assert not forward._REGISTRY  # compile_models forgot earlier graphs; the cancelled target was never registered


def test_a_load_times_the_forwards_a_run_sizes_its_drafts_from_so_the_first_race_starts_at_once(
    model_folders, monkeypatch
):
    """`time_forwards`: the load times the target's forwards that the cost-aware budget and lookahead's window
    read before a run (they took 0.4-1.4 s of a session's first run); a race after it times nothing."""
    import engine.runtime.forward_timing as timing
    from engine.session import RaceSettings

    seen = []
    methods = ["ar", "vanilla", "lookahead"]
    session = Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, methods,
                           dtype="float32", time_forwards=True,
                           progress=lambda done, total, what: seen.append((done, total, what)))  # fmt: skip
    assert seen[-1] == (2, 3, "timing the target's forwards (once per session)")
    assert timing._MEMO[session.target.model]  # what the run will ask for, measured

    def timed_again(*args, **kwargs):
        raise AssertionError("a run timed the target's forwards after a load that timed them")

    monkeypatch.setattr(timing, "batch_forward_costs", timed_again)
    ids = session.encode("def add(a, b):")
    events = list(session.race(ids, RaceSettings(methods, max_new_tokens=8)))
    assert sum(type(e).__name__ == "RunSummary" for _, e in events) == 3


def test_closing_the_window_while_the_load_times_forwards_stops_it_at_once(model_folders, monkeypatch):
    """The timing step stops between forwards when cancelled (about 14 s on SmolLM2-135M, eager) and keeps nothing."""
    import engine.runtime.forward_timing as timing
    from engine.errors import Cancelled

    timed = []
    real = timing.time_width
    monkeypatch.setattr(timing, "time_width", lambda *a, **k: timed.append(1) or real(*a, **k))
    seen = []
    closed = lambda: any("timing" in what for what in seen)  # noqa: E731
    with pytest.raises(Cancelled, match="loading cancelled"):
        Session.load(str(model_folders["target"]), {"draft": str(model_folders["copy"])}, ["ar", "lookahead"],
                     dtype="float32", time_forwards=True, cancel=closed,
                     progress=lambda done, total, what: seen.append(what))  # fmt: skip
    assert timed == []


def test_compiling_a_session_compiles_each_loaded_part_as_its_spec_declares(monkeypatch):
    """Session.compile_models names no method: the target compiles, then every loaded part through its PartSpec's
    `compile` (the draft model's forward, the heads' drafting steps and read-out), in registry order, with progress.
    The compiles themselves are stood in for here: each is tested for real in test_compiled.py."""
    import engine.drafters.dflash as dflash
    import engine.drafters.eagle as eagle
    import engine.drafters.medusa as medusa
    import engine.drafters.vanilla as vanilla
    import engine.session as session_module
    from engine.runtime.forward import CompileReport

    compiled = []

    def stand_in(part, name, *args):
        compiled.append(name)
        return CompileReport(name, True, 0.0)

    for module, name in ((session_module, "compile_model"), (vanilla, "compile_model"), (eagle, "compile_head")):
        monkeypatch.setattr(module, name, stand_in)
    monkeypatch.setattr(medusa, "compile_readout", lambda heads, k, name: stand_in(heads, name))
    monkeypatch.setattr(dflash, "compile_block", lambda head, progress: stand_in(head, "the DFlash draft"))
    session = Session.load()  # the bundled target and every part
    seen = []
    reports = session.compile_models(lambda done, total, what: seen.append(what))
    names = ["the target", "the draft model", "the Medusa heads", "the EAGLE head", "the EAGLE-3 head"]
    names += ["the DFlash draft", "the MTP head"]
    assert compiled == names and [r.name for r in reports] == names
    assert "compiling the EAGLE-3 head's drafting step (once per session)" in seen
    assert "compiling the Medusa heads' read-out (once per session)" in seen
