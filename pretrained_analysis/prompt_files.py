"""Local prompt files read through ``datasets``, checked before they are read.

A prompt path must be a regular file (a FIFO or a device is named as such). A text file
(.txt, .jsonl, .json, .csv) is sniffed from its first ``SNIFF_BYTES`` bytes (UTF-16,
NUL bytes: refused at once, so a huge binary file costs nothing) and then checked to be
UTF-8 in ``CHUNK_BYTES`` chunks, so memory stays bounded whatever its size: files are
streamed, never read whole (``datasets`` itself reads them in batches into its cache).
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Any

from sinkscope.infra.errors import InputError

FILE_BUILDERS: dict[str, str] = {
    ".txt": "text",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
SNIFF_BYTES = 8192
CHUNK_BYTES = 1 << 20
PROMPT_FILE_KINDS = "an existing .txt/.jsonl/.csv/.parquet file, default, random or a dataset id"
CACHE_FIX = "set HF_HOME (or HF_DATASETS_CACHE) to a writable directory, or HOME to a writable home directory"
NOT_REGULAR: tuple[tuple[Any, str], ...] = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


class PromptError(InputError):
    """The prompt set cannot be built (missing file, empty set, unknown column, too long)."""


def check_regular_file(path: Path) -> None:
    """``path`` is an existing regular file (stat only: a FIFO is never opened)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise PromptError(f"prompt file {path} does not exist; pass {PROMPT_FILE_KINDS}") from None
    except OSError as error:
        raise PromptError(f"cannot read prompt file {path} ({error.strerror}); pass {PROMPT_FILE_KINDS}") from error
    if stat.S_ISDIR(mode):
        raise PromptError(f"{path} is a directory; pass a prompt file (.txt, .jsonl, .csv or .parquet)")
    kind = next((name for test, name in NOT_REGULAR if test(mode)), None if stat.S_ISREG(mode) else "not a file")
    if kind is not None:
        raise PromptError(
            f"{path} is {kind}, not a regular file; save the prompts to a .txt/.jsonl/.csv/.parquet file and pass that"
        )


def check_text_file(path: Path) -> None:
    """A text prompt file must be non-empty UTF-8 (a UTF-16 export or a binary file would
    otherwise be read as garbage prompts): sniffed from its first bytes, then streamed."""
    with path.open("rb") as file:
        head = file.read(SNIFF_BYTES)
        _check_bytes(path, head, 0)
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, blank = 0, not head.strip()
        chunk = head
        while chunk:
            _decode(path, decoder, chunk, offset)
            offset += len(chunk)
            chunk = file.read(CHUNK_BYTES)
            if chunk:
                _check_bytes(path, chunk, offset)
                blank = blank and not chunk.strip()
        _decode(path, decoder, b"", offset, final=True)
    if blank:
        raise PromptError(f"prompt file {path} is empty; add prompts (one per line for .txt)")


def _check_bytes(path: Path, chunk: bytes, offset: int) -> None:
    if offset == 0 and chunk.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PromptError(f"{path} is UTF-16 text; save it as UTF-8")
    if b"\x00" in chunk:
        raise PromptError(f"{path} holds NUL bytes, so it is binary, not text; save the prompts as UTF-8 text")


def _decode(path: Path, decoder: Any, chunk: bytes, offset: int, final: bool = False) -> None:
    try:
        decoder.decode(chunk, final)
    except UnicodeDecodeError as error:
        raise PromptError(f"{path} is not UTF-8 text (byte {offset + error.start}); save it as UTF-8") from error


def cache_error(error: BaseException, read: str | os.PathLike | None = None) -> PromptError | None:
    """The one-line error for an ``OSError`` about a path other than the file ``read``:
    ``datasets`` writes its cache under HOME (``~/.cache/huggingface/datasets``), so an
    unwritable or missing HOME fails there, not in the prompt file. None otherwise."""
    cause = error.__cause__ if isinstance(error.__cause__, OSError) else error
    if not isinstance(cause, OSError) or not cause.filename:
        return None
    if read is not None and Path(os.fsdecode(cause.filename)) == Path(read):
        return None
    reason = cause.strerror or type(cause).__name__
    return PromptError(f"cannot write the Hugging Face datasets cache ({cause.filename}: {reason}); {CACHE_FIX}")


def column_values(dataset: Any, column: str, where: str) -> list[Any]:
    """Every value of ``column`` (a one-line error listing the columns when it is absent)."""
    if column not in dataset.column_names:
        raise PromptError(
            f"{where} has no column {column!r}; available columns: {', '.join(dataset.column_names)}; "
            "set text_column to one of them",
            field="text_column",
        )
    return list(dataset[column])


def read_file(path: Path, text_column: str) -> tuple[list[Any], str]:
    """All values of the text column of a local file, via ``datasets``; and the column used."""
    check_regular_file(path)
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise PromptError(f"{path} has an unknown extension; use one of {', '.join(FILE_BUILDERS)}")
    if builder != "parquet":
        check_text_file(path)
    column = "text" if builder == "text" else text_column
    import datasets
    from datasets.exceptions import DatasetsError
    from pyarrow import ArrowException

    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its parsers log the error we report below
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
    # datasets wraps its parsers' errors (pandas', pyarrow's: ValueError, TypeError) in its
    # own classes, or lets them through; a file it cannot open is an OSError
    except (DatasetsError, ArrowException, ValueError, TypeError, OSError) as error:
        raise _read_error(error, path, builder) from error
    finally:
        datasets.logging.set_verbosity(verbosity)
    return column_values(dataset, column, str(path)), column


def _read_error(error: BaseException, path: Path, builder: str) -> PromptError:
    """What went wrong reading ``path``, in one line: the cache, an empty table, or the file."""
    cached = cache_error(error, path)
    if cached is not None:
        return cached
    cause = error.__cause__ or error
    reason = (str(cause).strip().splitlines() or [""])[0][:200]
    if "corresponds to no data" in reason:  # datasets' words for a table with no rows
        what = "only a header" if builder == "csv" else "no records"
        return PromptError(f"{path} has no prompts ({what}); add one prompt per row")
    return PromptError(
        f"cannot read prompts from {path} ({type(cause).__name__}: {reason}); "
        "check that it is an intact file of its format"
    )
