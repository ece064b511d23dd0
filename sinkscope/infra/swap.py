"""Replacing a directory whole, so that a kill at any moment leaves a result a later run can
restore.

A writer first records itself in a journal beside the target (``.NAME.TOKEN.swap``: pid,
process start time, boot id, host), then builds the new result in ``.NAME.TOKEN.<rand>.tmp``.
The swap is one ``renameat2(RENAME_EXCHANGE)`` where Linux and the filesystem have it
(there is never a moment without a result at NAME); elsewhere it is two renames, the old
result moving to ``.NAME.TOKEN.old`` first. ``recover_swaps(target)`` (run by every later
command on that output) finds journals whose writer is dead: a NAME left missing gets its
old result back, and the journal's own temporaries are removed. Anything without a journal
of ours, even when named like one of our temporaries, is never touched; neither is the
journal of a writer that is still alive.

Staging names are shortened so that a legal NAME (up to NAME_MAX bytes) never makes an
illegal staging name.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME_MAX = 255
STAGING_ROOM = 40  # bytes a staging name adds around NAME: dots, two random parts, suffix
AT_FDCWD = -100
RENAME_EXCHANGE = 2
RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276}
JOURNAL_SUFFIX = ".swap"


def short_name(name: str) -> str:
    """``name`` cut (by bytes, on a character boundary) so a staging name around it fits NAME_MAX."""
    encoded = os.fsencode(name)
    room = NAME_MAX - STAGING_ROOM
    if len(encoded) <= room:
        return name
    return encoded[:room].decode("utf-8", errors="ignore") or "out"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _writer_record(target: str) -> dict:
    pid = os.getpid()
    return {"target": target, "pid": pid, "start": _start_time(pid), "boot": _boot_id(), "host": socket.gethostname()}


def _writer_alive(record: dict) -> bool:
    """Whether the journal's writer may still run (a writer on another host cannot be told: alive)."""
    if record.get("host") != socket.gethostname():
        return True
    if record.get("boot") != _boot_id():
        return False  # the machine rebooted since
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True  # not a record we wrote: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return _start_time(pid) == record.get("start")


@dataclass(frozen=True)
class Staging:
    """One writer's names beside ``target``: its journal, its build directory, its trash."""

    target: Path
    journal: Path

    @property
    def stem(self) -> str:  # ".NAME.TOKEN"
        return self.journal.name[: -len(JOURNAL_SUFFIX)]

    @property
    def old(self) -> Path:
        return self.target.parent / f"{self.stem}.old"

    def temporaries(self) -> list[Path]:
        """This writer's build directories (normally one), found by its unique stem."""
        prefix = f"{self.stem}."
        try:
            names = os.listdir(self.target.parent)
        except OSError:
            return []
        return [self.target.parent / n for n in names if n.startswith(prefix) and n.endswith(".tmp")]

    def remove_leftovers(self) -> None:
        """Remove this writer's temporaries and trash, the journal last (so a kill while this
        runs leaves the journal for the next command to finish the job)."""
        for path in [*self.temporaries(), self.old]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
        self.journal.unlink(missing_ok=True)


def begin_staging(target: Path) -> tuple[Staging, Path]:
    """A journal and an empty build directory beside ``target`` (whose parent exists); the
    caller removes them with ``Staging.remove_leftovers`` however its work ends. OSError
    from making them propagates, nothing left behind."""
    prefix = f".{short_name(target.name)}."
    descriptor, journal_name = tempfile.mkstemp(prefix=prefix, suffix=JOURNAL_SUFFIX, dir=target.parent)
    staging = Staging(target, Path(journal_name))
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as journal:
            journal.write(json.dumps(_writer_record(target.name)))
        build = Path(tempfile.mkdtemp(prefix=f"{staging.stem}.", suffix=".tmp", dir=target.parent))
    except BaseException:
        staging.remove_leftovers()
        raise
    return staging, build


def _renameat2() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    return getattr(libc, "renameat2", None)


def exchange(first: Path, second: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the OS or the filesystem has no such call (then nothing was changed)."""
    if platform.system() != "Linux":
        return False
    args = (AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE)
    function = _renameat2()
    if function is not None:
        result = function(ctypes.c_int(args[0]), args[1], ctypes.c_int(args[2]), args[3], ctypes.c_uint(args[4]))
    else:  # a libc older than glibc 2.28: the raw system call
        number = RENAMEAT2_SYSCALL.get(platform.machine())
        if number is None:
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.syscall(number, *(ctypes.c_int(a) if isinstance(a, int) else a for a in args))
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def swap_in(staging: Staging, build: Path) -> None:
    """Put the complete ``build`` at ``staging.target`` in place of the result there; the old
    result ends up in ``build`` (exchanged) or ``staging.old`` (two renames), both removed
    with the staging."""
    if exchange(build, staging.target):
        return
    os.rename(staging.target, staging.old)  # a kill right after: recover_swaps restores it
    try:
        os.rename(build, staging.target)
    except BaseException:
        os.rename(staging.old, staging.target)  # put the old result back before anything else
        raise


def _journals(target: Path) -> list[Staging]:
    prefix = f".{short_name(target.name)}."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    found = [n for n in names if n.startswith(prefix) and n.endswith(JOURNAL_SUFFIX)]
    return [Staging(target, target.parent / n) for n in sorted(found)]


def _record(journal: Path) -> dict | None:
    try:
        record = json.loads(journal.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def recover_swaps(target: Path) -> None:
    """Finish what a dead writer left beside ``target``: restore its old result when ``target``
    is missing, then remove its temporaries and journal. Live writers' journals, and names
    without a journal of ours, are left alone."""
    for staging in _journals(target):
        record = _record(staging.journal)
        if record is None or record.get("target") != target.name or _writer_alive(record):
            continue
        if not os.path.lexists(target) and staging.old.is_dir():
            try:
                os.rename(staging.old, target)
            except OSError:  # another command restored it first, or this one may not: leave it all
                continue
        staging.remove_leftovers()
