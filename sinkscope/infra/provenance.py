"""Provenance of a result directory: which command wrote it, when, with which versions.

Every sinkscope command that writes a result directory also writes ``provenance.json``
(``write_provenance``); reports show it. A directory written before provenance was
recorded reads as None, and reports say so.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import ClassVar

from sinkscope.infra.codec import read_result, write_result

PROVENANCE_FILE = "provenance.json"
PACKAGES: tuple[str, ...] = ("sinkscope", "torch", "transformer-lens", "transformers", "numpy")


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Provenance:
    """command: what wrote the directory (e.g. ``sinkscope toy reproduce``); source: the
    input it read (a run directory, a model), "" when none; created: UTC ISO time;
    versions: ``(package, version)`` pairs, Python first."""

    SCHEMA: ClassVar[str] = "provenance"
    SCHEMA_VERSION: ClassVar[int] = 1

    command: str
    source: str
    created: str
    platform: str
    versions: tuple[tuple[str, str], ...]

    @classmethod
    def collect(cls, command: str, source: str = "") -> Provenance:
        """The current environment's provenance."""
        versions = (("python", platform.python_version()),) + tuple((name, package_version(name)) for name in PACKAGES)
        return cls(
            command=command,
            source=source,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            platform=f"{platform.system()} {platform.machine()}",
            versions=versions,
        )


def write_provenance(out_dir: str | os.PathLike, command: str, source: str = "") -> Provenance:
    """Write ``out_dir/provenance.json`` for the current environment and return it."""
    provenance = Provenance.collect(command, source)
    write_result(Path(out_dir) / PROVENANCE_FILE, provenance)
    return provenance


def read_provenance(result_dir: str | os.PathLike) -> Provenance | None:
    """The directory's provenance, or None when it predates ``provenance.json``."""
    path = Path(result_dir) / PROVENANCE_FILE
    return read_result(path, Provenance, "delete it") if path.is_file() else None
