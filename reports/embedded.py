"""The one rule for files a report embeds or links: a report reads only inside the result
directory a file belongs to.

A figure named by a result (a fixed name, or a path from its JSON's ``figures``) must
resolve, after symlinks, to a REGULAR file inside that directory whose first bytes are
the PNG signature. Anything else (a symlink out of the directory, an absolute or ``..``
path, a FIFO, a device, a directory, a file that is not a PNG) is one ``InputError``
naming the file and the fix: the result was tampered with or damaged, so regenerate it.
Reading the resolved path without following a link again, and checking the opened file
itself, leaves no window for a swap between the check and the read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sinkscope.infra.errors import InputError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REMEDY = "regenerate the result with the command that wrote it"


def resolved_inside(path: Path, root: Path) -> Path:
    """``path`` with every symlink resolved, refused unless it lies inside ``root`` (itself resolved)."""
    try:
        real_root, real = root.resolve(), path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop: RuntimeError before Python 3.13, OSError after
        raise InputError(f"{path} cannot be resolved ({error}); {REMEDY}") from error
    if real_root not in real.parents:
        raise InputError(f"{path} resolves to {real}, outside {root}; a report reads only inside it: {REMEDY}")
    return real


def read_embedded_png(path: Path, root: Path) -> bytes:
    """The bytes of the PNG ``path``, a regular file inside ``root`` after symlinks (see the module docstring)."""
    real = resolved_inside(path, root)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: no link swapped in since
        descriptor = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        raise InputError(f"{path} cannot be read ({error.strerror}); {REMEDY}") from error
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise InputError(f"{path} is not a regular file; {REMEDY}")
        data = file.read()
    if not data.startswith(PNG_SIGNATURE):
        raise InputError(f"{path} is not a PNG file; {REMEDY}")
    return data


def check_embedded_png(path: Path, root: Path) -> Path:
    """``path`` resolved, once ``read_embedded_png`` accepts it: where a Markdown link points."""
    read_embedded_png(path, root)
    return resolved_inside(path, root)
