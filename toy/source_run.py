"""What a toy probe or patch result keeps of the training run it was computed from
(``source_run.json``), so that its report describes that run and not whatever lies at the
run's path later: the run's name and settings, the logged steps its sink-formation figure
draws, and the sha256 of each run file it read.

A report reads only this copy; ``provenance.json``'s ``source`` is the run's path as a
record, never opened again. A result written before the copy existed has no
``source_run.json``: its report leaves the training run's settings out and says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from sinkscope.infra.bounds import COUNT, UNBOUNDED, Bound, Problem, relative_path_problems
from sinkscope.infra.codec import read_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.field_types import check_field_types
from sinkscope.toy.run_dir import CONFIG_FILE, METRICS_FILE, RESULT_FILE, RunConfig, read_metrics, weights_file
from sinkscope.toy.run_integrity import file_sha256
from sinkscope.toy.training_curves import formation_records

SOURCE_RUN_FILE = "source_run.json"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class SourceFile:
    """One file of the run that the result was computed from: its path inside the run
    directory and the sha256 of its bytes when the result was written."""

    name: str
    sha256: str

    def __post_init__(self) -> None:
        check_field_types(self)
        if len(self.sha256) != 64 or not set(self.sha256) <= _HEX:
            raise InputError(f"sha256 of {self.name} is {self.sha256!r}, not 64 lowercase hex digits", field="sha256")


@dataclass(frozen=True)
class LoggedStep:
    """One drawable line of the run's ``metrics.jsonl`` (``formation_records``): each head's
    BOS mass at the non-trigger queries of that step's batch, ``[layer][head]`` (NaN where
    the log held null), and Gu et al.'s sink rate in percent keyed by ε, None where not
    logged."""

    # copied as the log held them: the figure drew them so, and the report states them so
    BOUNDS: ClassVar[dict[str, Bound]] = {"step": COUNT, "anchor_mass_default": UNBOUNDED, "sink_rate": UNBOUNDED}

    step: int
    anchor_mass_default: tuple[tuple[float, ...], ...]
    sink_rate: dict[str, float] | None = None

    def __post_init__(self) -> None:
        check_field_types(self)

    @classmethod
    def from_record(cls, record: dict) -> LoggedStep:
        masses = tuple(
            tuple(math.nan if mass is None else float(mass) for mass in layer)
            for layer in record["anchor_mass_default"]
        )
        rate = record.get("sink_rate")
        return cls(record["step"], masses, {key: float(value) for key, value in rate.items()} if rate else None)

    def as_record(self) -> dict:
        """The line as ``read_metrics`` gave it (a NaN mass as the null it was)."""
        masses = [[None if math.isnan(mass) else mass for mass in layer] for layer in self.anchor_mass_default]
        record: dict = {"step": self.step, "anchor_mass_default": masses}
        if self.sink_rate is not None:
            record["sink_rate"] = dict(self.sink_rate)
        return record


@dataclass(frozen=True)
class SourceRun:
    """The training run a result was computed from, as it was then. ``name``: the run
    directory's name (the reports' titles and findings say it); ``logged``: the steps the
    sink-formation figure draws (empty for a patch, which draws none); ``files``: the run's
    files read, each with its sha256."""

    SCHEMA: ClassVar[str] = "toy_source_run"
    SCHEMA_VERSION: ClassVar[int] = 1

    name: str
    config: RunConfig
    logged: tuple[LoggedStep, ...]
    files: tuple[SourceFile, ...]

    def __post_init__(self) -> None:
        check_field_types(self)

    def inconsistencies(self) -> list[Problem]:
        model = self.config.model
        problems = list(relative_path_problems([file.name for file in self.files], "files"))
        for index, step in enumerate(self.logged):
            shape = [len(layer) for layer in step.anchor_mass_default]
            if shape != [model.n_heads] * model.n_layers:
                where = f"logged[{index}].anchor_mass_default"
                problems.append((where, shape, f"{model.n_layers} layers of {model.n_heads} heads, as config.model"))
        return problems

    def records(self) -> list[dict]:
        """The logged steps as metrics lines, for the functions that read them."""
        return [step.as_record() for step in self.logged]


def copy_source_run(run_dir: Path, config: RunConfig, with_metrics: bool) -> SourceRun:
    """What a result keeps of ``run_dir``: ``config`` (as the caller read it), with
    ``with_metrics`` the drawable logged steps, and the sha256 of the run's config, result,
    weights and (with ``with_metrics``) metrics log."""
    names = [CONFIG_FILE, RESULT_FILE, str(weights_file(run_dir).relative_to(run_dir))]
    names += [METRICS_FILE] if with_metrics else []
    # a missing or irregular file (a run logged nothing) is left out, as its readers leave it
    files = tuple(SourceFile(name, file_sha256(run_dir / name)) for name in names if (run_dir / name).is_file())
    logged = tuple(LoggedStep.from_record(record) for record in formation_records(read_metrics(run_dir)))
    return SourceRun(run_dir.resolve().name, config, logged if with_metrics else (), files)


def read_source_run(result_dir: str | os.PathLike, command: str) -> SourceRun | None:
    """The run ``result_dir`` was computed from, as copied when it was written; None for a
    result written before the copy (no ``source_run.json``)."""
    path = Path(result_dir) / SOURCE_RUN_FILE
    if not os.path.lexists(path):
        return None
    if not path.resolve().is_relative_to(Path(result_dir).resolve()):  # a link out: another run's copy
        raise InputError(f"{path} leads outside {result_dir}; regenerate the result with sinkscope {command}")
    return read_result(path, SourceRun, f"regenerate it with sinkscope {command}")
