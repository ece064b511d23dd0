"""The presentation layer sits below the producers of results: no module in reports/
imports a higher layer at runtime, and a display module names result types for typing
only (a result's ``_repr_html_`` imports its display lazily)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABOVE_REPORTS = ("sinkscope.execution", "sinkscope.probes", "sinkscope.toy", "sinkscope.pretrained_analysis")
DISPLAYS = {
    "probes/display.py": ("sinkscope.probes.probe", "sinkscope.probes.default_state", "sinkscope.probes.patching"),
    "probes/mechanism_display.py": ("sinkscope.probes.mechanism",),
    "toy/display.py": (
        "sinkscope.toy.evaluate",
        "sinkscope.toy.experiment",
        "sinkscope.toy.reproduce",
        "sinkscope.toy.sweep",
    ),
    "pretrained_analysis/display.py": ("sinkscope.pretrained_analysis.audit", "sinkscope.pretrained_analysis.compare"),
}


def runtime_imports(path: Path) -> set[str]:
    """Modules ``path`` imports when it loads: module-level imports outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_reports_imports_no_higher_layer():
    for path in sorted((ROOT / "reports").glob("*.py")):
        upward = [name for name in runtime_imports(path) if name.startswith(ABOVE_REPORTS)]
        assert upward == [], (path.name, upward)


def test_displays_import_result_types_for_typing_only():
    for display, result_modules in DISPLAYS.items():
        imported = runtime_imports(ROOT / display)
        assert not imported & set(result_modules), (display, imported & set(result_modules))
