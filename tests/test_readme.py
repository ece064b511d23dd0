"""The README's two commands stay true: CI runs the README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
