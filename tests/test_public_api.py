"""The top-level ``sinkscope`` package: its version, its re-exported API, and that importing
it stays cheap (the command line checks its arguments before torch loads)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

import sinkscope
from sinkscope.cli import main


def test_version_matches_the_installed_distribution(capsys):
    assert sinkscope.__version__ == metadata.version("sinkscope")
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"sinkscope {sinkscope.__version__}"


@pytest.mark.parametrize("name", sinkscope.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(sinkscope, name) is not None
    assert name in dir(sinkscope)


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
