"""The layers hold: the engine imports no Qt and has no import cycles; every registered drafter is offered by the
CLI and the app from its spec alone; the session log's header names every loaded part."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from engine.registry import DRAFTERS, knobs, parts

ROOT = Path(__file__).resolve().parent.parent
QT = ("PySide6", "pyqtgraph", "qasync", "shiboken6")


def engine_imports() -> dict[str, set[str]]:
    """engine module -> the engine modules it imports, anywhere in the file (lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "engine").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = deps
    return graph


def test_the_engine_imports_no_qt():
    for module, deps in engine_imports().items():
        assert not {d for d in deps if d.split(".")[0] in QT}, module


def test_the_engine_has_no_import_cycles():
    graph = engine_imports()
    edges = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    edges = {m: {d for d in ds if not (m.startswith(d + ".") and d == "engine")} for m, ds in edges.items()}
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m) :] + [m]))
        if m in done:
            return
        for d in sorted(edges[m]):
            visit(d, stack + [m])
        done.add(m)

    for m in sorted(edges):
        visit(m, [])


def test_every_drafter_option_has_a_cli_flag_and_an_app_knob(qtbot):
    from app.controls import ModelPanel, SettingsPanel
    from engine.cli import build_parser

    help_text = {cmd: build_parser()._subparsers._group_actions[0].choices[cmd].format_help() for cmd in ("generate",)}
    gen, models = SettingsPanel(), ModelPanel()
    qtbot.addWidget(gen)
    qtbot.addWidget(models)
    for _, k in knobs():
        assert k.flag in help_text["generate"], k.flag
        assert k.name in gen.knobs.widgets, k.name
    for part in parts():
        assert f"--{part.key}" in help_text["generate"] and part.key in models.parts
    assert set(gen.methods) == {s.name for s in DRAFTERS}


def test_option_names_and_flags_are_unique_and_defaults_pass_their_own_checks():
    names = [k.name for _, k in knobs()]
    assert len(names) == len(set(names))
    for _, k in knobs():
        assert k.check(k.default) == k.default, k.name


@pytest.mark.slow
def test_the_cli_log_header_names_the_loaded_heads(tmp_path, capsys):
    from engine.cli import main

    log = tmp_path / "medusa.jsonl"
    argv = ["generate", "--method", "medusa", "--prompt", "def add(a, b):", "--max-new-tokens", "4", "--log", str(log)]
    assert main(argv) == 0
    header = json.loads(log.read_text().splitlines()[0])
    assert header["models"]["medusa"]["medusa_num_heads"] >= 1, header["models"]
    assert header["settings"]["prompt"] == "def add(a, b):" and header["settings"]["methods"] == ["medusa"]
    assert header["settings"]["drafters"]["medusa_tree"] == "cpu_24"
