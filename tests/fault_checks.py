"""Checks shared by the fault-injection tests: a directory snapshot to compare before and
after a refusal, and "exit 2 with one stderr line naming the fix, no traceback"."""

from __future__ import annotations

import hashlib
import stat
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
