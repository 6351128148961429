"""Session logs: a round trip keeps every field; a file cut mid-line reads up to its last complete line."""

import json

import pytest

from engine.decoding.loop import Decoder
from engine.errors import GlanceError
from engine.records.session_log import SessionLogWriter, read_session_log
from tests.conftest import tiny_model


def _write_run(path, max_new=8):
    dec = Decoder(tiny_model("llama"), max_new_tokens=max_new)
    items = list(dec.run([1, 2, 3]))
    with SessionLogWriter(path) as log:
        log.header({"target": {"name": "tiny"}}, "cpu", {"method": "ar"})
        for item in items:
            log.event(item)
    return items


def test_round_trip(tmp_path):
    path = tmp_path / "s.jsonl"
    items = _write_run(path)
    log = read_session_log(path)
    assert log.header["models"]["target"]["name"] == "tiny"
    assert "torch" in log.header["environment"]
    assert "cpu_features" in log.header["environment"]  # which matrix instructions the speeds were measured with
    assert [e.to_dict() for e in log.steps] == [e.to_dict() for e in items[:-1]]
    assert log.summaries[0].to_dict() == items[-1].to_dict()
    assert not log.truncated


def test_cut_mid_line_reads_complete_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    items = _write_run(path)
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    cut = b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2]  # header + 3 steps + half a step
    path.write_bytes(cut)
    log = read_session_log(path)
    assert log.truncated
    assert [e.to_dict() for e in log.steps] == [e.to_dict() for e in items[:3]]
    assert log.summaries == []


def test_failed_write_leaves_complete_lines(tmp_path, monkeypatch):
    path = tmp_path / "s.jsonl"
    writer = SessionLogWriter(path)
    writer.header({}, "cpu", {})
    real_write = writer._fh.write

    def disk_full(data):
        real_write(data[:10])  # a partial write, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer._fh, "write", disk_full)
    with pytest.raises(GlanceError, match="No space left"):
        writer._write({"type": "step", "x": 1})
    writer.close()
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and len(raw.splitlines()) == 1
    json.loads(raw)


def test_not_a_log(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"type": "step"}\n')
    with pytest.raises(GlanceError, match="not a Glance session log"):
        read_session_log(path)
    with pytest.raises(GlanceError, match="not found"):
        read_session_log(tmp_path / "missing.jsonl")


def test_bad_lines_are_skipped_and_named_never_raised(tmp_path):
    path = tmp_path / "s.jsonl"
    items = _write_run(path)
    lines = path.read_bytes().splitlines(keepends=True)
    step = json.loads(lines[2])
    mistyped = dict(step, new_tokens="many")
    unknown = dict(step, surprise=1)
    missing = {k: v for k, v in step.items() if k != "tokens"}
    bad = [b"{not json\n", b"[1, 2]\n", (json.dumps(mistyped) + "\n").encode(), (json.dumps(unknown) + "\n").encode()]
    bad += [(json.dumps(missing) + "\n").encode(), b'{"type": "weird"}\n']
    path.write_bytes(b"".join(lines[:2] + bad + lines[2:]))
    log = read_session_log(path)
    assert [e.to_dict() for e in log.steps] == [e.to_dict() for e in items[:-1]]  # every good line still read
    assert [n for n, _ in log.skipped] == [3, 4, 5, 6, 7, 8]
    reasons = [why for _, why in log.skipped]
    assert reasons[:2] == ["not JSON", "not a JSON object"]
    assert "new_tokens" in reasons[2] and "surprise" in reasons[3] and "tokens" in reasons[4]
    assert (
        "__init__" not in log.skipped_note() and "skipped 6 unreadable line(s): line 3 (not JSON)" in log.skipped_note()
    )
    path.write_bytes(b"[]\n")
    with pytest.raises(GlanceError, match="not a Glance session log"):
        read_session_log(path)


