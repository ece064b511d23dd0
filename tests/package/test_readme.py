"""The README's two commands stay true: CI runs the README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = dict(re.findall(r"<!-- (main-job|tests) -->\s*```(?:bash|sh)?\n(.+?)\n```", text, re.S))
    assert set(commands) == {"main-job", "tests"}, "README must mark its two commands"
    return commands


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert _readme_commands()["tests"].strip() in ci


def test_setup_installs_cpu_torch_before_transformer_lens():
    for command in _readme_commands().values():
        assert command.index("torch==2.13.0") < command.index("pip install -e")


def test_readme_is_at_most_about_300_lines():
    """A README for users: measurements and design history live in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_main_job_is_one_sinkscope_command_after_the_installs():
    """The main job's work is one named-steps subcommand, so a failure names its step."""
    steps = _readme_commands()["main-job"].split(" && ")
    assert all(step.startswith("pip install ") for step in steps[:-1])
    assert steps[-1] == "sinkscope demo"


def test_the_readme_cites_the_paper():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for part in (
        "Ran-Milo (2026)",
        "Attention Sinks Are Provably Necessary in Softmax",
        "https://arxiv.org/abs/2603.11487",
    ):
        assert part in text


def test_every_relative_link_of_the_readme_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    local = [target for target in targets if "://" not in target]
    assert len(local) >= 10
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README links to missing files: {missing}"


def readme_sinkscope_commands() -> list[str]:
    """Every ``sinkscope ...`` command of the README's shell blocks (continued lines joined,
    ``&&`` chains split), the two marked commands included."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"^```(?:bash|sh)\n(.+?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split(" && "):
                part = part.split(" # ")[0].strip()
                if part.startswith("sinkscope "):
                    commands.append(part)
    return commands


def test_every_command_the_readme_shows_parses():
    """The README never names a command, flag or value the command line refuses."""
    import shlex

    from sinkscope.cli.parser import build_parser

    commands = readme_sinkscope_commands()
    assert len(commands) >= 10
    refused = []
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as exit:
            refused.append(f"{command}  (exit {exit.code})")
    assert not refused, "README commands the parser refuses:\n" + "\n".join(refused)
