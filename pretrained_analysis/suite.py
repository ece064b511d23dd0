"""Audit suites: several models, or several revisions (training checkpoints) of one, audited
on the same prompts, one resumable unit per (model, revision).

``audit_suite(suite, out_dir)`` writes each audit into ``out_dir/<slug>/`` atomically as
it finishes (``audit_unit``), then ``comparison.json``, ``comparison.md`` and their
figures from the audits on disk. ``suite.json`` records the suite: running the same suite
again skips the finished audits (an interrupt or a failed revision loses only the audits
in flight), and a different one is refused unless ``overwrite``. The units run here, in
local processes or on Ray (``execution.run_units``). ``compare_directories`` builds the
same comparison from audit directories written anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from sinkscope.execution import Unit, run_units, skip_finished, units_failed
from sinkscope.execution.outputs import experiment_directory
from sinkscope.infra.arguments import PATH_TYPES, check_argument, check_items, check_path
from sinkscope.infra.atomic_io import atomic_directory
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AUDIT_FILE, AuditConfig, AuditResult, audit, read_audit, write_audit
from sinkscope.pretrained_analysis.compare import Comparison, check_comparable, compare_audits, write_comparison
from sinkscope.pretrained_analysis.gather import snapshot_audits
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set
from sinkscope.pretrained_analysis.training_steps import check_steps_used

SUITE_FILE = "suite.json"


@dataclass(frozen=True)
class AuditSuite:
    """What a suite audits (``suite.json``): the models in order, the directory name of
    each (``slugs``), the shared prompts and audit settings."""

    SCHEMA: ClassVar[str] = "audit_suite"
    SCHEMA_VERSION: ClassVar[int] = 1

    models: tuple[LoadSpec, ...]
    slugs: tuple[str, ...]
    prompts: PromptSpec
    config: AuditConfig


def slug(label: str) -> str:
    """A directory name for a model label (``pythia-14m@step30`` -> ``pythia-14m-step30``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label.replace("@", "-")).strip("-.") or "model"


def unique_slugs(labels: Sequence[str]) -> tuple[str, ...]:
    """``slug`` of each label, numbered where two would collide."""
    slugs: list[str] = []
    for label in labels:
        name, number = slug(label), 2
        while name in slugs:
            name, number = f"{slug(label)}-{number}", number + 1
        slugs.append(name)
    return tuple(slugs)


def audit_unit(spec: LoadSpec, prompts: PromptSpec, config: AuditConfig, directory: str) -> AuditResult:
    """One (model, revision): load it, audit it, and write ``directory`` whole; returns
    the result without its attention examples (they are drawn into the directory)."""
    loaded = load_model(spec, progress=False)
    result = audit(loaded, load_prompt_set(prompts), config, progress=False)
    with atomic_directory(directory) as tmp:
        write_audit(result, tmp)
    return replace(result, examples=())


def unit_of(spec: LoadSpec, prompts: PromptSpec, config: AuditConfig, directory: Path, name: str = "audit") -> Unit:
    """``audit_unit`` as a unit: a CPU, and a GPU when the model is placed on CUDA."""
    return Unit(
        name=name,
        function=audit_unit,
        args=(spec, prompts, config, str(directory)),
        gpus=1 if (spec.device or "").startswith("cuda") else 0,
    )


def audit_suite(
    suite: AuditSuite,
    out_dir: str | Path,
    overwrite: bool = False,
    on_done: Callable[[AuditResult], None] | None = None,
    executor: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
) -> Comparison:
    """Audit every model of ``suite`` into ``out_dir/<slug>/`` (skipping those a previous
    run of the same suite finished), then compare them. ``on_done(result)`` runs here as
    each audit finishes. Failed audits are one ``UnitsFailed`` after the others finish."""
    check_argument(suite, AuditSuite, "suite", "an AuditSuite")
    check_path(out_dir, "out_dir")
    check_argument(overwrite, bool, "overwrite", "True or False")
    with experiment_directory(out_dir, SUITE_FILE, suite, "an audit suite", overwrite) as work_dir:
        units = [
            unit_of(spec, suite.prompts, suite.config, (work_dir / name).resolve(), name)
            for spec, name in zip(suite.models, suite.slugs)
        ]
        report = run_units(
            units,
            executor,
            workers,
            ray_address,
            on_done=None if on_done is None else lambda _, result: on_done(result),
            skip=skip_finished(work_dir, AUDIT_FILE),
        )
        if report.failed:
            raise units_failed(report.failed, len(units), "audit")
        comparison = compare_audits([read_audit(work_dir / name) for name in suite.slugs], list(suite.slugs))
        write_comparison(comparison, work_dir)
    return comparison


def compare_directories(
    directories: Sequence[str | Path],
    out_dir: str | Path,
    overwrite: bool = False,
    steps: Mapping[str, int] | None = None,
) -> Comparison:
    """The comparison of audits written anywhere (separate commands, machines or clusters):
    each audit directory is copied into ``out_dir/<slug>/`` first and the comparison is
    made from the copies (``sinkscope.pretrained_analysis.gather``), so the comparison and
    its report are self-contained and describe exactly the audits shipped; then
    ``comparison.json``, ``comparison.md`` and the figures are written. The audits (two
    or more) must share their prompts and sink threshold. ``steps``: training steps of
    revisions whose names do not state them (``compare_audits``)."""
    sources = [Path(directory) for directory in check_items(directories, PATH_TYPES, "directories", "directory paths")]
    check_path(out_dir, "out_dir")
    check_argument(overwrite, bool, "overwrite", "True or False")
    if len(sources) < 2:
        raise InputError(
            f"a comparison needs at least two audit directories, got {len(sources)}; pass two or more",
            field="directories",
        )
    originals = [read_audit(source) for source in sources]
    check_comparable(originals, sources)  # fails fast, naming the sources
    check_steps_used(steps, {result.model.revision for result in originals if result.model.revision})
    with atomic_directory(out_dir, replace=overwrite) as tmp:
        copies = snapshot_audits(sources, tmp, AUDIT_FILE)
        results = [read_audit(copy) for copy in copies]
        check_comparable(results, sources)
        slugs = unique_slugs([result.model.label for result in results])
        for copy, name in zip(copies, slugs):
            copy.rename(tmp / name)
        comparison = compare_audits(results, list(slugs), steps)
        write_comparison(comparison, tmp)
    return comparison
