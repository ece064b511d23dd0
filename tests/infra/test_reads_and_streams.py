"""Hostile-pass findings on reading and writing at the edges (issue 22): a result file that
is huge or not a regular file is refused before it is read, an empty ``--out`` is not the
current directory, a closed stdout is not a traceback, and the codec's entry points name
a swapped argument."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.infra.atomic_io import read_json
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"


@pytest.fixture
def audit_copy(tmp_path) -> Path:
    target = tmp_path / "audit"
    shutil.copytree(FIXTURES / "audit-gpt2", target)
    return target


def test_a_huge_sparse_result_file_is_refused_before_it_is_read(capsys, audit_copy):
    huge = audit_copy / "audit.json"
    os.truncate(huge, 20 * 2**30)  # sparse: costs no disk; reading it would take 20 GB

    def state() -> tuple:  # not snapshot(): hashing the 20 GB would be the very read refused here
        return sorted(p.name for p in audit_copy.iterdir()), huge.stat().st_size, huge.stat().st_mtime_ns

    before = state()
    one_line_exit_2(capsys, ["report", str(audit_copy), "--no-progress"], "larger than any sinkscope result")
    assert state() == before


def test_a_result_file_that_is_a_fifo_or_a_directory_is_named_as_such(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would block for ever
    with pytest.raises(InputError, match="not a regular file"):
        read_json(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        read_json(tmp_path / "dir.json")


@pytest.mark.parametrize("command", [["toy", "train", "--max-steps", "5"], ["toy", "sweep"], ["compare", "a", "b"]])
def test_an_empty_out_is_refused_not_taken_as_the_current_directory(capsys, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, [*command, "--out", ""], "--out: is empty; pass the directory to write")
    assert snapshot(tmp_path) == before


def test_a_closed_stdout_is_not_a_traceback(audit_copy, tmp_path):
    """``sinkscope report DIR >&- <&-``: the report is written, nothing on stderr, exit 0."""
    command = [sys.executable, "-m", "sinkscope.cli", "report", str(audit_copy), "--out", str(tmp_path / "r")]
    done = subprocess.run(
        ["bash", "-c", 'exec "$@" >&- <&-', "bash", *command],
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "r" / "report.html").is_file()


def test_an_ascii_terminal_gets_escapes_not_a_traceback(audit_copy, tmp_path):
    """``PYTHONIOENCODING=ascii sinkscope report DIR``: the findings hold ε and Sink₁, which
    raised UnicodeEncodeError after the report was written; they now print escaped."""
    command = [sys.executable, "-m", "sinkscope.cli", "report", str(audit_copy), "--out", str(tmp_path / "r")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "\\u" in done.stdout  # a character ASCII lacks, escaped
    assert (tmp_path / "r" / "report.html").is_file()


def test_the_codecs_swapped_arguments_are_named(tmp_path):
    with pytest.raises(InputError, match="result must be a sinkscope result, got a object") as caught:
        write_result(tmp_path / "x.json", object())  # type: ignore[arg-type]
    assert caught.value.field == "result"
    with pytest.raises(InputError) as caught:
        write_result(object(), tmp_path / "x.json")  # type: ignore[arg-type]
    assert caught.value.field == "path"
    with pytest.raises(InputError) as caught:
        read_result(tmp_path / "x.json", dict)
    assert caught.value.field == "cls"
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(InputError, match="does not exist"):
        read_result(tmp_path / "x.json", AuditResult)
