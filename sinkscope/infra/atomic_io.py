"""Atomic file output: every result file is written to a temporary sibling and renamed,
so an interrupted run never leaves a half-written file behind."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sinkscope.infra.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` if the block succeeds.

    The result gets the permissions of a file opened normally (0666 less the umask), not
    mkstemp's private 0600: results are meant to be read by others.
    """
    path = Path(path)
    fd, tmp_name = _temporary(tempfile.mkstemp, path)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        tmp.chmod(0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


class OutputError(InputError):
    """The output location cannot take the result (unwritable, a symlink, a mount point,
    or written by another run meanwhile); nothing existing was changed."""


def _temporary(make: Callable[..., Any], path: Path) -> Any:
    """``make`` (``tempfile.mkstemp`` or ``mkdtemp``) of a hidden temporary beside ``path``,
    its parent created first; an unwritable location is one ``OutputError``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return make(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise OutputError(
            f"cannot write in {path.parent} ({error.strerror}); choose a writable output location"
        ) from error


def inside(path: str | os.PathLike, directory: str | os.PathLike) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (symlinks resolved)."""
    path, directory = Path(path).resolve(), Path(directory).resolve()
    return path == directory or directory in path.parents


def holds_files(path: str | os.PathLike) -> bool:
    """Whether the directory ``path`` exists and has any entry; a ``path`` that exists and
    is not a directory is ``OutputError`` (it can hold no result)."""
    path = Path(path)
    _refuse_non_directory(path)
    return path.is_dir() and any(path.iterdir())


def _refuse_non_directory(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a directory; choose another output directory", field="out_dir")


def check_output_directory(path: str | os.PathLike) -> None:
    """Refuse, before any work, an output directory that ``atomic_directory`` could not
    replace whole: a symbolic link (the result would replace the link, never reaching its
    target), a mount point (it cannot be renamed), a regular file, or the current
    directory or one above it."""
    path = Path(path)
    if inside(Path.cwd(), path):
        raise OutputError(
            f"{path} is the current directory or contains it; pass a new directory below it", field="out_dir"
        )
    if path.is_symlink():
        raise OutputError(
            f"{path} is a symbolic link; pass the directory it points to, {os.path.realpath(path)}", field="out_dir"
        )
    _refuse_non_directory(path)
    if path.is_dir() and os.path.ismount(path):
        raise OutputError(
            f"{path} is a mount point, which cannot be replaced whole; pass a directory inside it", field="out_dir"
        )


def refuse_output_directory(
    out_dir: str | os.PathLike,
    overwrite: bool,
    inputs: Sequence[str | os.PathLike] = (),
    inputs_name: str = "the input",
) -> None:
    """Refuse, before any work, an output directory that cannot take a command's result:
    one ``check_output_directory`` refuses, one holding any of the command's ``inputs``
    (which replacing it would delete), or a non-empty one without ``overwrite``."""
    out_dir = Path(out_dir)
    check_output_directory(out_dir)
    for item in inputs:
        if inside(item, out_dir):
            raise OutputError(
                f"{out_dir} holds {inputs_name} {item}, which replacing it would delete; choose another output directory",
                field="out_dir",
            )
    if holds_files(out_dir) and not overwrite:
        raise InputError(
            f"{out_dir} exists and is not empty; choose another output directory or overwrite it", field="overwrite"
        )


def _make_directory(path: Path) -> bool:
    """``mkdir -p path``; whether this call created it (an existing directory is fine)."""
    try:
        path.mkdir(parents=True)
        return True
    except FileExistsError as error:
        if not path.is_dir():  # a file, or a broken symbolic link, at path or above it
            raise OutputError(
                f"cannot create {path}: it, or a folder above it, is a file or a broken symbolic "
                "link; choose another output directory"
            ) from error
        return False
    except OSError as error:
        raise OutputError(f"cannot create {path} ({error.strerror}); choose a writable output location") from error


def _open_directory(path: Path) -> int | None:
    """A read-only descriptor of the directory ``path``; None when it was removed meanwhile."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except NotADirectoryError as error:
        raise OutputError(f"{path} exists and is not a directory; choose another output directory") from error
    except FileNotFoundError:
        return None  # removed between mkdir and open: make it again


def _flock_still_path(path: Path, descriptor: int) -> bool:
    """Lock ``descriptor`` (the directory ``path``); whether it still is ``path`` (when not,
    it is closed and the caller locks again)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, now = os.fstat(descriptor), os.stat(path)
    except BlockingIOError as error:
        os.close(descriptor)
        raise OutputError(
            f"{path} is being written by another sinkscope run; wait for it to finish or choose another output directory"
        ) from error
    except FileNotFoundError:
        os.close(descriptor)
        return False  # removed after the lock was taken: start again
    except OSError as error:
        # NFS emulates flock with write locks, which a directory cannot take (EBADF);
        # some FUSE/CIFS mounts have no locks at all: work unlocked, and say so once
        print(
            f"sinkscope: note: {path} is on a filesystem without directory locks ({error.strerror}); "
            "a second run on the same output is not detected there",
            file=sys.stderr,
        )
        return True
    if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
        return True
    os.close(descriptor)  # a finishing run swapped a new result in: lock that one
    return False


def _create_and_lock(path: Path) -> tuple[int, bool]:
    """(the locked descriptor of ``path``, whether this call created it), made and locked
    again while another run keeps replacing the directory (ten tries)."""
    created = False
    for _ in range(10):  # retried only when the directory is replaced between open and lock
        created = _make_directory(path) or created
        descriptor = _open_directory(path)
        if descriptor is not None and _flock_still_path(path, descriptor):
            return descriptor, created
    raise OutputError(
        f"{path} keeps being replaced by another run; wait for it to finish or choose another output directory"
    )


@contextmanager
def locked_directory(path: str | os.PathLike) -> Iterator[bool]:
    """Hold an exclusive lock on the output directory ``path`` (created, parents too, when
    missing) until the block ends: a second writer on the same path gets ``OutputError``
    at once instead of both running and one result silently replacing the other.

    The lock is ``flock`` on the directory itself, so nothing is written beside it and the
    kernel drops it if the process dies. Yields whether this call created ``path``; a
    directory it created and left empty (the run failed) is removed again.
    """
    path = Path(path)
    descriptor, created = _create_and_lock(path)
    try:
        yield created
    finally:
        if created:
            try:
                path.rmdir()  # only succeeds while empty: a failed run leaves no directory it made
            except OSError:
                pass
        os.close(descriptor)


@contextmanager
def claim_output_directory(
    out_dir: str | os.PathLike,
    overwrite: bool,
    inputs: Sequence[str | os.PathLike] = (),
    inputs_name: str = "the input",
) -> Iterator[Path]:
    """Lock ``out_dir`` for the block (``locked_directory``) after
    ``refuse_output_directory``'s checks, which run again once the lock is held, so a
    writer that finished in between is not replaced without ``overwrite``. Build the
    result with ``atomic_directory(out_dir, replace=overwrite)`` inside the block."""
    refuse_output_directory(out_dir, overwrite, inputs, inputs_name)  # before creating anything
    with locked_directory(out_dir):
        refuse_output_directory(out_dir, overwrite, inputs, inputs_name)
        yield Path(out_dir)


@contextmanager
def atomic_directory(path: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it to ``path`` when complete.

    An existing ``path`` is replaced only after the new one is fully written, and keeps
    its permission bits. Nothing beside ``path`` is touched except this call's own
    uniquely named temporary directories. ``replace=False``: a ``path`` that another run
    filled meanwhile is kept, and ``OutputError`` says so (two writers on one path:
    exactly one wins).
    """
    path = Path(path)
    check_output_directory(path)
    tmp = Path(_temporary(tempfile.mkdtemp, path))
    try:
        yield tmp
        mode = stat.S_IMODE(path.stat().st_mode) if path.is_dir() else 0o777 & ~_umask()
        tmp.chmod(mode)  # an existing directory's mode, else a normal mkdir's (not mkdtemp's 0700)
        check_output_directory(path)
        if not path.exists() or not replace:
            try:
                os.rename(tmp, path)  # onto nothing or an empty directory only: a filled one raises
            except OSError as error:
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise OutputError(
                    f"{path} was filled by another run while this one worked; it was kept and this result "
                    "discarded; choose another output directory"
                ) from error
        else:
            # the old result moves to a fresh, uniquely named directory: no existing name is reused
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, trash)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(trash, path)  # put the old result back before anything else
                raise
            shutil.rmtree(trash, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _refuse_constant(name: str) -> Any:
    """``NaN`` and ``Infinity`` are not JSON; sinkscope writes an undefined number as null."""
    raise ValueError(f"{name} is not standard JSON")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``, standard JSON only; a file that is not is one ``InputError``
    (nesting too deep for the parser, integers too long to read, ``NaN`` included)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except FileNotFoundError as error:
        raise InputError(f"{path} does not exist") from error
    except RecursionError as error:
        raise InputError(f"{path} is not a sinkscope file (its JSON nests too deep to read); regenerate it") from error
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, and an integer of over 4,300 digits
        raise InputError(f"{path} is not valid JSON ({error}); delete or regenerate it") from error
