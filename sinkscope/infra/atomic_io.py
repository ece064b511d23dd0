"""Atomic file output: every result file is written to a temporary sibling and renamed,
so an interrupted run never leaves a half-written file behind."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sinkscope.infra.errors import InputError
from sinkscope.infra.swap import begin_staging, recover_swaps, short_name, swap_in


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
    """The output location cannot take the result (unwritable, a broken symlink, a mount
    point, overlapping an input, or written by another run meanwhile); nothing existing was
    changed."""


def _temporary(make: Callable[..., Any], path: Path) -> Any:
    """``make`` (``tempfile.mkstemp`` or ``mkdtemp``) of a hidden temporary beside ``path``,
    its parent created first; an unwritable location is one ``OutputError``."""
    with _writable_location(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return make(prefix=f".{short_name(path.name)}.", suffix=".tmp", dir=path.parent)


@contextmanager
def _writable_location(path: Path) -> Iterator[None]:
    """Making a temporary beside ``path``: an unwritable location is one ``OutputError``."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk is not an unwritable place: say which
            raise OutputError(
                f"no space left writing {path.parent} ({error.strerror}); free space on its device or choose "
                "another output location"
            ) from error
        raise OutputError(
            f"cannot write in {path.parent} ({error.strerror}); choose a writable output location"
        ) from error


def followed(path: str | os.PathLike) -> Path:
    """``path``, or where it points when it is a symbolic link: results go into a linked
    output's target (cluster scratch is often reached through a link) and the link stays.
    A link to nothing is ``OutputError``."""
    path = Path(path)
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.exists():
        raise OutputError(
            f"{path} is a broken symbolic link (to {target}); create its target or choose another output directory",
            field="out_dir",
        )
    return target


def inside(path: str | os.PathLike, directory: str | os.PathLike) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (symlinks resolved)."""
    path, directory = _resolved(path), _resolved(directory)
    return path == directory or directory in path.parents


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` with its symlinks resolved; a symbolic-link loop is one ``InputError`` (pathlib
    raises RuntimeError or, from Python 3.13, OSError ELOOP: a traceback for a user's typo)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as error:
        if isinstance(error, OSError) and error.errno != errno.ELOOP:
            raise
        raise InputError(f"{path} is a symbolic link loop; point it at an existing file or directory") from error


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
    replace whole: a mount point (it cannot be renamed), a regular file, a broken symbolic
    link, or the current directory or one above it. A half-done swap that a killed writer
    left there is first undone (``recover_swaps``). A symbolic link is checked as its target."""
    given = Path(path)
    if inside(Path.cwd(), given):
        raise OutputError(
            f"{given} is the current directory or contains it; pass a new directory below it", field="out_dir"
        )
    path = followed(given)
    recover_swaps(path)
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
    own_places: Sequence[str | os.PathLike] = (),
) -> None:
    """Refuse, before any work, an output directory that cannot take a command's result:
    one ``check_output_directory`` refuses, one that overlaps any of the command's ``inputs``
    (``refuse_overlap``), or a non-empty one without ``overwrite``."""
    out_dir = Path(out_dir)
    check_output_directory(out_dir)
    refuse_overlap(out_dir, inputs, inputs_name, own_places)
    if holds_files(out_dir) and not overwrite:
        raise InputError(
            f"{out_dir} exists and is not empty; choose another output directory or overwrite it", field="overwrite"
        )


