"""Session logs: a round trip keeps every field; a file cut mid-line reads up to its last complete line."""

import json

import pytest

from engine.decoder import Decoder
from engine.errors import GlanceError
from engine.session_log import SessionLogWriter, read_session_log
from tests.conftest import tiny_model


def _write_run(path, max_new=8):
    dec = Decoder(tiny_model("llama"), max_new_tokens=max_new)
    items = list(dec.stream([1, 2, 3]))
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
