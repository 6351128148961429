"""Random values at every flag of `generate` and `bench` (Hypothesis): the CLI ends with exit 0, or exit 2 and one
line on stderr, never a traceback. GLANCE_FUZZ_EXAMPLES sets how many argument sets each test tries (default 25)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli import build_parser, main

EXAMPLES = int(os.environ.get("GLANCE_FUZZ_EXAMPLES", "25"))
NEVER = {"--help", "-h", "--allow-download", "--trust-remote-code", "--target", "--out", "--log"}  # no network
VALUES = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.integers(min_value=-3, max_value=300).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        [
            "",
            " ",
            "null",
            "[]",
            "[[0]]",
            "[0,1]",
            '[["a"]]',
            "{}",
            "nan",
            "-0",
            "1e400",
            "abc",
            "\u00e9\x00",
            "cuda",
            "mps",
            "float16",
            "bfloat16",
            "dynamic",
            "static",
            "typical",
            "ar,vanilla",
            "nope,ar",
            "/nonexistent/folder",
            "README.md",
            "1,2,x",
        ]
    ),  # fmt: skip
    st.text(max_size=12),
)


def flags(command: str) -> list[tuple[str, bool]]:
    """(option, takes a value) for every option of a subcommand."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    out = []
    for action in sub._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt not in NEVER:
                out.append((opt, action.nargs != 0))
    return out


def argv_sets(command: str):
    options = flags(command)
    return st.lists(st.tuples(st.sampled_from(options), VALUES), max_size=4)


def check(capsys, argv: list[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err, (argv, out.err[-2000:])
    assert code in (0, 2), (argv, code, out.err[-2000:])
    if code == 2:
        lines = [  # the message, without warnings and without a progress bar that ran before the error
            line
            for line in out.err.replace("\r", "\n").splitlines()
            if line.strip() and not line.startswith("glance: warning") and not line.startswith("bench:")
        ]
        assert len(lines) == 1 and lines[0].startswith("glance"), (argv, out.err[-2000:])


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(chosen=argv_sets("generate"))
def test_generate_never_tracebacks(model_folders, tmp_path_factory, capsys, chosen):
    argv = ["generate", "--target", str(model_folders["target"]), "--prompt", "def f(", "--max-new-tokens", "4"]
    argv += ["--log", str(tmp_path_factory.mktemp("log") / "s.jsonl")]
    for (opt, takes_value), value in chosen:
        argv += [opt, value] if takes_value else [opt]
    check(capsys, [*argv, "--compile", "off"])  # last wins: a fuzzed valid --compile value parses, none compiles


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(chosen=argv_sets("bench"))
def test_bench_never_tracebacks(model_folders, tmp_path_factory, capsys, chosen):
    argv = ["bench", "--target", str(model_folders["target"]), "--methods", "ar", "--limit", "1"]
    argv += ["--max-new-tokens", "2", "--out", str(tmp_path_factory.mktemp("bench"))]
    for (opt, takes_value), value in chosen:
        argv += [opt, bounded(opt, value)] if takes_value else [opt]
    check(capsys, [*argv, "--compile", "off"])  # compiling once per example would take the suite's whole budget


# Options whose valid values scale a benchmark's work: a fuzzed `--limit 250 --max-new-tokens 300` ran the whole
# suite eager for over ten minutes. Their valid large values are cut to a small one; zero, negatives and anything
# that is not an integer still reach the parser and the checks after it.
WORK = {"--limit": 2, "--max-new-tokens": 3, "--repeats": 2, "--batch-sizes": 2}


def bounded(opt: str, value: str) -> str:
    """`value`, or a small stand-in where it is a large valid amount of work for `opt` (each of a comma-separated
    list of batch sizes on its own)."""
    if opt not in WORK:
        return value
    parts = value.split(",") if opt == "--batch-sizes" else [value]
    out = []
    for part in parts:
        try:
            out.append(str(WORK[opt]) if int(part) > WORK[opt] else part)
        except ValueError:
            out.append(part)
    return ",".join(out)


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_a_vanishing_temperature_is_refused_in_one_line(model_folders, tmp_path, capsys, command):
    """Found by the fuzz test: --temperature 2.4e-258 overflowed the logits to inf and ended in a RuntimeError."""
    argv = [command, "--target", str(model_folders["target"]), "--temperature", "2.419185832818488e-258"]
    argv += (
        ["--prompt", "def f("] if command == "generate" else ["--methods", "ar", "--limit", "1", "--out", str(tmp_path)]
    )
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "temperature must be 0 (greedy) or between 0.001 and 1000" in err and "Traceback" not in err
