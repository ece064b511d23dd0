"""Checks shared by the fault-injection tests: a directory snapshot to compare before and
after a refusal, "exit 2 with one stderr line naming the fix, no traceback", the real
command line as a subprocess, a small tmpfs and the hidden leftovers of a write."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sinkscope.cli import main


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under ``root`` (``root`` included): its mode and, for files, a content hash."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else ""
        found[str(path.relative_to(root))] = (info.st_mode, digest)
    return found


def one_line_exit_2(capsys, argv: list[str], fix: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own exit, as the console script would see it
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert fix in err, err


def audit_argv(model_dir: Path | str, prompts: Path | str, out: Path, *extra: str) -> list[str]:
    return [
        "audit",
        str(model_dir),
        "--prompts",
        str(prompts),
        "--max-len",
        "16",
        "--examples",
        "0",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def cli_env() -> dict[str, str]:
    """The environment for a ``sinkscope`` subprocess that imports the very code this test
    process imported (the test's own ``sys.path``, which a symlink farm or an installed
    checkout may have set up), offline."""
    import os
    import sys

    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def cli_command(argv: list[str]) -> list[str]:
    """The real command line: ``python -P -m sinkscope ARGV`` (``-P``: never the current directory's code)."""
    import sys

    return [sys.executable, "-P", "-m", "sinkscope", *argv]


def run_cli(argv: list[str], timeout: float = 300):
    """Run ``sinkscope ARGV`` in a subprocess to its end; the completed process (text output)."""
    import subprocess

    return subprocess.run(cli_command(argv), env=cli_env(), capture_output=True, text=True, timeout=timeout)


@contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -t tmpfs -o size=``) at ``mount_point`` (a real full
    disk); skipped, saying why, where this user cannot mount one."""
    import subprocess

    import pytest

    mount_point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the injected ENOSPC tests still run")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def leftovers(directory: Path) -> list[str]:
    """Hidden entries (staging directories, swap journals, temporaries, locks) anywhere
    under ``directory``: none may outlive the command that made them."""
    return sorted(str(path) for path in directory.rglob(".*"))
