"""Copying audit directories into a comparison: each is copied first and read from the copy,
so the comparison always describes the audits it ships, even when an ``audit --overwrite``
replaces one of them meanwhile (then the copy is refused, in one line)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from sinkscope.infra.errors import InputError

SKIPPED = shutil.ignore_patterns("report*", ".*")  # its report and hidden files stay behind
KINDS = {
    stat.S_ISLNK: "a symbolic link",
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISSOCK: "a socket",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
}


def _kind(mode: int) -> str | None:
    """What a non-regular, non-directory entry is; None for a file or a directory."""
    return next((name for test, name in KINDS.items() if test(mode)), None)


def refuse_special_entries(directory: Path) -> None:
    """One line for the first entry of ``directory`` that the copy would take (a report and
    hidden files are left behind) and that is not a regular file or a folder: a pipe or a
    device would hang or fail the copy, a link would copy what lies outside the audit."""
    for root, folders, files in os.walk(directory):
        ignored = SKIPPED(root, [*folders, *files])
        folders[:] = [name for name in folders if name not in ignored]
        for name in [*folders, *files]:
            if name in ignored:
                continue
            path = Path(root) / name
            kind = _kind(path.lstat().st_mode)
            if kind is not None:
                raise InputError(
                    f"{path} is {kind}, not a file an audit writes; remove it from the audit directory",
                    field="directories",
                )


def _identity(directory: Path) -> tuple[int, int]:
    info = directory.stat()
    return info.st_dev, info.st_ino


def snapshot_audits(sources: Sequence[Path], into: Path, audit_file: str) -> list[Path]:
    """Copy each audit directory into ``into`` (hidden names ``.copy-K``, renamed by the
    caller) and return the copies. A source replaced while it was copied (another run
    swapped a new audit in) is refused: the copy could mix two audits."""
    copies = []
    for number, source in enumerate(sources):
        refuse_special_entries(source)
        before, first_read = _identity(source), (source / audit_file).read_bytes()
        copy = into / f".copy-{number}"
        shutil.copytree(source, copy, symlinks=True, ignore=SKIPPED)
        if _identity(source) != before or (copy / audit_file).read_bytes() != first_read:
            raise InputError(
                f"{source} was replaced while it was being copied (another audit wrote it); run compare again",
                field="directories",
            )
        copies.append(copy)
    return copies
