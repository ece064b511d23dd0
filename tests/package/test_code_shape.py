"""The library stays readable in pieces: no function over 60 lines (the command line
included), no module much over 400 (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("sinkscope", "interp", "reports", "execution", "probes", "toy", "pretrained_analysis")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 420  # "about 400": a module a screen or two past it is not split for its own sake
SOURCES = sorted(path for folder in PACKAGE_FOLDERS for path in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_functions_and_modules_stay_short(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} has {len(text.splitlines())} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long
