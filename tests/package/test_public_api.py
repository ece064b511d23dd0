"""The top-level ``sinkscope`` package: its version, its re-exported API, and that importing
it stays cheap (the command line checks its arguments before torch loads)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import sinkscope
from sinkscope.cli import main


def test_version_matches_the_installed_distribution(capsys):
    assert sinkscope.__version__ == metadata.version("sinkscope")
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"sinkscope {sinkscope.__version__}"


def _type_checking_imports() -> dict[str, str]:
    """{name: module} for the imports under ``if TYPE_CHECKING:`` in sinkscope/__init__.py:
    what a type checker or an IDE sees as the package's API."""
    tree = ast.parse(Path(sinkscope.__file__).read_text())
    guarded = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert len(guarded) == 1
    return {
        alias.asname or alias.name: str(node.module)
        for node in guarded[0].body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_type_checkers_see_exactly_the_names_that_resolve_at_run_time():
    assert _type_checking_imports() == sinkscope._EXPORTS
    assert sinkscope.__all__ == ["__version__", *sinkscope._EXPORTS]


@pytest.mark.parametrize("name", sorted(sinkscope._EXPORTS))
def test_every_exported_name_is_the_object_its_module_defines(name):
    module = importlib.import_module(sinkscope._EXPORTS[name])
    value = getattr(sinkscope, name)
    assert value is getattr(module, name)
    assert value.__module__ == module.__name__  # exported from where it is defined, not a re-export


def test_report_is_the_function_even_after_its_module_is_imported():
    import sinkscope.reporting

    assert sinkscope.report is sinkscope.reporting.report and callable(sinkscope.report)


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'auditt'"):
        sinkscope.auditt  # noqa: B018


def test_importing_the_package_does_not_load_torch():
    code = "import sys, sinkscope; assert sinkscope.__version__; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