def test_a_full_disk_leaves_complete_lines_and_the_cli_goes_on(tmp_path, model_folders):
    """A real write failure (a file-size limit stands in for a full disk, in a child process): the log ends at its
    last complete line, the CLI says so in one line and still prints the generated text, exit 0."""
    import subprocess
    import sys
    import textwrap

    log = tmp_path / "s.jsonl"
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
        from engine.cli import main
        sys.exit(main(["generate", "--target", {str(model_folders["target"])!r}, "--prompt", "def add(",
                       "--max-new-tokens", "40", "--log", {str(log)!r}, "--dtype", "float32"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if "glance: warning" in line]
    assert len(warnings) == 1 and "generation continues without the log" in warnings[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout.strip()
    raw = log.read_bytes()
    assert 0 < len(raw) <= 6000 and raw.endswith(b"\n")
    assert all(json.loads(line) for line in raw.splitlines())  # complete lines only


def test_runs_appended_to_one_file_stay_separate(tmp_path):
    """Two commands with the same `--log` append two runs: they read back as two runs, the last by default."""
    from engine.records.session_log import copy_run, read_session_logs

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_run(first, max_new=5)
    _write_run(second, max_new=9)
    both = tmp_path / "both.jsonl"
    both.write_bytes(first.read_bytes() + second.read_bytes())
    runs = read_session_logs(both)
    assert [len(r.steps) for r in runs] == [5, 9] and [len(r.summaries) for r in runs] == [1, 1]
    assert len(read_session_log(both).steps) == 9 and len(read_session_log(both, 0).steps) == 5
    with pytest.raises(GlanceError, match="holds 2 run"):
        read_session_log(both, 2)
    copy_run(both, tmp_path / "one.jsonl", 0)
    assert (tmp_path / "one.jsonl").read_bytes() == first.read_bytes()


def test_reading_reports_progress_and_can_be_cancelled(tmp_path):
    from engine.records.session_log import read_session_logs

    path = tmp_path / "s.jsonl"
    _write_run(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "".join(lines[1:-1]) * 1000 + lines[-1])
    seen = []
    runs = read_session_logs(path, progress=lambda done, total: seen.append((done, total)))
    assert len(runs[0].steps) == 8 * 1000 and seen[-1] == (path.stat().st_size,) * 2 and len(seen) > 2
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    with pytest.raises(GlanceError, match="reading cancelled"):
        read_session_logs(path, cancel=lambda: True)


def test_top_tokens_can_stay_on_disk_and_come_back_on_demand(tmp_path):
    """A large log's memory is mostly the steps' top tokens: read without them, each comes back from its line."""
    from engine.records.session_log import read_session_logs, read_target_top

    path = tmp_path / "s.jsonl"
    _write_run(path)
    full = read_session_logs(path)[0]
    light = read_session_logs(path, keep_top=False)[0]
    assert all(e.target_top == [] for e in light.steps)
    assert light.offsets == full.offsets and len(light.offsets) == len(light.steps)
    for a, at in zip(full.steps, light.offsets):
        assert read_target_top(path, at) == a.target_top and a.target_top
    assert read_target_top(path, 0) == [] and read_target_top(tmp_path / "gone.jsonl", 0) == []  # the header; no file


def test_typed_notes_and_the_apps_text_round_trip_and_older_logs_still_read(tmp_path):
    """A step's notes, budget and the app's text survive a round trip; a log written before events were typed (the
    notes, the budget's cap and the app's text pieces in one free `extra` dict) reads into the same typed fields."""
    from engine.records.events import BudgetNote, DraftNotes
    from engine.records.session_log import StepText

    items = list(Decoder(tiny_model("llama"), max_new_tokens=4).run([1, 2, 3]))
    step = items[1]
    step.notes = DraftNotes(window=[[4, 5]], ngrams=[[3, 9]], pool_size=7, draft_ids=[2], target_in_draft_vocab=False)
    step.budget = BudgetNote(2, True)
    path = tmp_path / "typed.jsonl"
    with SessionLogWriter(path) as log:
        log.header({}, "cpu", {})
        log.event(items[0], StepText(["a"]))
        log.event(step, StepText(["b", "c"], ["x"]))
    back = read_session_log(path)
    assert back.steps[1].notes == step.notes and back.steps[1].budget == step.budget and back.steps[0].prefill
    assert back.texts == [StepText(["a"], []), StepText(["b", "c"], ["x"])]
    legacy = step.to_dict() | {"type": "step"}
    del legacy["notes"], legacy["budget"], legacy["prefill"]
    legacy["extra"] = {
        "window": [[4, 5]], "ngrams": [[3, 9]], "pool_size": 7, "draft_ids": [2], "target_token_in_draft_vocab": False,
        "depth_cap": 2, "narrow": True, "pieces": ["b", "c"], "rejected_pieces": ["x"], "log_offset": 99,
    }  # fmt: skip
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"type": "header"}) + "\n" + json.dumps(legacy) + "\n")
    read = read_session_log(old)
    assert not read.skipped and read.steps[0].notes == step.notes and read.steps[0].budget == step.budget
    assert read.texts == [StepText(["b", "c"], ["x"])] and read.offsets[0] > 0
