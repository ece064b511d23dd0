"""Resumable output directories: a command's result directory that a re-run with the same
settings continues in place, and that another command's settings are refused from.

``experiment_directory(out_dir, marker_file, settings, what, overwrite)`` locks ``out_dir``
and yields where to work: ``out_dir`` itself when it is new or empty, or when its marker
file holds the same settings (an interrupted run resumes there); with ``overwrite`` over
other contents, a staging directory that replaces ``out_dir`` whole only when complete.
Toy reproductions and sweeps, and audit suites, keep their units' directories in it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sinkscope.execution.units import UnitsFailed
from sinkscope.infra.atomic_io import (
    atomic_directory,
    atomic_write_json,
    check_output_directory,
    holds_files,
    locked_directory,
    refuse_output_directory,
)
from sinkscope.infra.codec import Persisted, read_result, write_result
from sinkscope.infra.errors import InputError, RunFailed


@contextmanager
def experiment_directory(
    out_dir: str | os.PathLike,
    marker_file: str,
    settings: Persisted,
    what: str,
    overwrite: bool,
) -> Iterator[Path]:
    """Lock ``out_dir`` (a second writer gets one line) and yield the directory to work in.

    ``out_dir`` itself when it is new or empty, or when its ``marker_file`` holds the same
    ``settings`` (an interrupted run resumes there). Other contents are refused unless
    ``overwrite``; then the new result is built aside and swapped in only when complete,
    so an interrupt leaves the old result whole. Paths that the new result records to
    itself (run directories, provenance) are rewritten to ``out_dir`` before the swap.
    """
    out_dir = Path(out_dir)
    check_output_directory(out_dir)
    with locked_directory(out_dir):
        marker = out_dir / marker_file
        if marker.exists() and not overwrite:
            recorded = read_result(marker, type(settings), f"use another output directory or overwrite {what}")
            if recorded != settings:
                raise InputError(
                    f"{out_dir} holds {what} with different settings ({setting_differences(recorded, settings)}); "
                    "repeat its settings to resume it, choose another output directory or overwrite it",
                    field="overwrite",
                )
            yield out_dir  # same settings: resume
            return
        if not holds_files(out_dir):
            write_result(marker, settings)
            yield out_dir
            return
        refuse_output_directory(out_dir, overwrite)
        with atomic_directory(out_dir, replace=True) as staging:
            write_result(staging / marker_file, settings)
            try:
                yield staging
            except RunFailed as error:  # the staging directory goes, finished units with it
                failures = error.failures if isinstance(error, UnitsFailed) else ()
                listed = "; ".join(failure.line() for failure in failures) or str(error)
                raise UnitsFailed(
                    f"{listed} (in this overwriting run, which was discarded with everything it trained; the old "
                    f"result in {out_dir} is kept; running it again starts over)",
                    failures,
                ) from error
            _record_final_location(staging, out_dir)


def setting_differences(recorded: Any, asked: Any, prefix: str = "") -> str:
    """The compared fields of two settings dataclasses that differ, as ``name recorded
    (asked: value)``, nested settings by dotted name (``task.seq_len 16 (asked: 32)``)."""
    parts = []
    for item in dataclasses.fields(recorded):
        old, new = getattr(recorded, item.name), getattr(asked, item.name)
        if not item.compare or old == new:
            continue
        if dataclasses.is_dataclass(old) and type(old) is type(new):
            parts.append(setting_differences(old, new, f"{prefix}{item.name}."))
        else:
            parts.append(f"{prefix}{item.name} {old!r} (asked: {new!r})")
    return ", ".join(parts)


def _record_final_location(staging: Path, out_dir: Path) -> None:
    """Rewrite every JSON string under ``staging`` that names it (as given or resolved) to
    name ``out_dir`` instead, where the directory is about to be renamed."""
    prefixes = {str(staging): str(out_dir), str(staging.resolve()): str(out_dir.resolve())}

    def relocated(value: Any) -> Any:
        if isinstance(value, str):
            for old, new in prefixes.items():
                value = new if value == old else value.replace(old + os.sep, new + os.sep)
            return value
        if isinstance(value, list):
            return [relocated(item) for item in value]
        if isinstance(value, dict):
            return {key: relocated(item) for key, item in value.items()}
        return value

    for path in sorted(staging.rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))  # by value: JSON may escape the path's characters
        moved = relocated(data)
        if moved != data:
            atomic_write_json(path, moved)
