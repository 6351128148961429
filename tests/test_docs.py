"""The docs stay true: every command the README shows parses as written, every file it links exists, and the code
keeps no dated measurements or process-wide inductor settings."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def shell_lines(markdown: str) -> list[str]:
    """Every command line of the markdown's bash blocks, continuation lines joined, comments dropped."""
    lines, block = [], re.findall(r"```bash\n(.*?)```", markdown, re.S)
    for text in block:
        text = text.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def inline_commands(markdown: str) -> list[str]:
    """The `python main.py ...` commands quoted inline (the benchmark tables' commands), joined across lines."""
    flat = re.sub(r"\s*\n\s*", " ", markdown)
    return re.findall(r"`(python main\.py [^`]+)`", flat)


def test_every_cli_command_in_the_readme_parses_as_written():
    from engine.cli import build_parser

    text = README.read_text()
    commands = [c for line in shell_lines(text) for c in line.split(" && ")] + inline_commands(text)
    cli = [shlex.split(c)[2:] for c in commands if c.startswith("python main.py ")]  # bare `python main.py`: the app
    assert len(cli) >= 12, cli  # the dozen examples, the install and the tables' commands
    parser = build_parser()
    for argv in cli:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse's way of refusing an argument
            pytest.fail(f"README command does not parse: python main.py {shlex.join(argv)} ({exc})")


def test_the_readme_opens_with_the_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in shell_lines(README.read_text())[:2]


def test_the_results_command_regenerates_every_readme_table(capsys):
    from engine.bench.publish import SETTINGS, command, main
    from engine.cli import build_parser

    assert main(["--dry-run"]) == 0
    printed = capsys.readouterr().out
    readme = README.read_text()
    for setting in SETTINGS:
        build_parser().parse_args(command(setting))
        assert f"docs/results/{setting}" in printed
        assert (ROOT / "docs" / "results" / setting / "results.json").is_file(), setting
        shown = " ".join(["python main.py", *SETTINGS[setting]])
        assert shown in " ".join(inline_commands(readme)), shown  # the README quotes the command of each table


def test_every_file_the_docs_link_exists():
    for doc in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name} links {target}, which does not exist"


def test_the_docs_stay_short():
    limits = {README: 200, ROOT / "docs" / "ARCHITECTURE.md": 250, ROOT / "docs" / "BENCHMARKS.md": 200}
    for doc, limit in limits.items():
        assert len(doc.read_text().splitlines()) < limit, doc.name


def test_code_comments_carry_no_dated_measurements_or_evidence_paths():
    pattern = re.compile(r"20\d\d-\d\d-\d\d|docs/bench")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("engine", "app")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_nothing_assigns_inductor_settings_process_wide():
    """Compiled graphs carry their own inductor options (engine.runtime.forward.inductor_options): an assignment to
    torch._inductor.config would change how every later graph compiles, another test's included."""
    pattern = re.compile(r"_inductor\.config\.[a-z_.]* *=[^=]")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("engine", "app", "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and path.name != "test_docs.py"
    ]
    assert not found, found