def refuse_overlap(
    out_dir: str | os.PathLike,
    inputs: Sequence[str | os.PathLike],
    inputs_name: str = "the input",
    own_places: Sequence[str | os.PathLike] = (),
) -> None:
    """Refuse an output directory that holds an input (replacing it would delete the input)
    or lies in one (it would replace, or be copied into, what the command reads), compared
    on real paths after symbolic links. ``own_places``: directories inside an input that the
    command itself owns (``toy probe``'s ``RUN_DIR/probe``), which are fine."""
    out_dir = Path(out_dir)
    owned = any(inside(out_dir, place) and inside(place, out_dir) for place in own_places)
    for item in inputs:
        if inside(item, out_dir):
            raise OutputError(
                f"{out_dir} holds {inputs_name} {item}, which replacing it would delete; choose another output directory",
                field="out_dir",
            )
        if inside(out_dir, item) and not owned and Path(item).is_dir():  # only a folder input can hold out
            raise OutputError(
                f"{out_dir} lies inside {inputs_name} {item}, which writing there would change; "
                "choose an output directory outside it",
                field="out_dir",
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
    own_places: Sequence[str | os.PathLike] = (),
) -> Iterator[Path]:
    """Lock ``out_dir`` for the block (``locked_directory``) after
    ``refuse_output_directory``'s checks, which run again once the lock is held, so a
    writer that finished in between is not replaced without ``overwrite``. Build the
    result with ``atomic_directory(out_dir, replace=overwrite)`` inside the block."""
    refuse_output_directory(out_dir, overwrite, inputs, inputs_name, own_places)  # before creating anything
    with locked_directory(out_dir):
        refuse_output_directory(out_dir, overwrite, inputs, inputs_name, own_places)
        yield Path(out_dir)


@contextmanager
def atomic_directory(path: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Build a directory under a temporary name; put it at ``path`` when complete.

    An existing ``path`` is replaced only after the new one is fully written (in one
    exchange where the OS has one, else recoverably: ``sinkscope.infra.swap``), and keeps
    its permission bits. A symbolic link at ``path`` is followed (its target is replaced;
    the link stays). Nothing beside ``path`` is touched except this call's own uniquely
    named, journaled temporaries. ``replace=False``: a ``path`` that another run filled
    meanwhile is kept, and ``OutputError`` says so (two writers on one path: exactly one wins).
    """
    path = followed(path)
    check_output_directory(path)
    with _writable_location(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        staging, tmp = begin_staging(path)
    try:
        yield tmp
        mode = stat.S_IMODE(path.stat().st_mode) if path.is_dir() else 0o777 & ~_umask()
        tmp.chmod(mode)  # an existing directory's mode, else a normal mkdir's (not mkdtemp's 0700)
        check_output_directory(path)
        if not path.exists() or not replace:
            _rename_onto_empty(tmp, path)
        else:
            swap_in(staging, tmp)
    finally:
        staging.remove_leftovers()  # the build directory on failure, the old result on success


def _rename_onto_empty(tmp: Path, path: Path) -> None:
    try:
        os.rename(tmp, path)  # onto nothing or an empty directory only: a filled one raises
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise OutputError(
            f"{path} was filled by another run while this one worked; it was kept and this result "
            "discarded; choose another output directory"
        ) from error


def _refuse_constant(name: str) -> Any:
    """``NaN`` and ``Infinity`` are not JSON; sinkscope writes an undefined number as null."""
    raise ValueError(f"{name} is not standard JSON")


# far above any result sinkscope writes (a 70B model's audit is a few MB): a larger file is
# not one of them, and reading it whole would exhaust memory before the JSON is refused
MAX_JSON_BYTES = 256 * 2**20


def _check_readable_size(path: Path) -> None:
    """Refuse, before reading, what is not a regular file (a FIFO would block) or is too large."""
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe, device or socket)"
        raise InputError(f"{path} is {kind}; restore the file or regenerate the result")
    if info.st_size > MAX_JSON_BYTES:
        raise InputError(
            f"{path} is {info.st_size / 2**20:,.0f} MiB, larger than any sinkscope result "
            f"({MAX_JSON_BYTES // 2**20} MiB at most); restore the file or regenerate the result"
        )


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``, standard JSON only; a file that is not is one ``InputError``
    (nesting too deep for the parser, integers too long to read, ``NaN`` included)."""
    path = Path(path)
    try:
        _check_readable_size(path)
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except FileNotFoundError as error:
        raise InputError(f"{path} does not exist") from error
    except RecursionError as error:
        raise InputError(f"{path} is not a sinkscope file (its JSON nests too deep to read); regenerate it") from error
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, and an integer of over 4,300 digits
        raise InputError(f"{path} is not valid JSON ({error}); delete or regenerate it") from error
