"""Toy runs and audits compared with the same probes (``sinkscope compare`` on toy inputs).

``compare_mechanism(inputs)`` gathers one ``ProbeResult`` per model from each input and
builds ``sinkscope.probes.mechanism.MechanismComparison``; ``write_mechanism`` writes
``mechanism.json``, ``mechanism.md`` and ``mechanism.png``. An input is a directory or an
in-memory result:

- an audit directory (``audit.json``), or an audit comparison or suite directory
  (``comparison.json``; each audit inside it): the audit's probe;
- a toy run directory (``config.json`` + weights): its ``probe/probe.json`` when
  ``sinkscope toy probe`` wrote one, else the same probe computed here on the run's model
  (nothing is written into the run); each model's ``origin`` says which;
- a toy probe directory (``probe.json`` + ``default_state.json``);
- a toy reproduction or sweep directory: every run directory in it, as above, probed on
  the reproduction's number of sequences (so its heads equal the runs' ``evaluation.json``);
- an ``AuditResult``, a ``(label, ProbeResult)`` pair or a ``MechanismSource``.

This lives in the top package because it reads both toy and pretrained results.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sinkscope.infra.arguments import check_number
from sinkscope.infra.atomic_io import atomic_directory, atomic_write_text
from sinkscope.infra.bounds import SAMPLES
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.pretrained_analysis.audit import AUDIT_FILE, AuditResult, read_audit
from sinkscope.pretrained_analysis.compare import COMPARISON_JSON, read_comparison
from sinkscope.probes.mechanism import MECHANISM_FILE, MechanismComparison, MechanismSource, compare_mechanisms
from sinkscope.probes.mechanism_report import MECHANISM_FIGURE, MECHANISM_MD, mechanism_figure, mechanism_markdown
from sinkscope.probes.probe import ProbeResult
from sinkscope.toy.experiment import SUMMARY_FILE
from sinkscope.toy.probe_run import DEFAULT_STATE_FILE, PROBE_FILE, probe_of_run
from sinkscope.toy.report_blocks import source_name
from sinkscope.toy.reproduce import REPRODUCE_FILE, ReproduceSummary
from sinkscope.toy.run_dir import CONFIG_FILE, FINAL_WEIGHTS, RESULT_FILE, RunConfig, read_config, unfinished_reason
from sinkscope.toy.source_run import read_source_run
from sinkscope.toy.sweep import SWEEP_FILE, SweepResult

READ_PROBE = "probe.json read (sinkscope toy probe)"
COMPUTED_PROBE = "computed here on the run's model (the run had no probe/probe.json)"
READ_AUDIT = "audit.json read (sinkscope audit)"
IN_MEMORY = "passed in memory"
DEFAULT_SEQUENCES = 1000  # sinkscope toy probe's default, so a computed probe equals one it writes

MechanismInput = str | os.PathLike | AuditResult | MechanismSource | tuple[str, ProbeResult]


def is_audit_directory(path: str | os.PathLike) -> bool:
    return (Path(path) / AUDIT_FILE).is_file()


def _toy_model(config: RunConfig) -> str:
    model = config.model
    return f"toy {model.attention} {model.n_layers}x{model.n_heads} (d_model {model.d_model})"


def _audit_source(result: AuditResult, directory: Path | None, origin: str) -> MechanismSource:
    model = result.model
    name = model.name + (f"@{model.revision}" if model.revision else "")
    return MechanismSource(
        model.label, "pretrained", name, result.probe, origin, None if directory is None else str(directory)
    )


def _is_toy_run(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and ((path / FINAL_WEIGHTS).is_file() or (path / RESULT_FILE).is_file())


@dataclass(frozen=True)
class ToyProbing:
    """How a toy run without a saved probe is probed here: on ``n_sequences`` figure-set
    sequences; an unfinished or diverged run only with ``allow_unfinished``."""

    n_sequences: int = DEFAULT_SEQUENCES
    allow_unfinished: bool = False


def _toy_run_source(run_dir: Path, probing: ToyProbing, label: str | None = None) -> MechanismSource:
    """A toy run's probe: ``probe/probe.json`` when it exists, else computed (not written)."""
    config = read_config(run_dir)
    written = run_dir / "probe" / PROBE_FILE
    if written.is_file():
        probe = read_result(written, ProbeResult, "regenerate it with sinkscope toy probe")
        origin = READ_PROBE
    else:
        probe = probe_of_run(run_dir, probing.n_sequences, probing.allow_unfinished)
        origin = COMPUTED_PROBE
    return MechanismSource(label or run_dir.name, "toy", _toy_model(config), probe, origin, str(run_dir))


def _toy_probe_source(probe_dir: Path) -> MechanismSource:
    """A probe directory as it describes itself: its run's name and model from the copy the
    probe kept (``source_run.json``), never from whatever run lies beside it now."""
    probe = read_result(probe_dir / PROBE_FILE, ProbeResult, "regenerate it with sinkscope toy probe")
    run = read_source_run(probe_dir, "toy probe")
    model = _toy_model(run.config) if run is not None else f"toy {probe.model.attention}"
    label = source_name(probe_dir, run)
    kind = "toy" if probe.model.family == "toy" else "pretrained"
    return MechanismSource(label, kind, model, probe, READ_PROBE, str(probe_dir))


def _experiment_sources(directory: Path, probing: ToyProbing) -> list[MechanismSource]:
    """Every run of a toy reproduction or sweep, in its summary's order."""
    summary: ReproduceSummary | SweepResult
    if (directory / REPRODUCE_FILE).is_file():
        summary = read_result(directory / SUMMARY_FILE, ReproduceSummary, "regenerate it with sinkscope toy reproduce")
    else:
        summary = read_result(directory / SUMMARY_FILE, SweepResult, "regenerate it with sinkscope toy sweep")
    sources = []
    for model in summary.models:
        run_dir = directory / model.name
        if not _is_toy_run(run_dir):
            raise InputError(f"{run_dir} (listed in {directory / SUMMARY_FILE}) is missing; restore the run directory")
        sources.append(_toy_run_source(run_dir, replace(probing, n_sequences=summary.config.n_sequences)))
    return sources


def _comparison_sources(directory: Path) -> list[MechanismSource]:
    """Every audit of an audit comparison or suite, read from inside it (never outside)."""
    comparison = read_comparison(directory)
    root = directory.resolve()
    sources = []
    for row in comparison.rows:
        if not row.directory or root not in (root / row.directory).resolve().parents:
            raise InputError(
                f"{directory / COMPARISON_JSON} names no audit directory inside {directory} for {row.label}; "
                "regenerate it with sinkscope audit or sinkscope compare"
            )
        sources.append(_audit_source(read_audit(directory / row.directory), directory / row.directory, READ_AUDIT))
    return sources


def sources_of_directory(directory: str | os.PathLike, probing: ToyProbing | None = None) -> list[MechanismSource]:
    """The models a result directory holds (see the module docstring for the kinds)."""
    path = Path(directory)
    if not path.is_dir():
        raise InputError(f"{path} is not a directory; pass a toy run, reproduction or probe, or an audit directory")
    if (path / AUDIT_FILE).is_file():
        return [_audit_source(read_audit(path), path, READ_AUDIT)]
    if (path / COMPARISON_JSON).is_file():
        return _comparison_sources(path)
    if (path / SUMMARY_FILE).is_file() and ((path / REPRODUCE_FILE).is_file() or (path / SWEEP_FILE).is_file()):
        return _experiment_sources(path, probing or ToyProbing())
    if (path / PROBE_FILE).is_file() and (path / DEFAULT_STATE_FILE).is_file():
        return [_toy_probe_source(path)]
    if _is_toy_run(path):
        return [_toy_run_source(path, probing or ToyProbing())]
    raise InputError(
        f"{path} is neither a toy run, toy probe, reproduction or sweep nor an audit or audit comparison; "
        "pass directories written by sinkscope toy or sinkscope audit"
    )


def _sources_of(item: Any, probing: ToyProbing) -> list[MechanismSource]:
    if isinstance(item, MechanismSource):
        return [item]
    if isinstance(item, AuditResult):
        return [_audit_source(item, None, IN_MEMORY)]
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], ProbeResult):
        label, probe = item
        kind = "toy" if probe.model.family == "toy" else "pretrained"
        return [MechanismSource(str(label), kind, f"{kind} {probe.model.attention}", probe, IN_MEMORY)]
    if isinstance(item, ProbeResult):
        raise InputError("a ProbeResult needs a label: pass (label, probe) or a MechanismSource")
    if isinstance(item, (str, os.PathLike)):
        return sources_of_directory(item, probing)
    raise InputError(
        f"cannot compare a {type(item).__name__}; pass result directories, AuditResults, (label, ProbeResult) "
        "pairs or MechanismSources"
    )


def compare_mechanism(
    inputs: Sequence[MechanismInput],
    n_sequences: int = DEFAULT_SEQUENCES,
    sink_eps: float | None = None,
    allow_unfinished: bool = False,
) -> MechanismComparison:
    """Toy runs and audits side by side: one row per sink head of every model.
    ``n_sequences``: figure-set sequences for a toy run probed here (reproductions and
    sweeps use their own); ``sink_eps``: one sink-head threshold for every model (None:
    each probe's own, see ``sinkscope.probes.mechanism.compare_mechanisms``); ``allow_unfinished``:
    probe a run that is still training or diverged (its probe says so in its notes)
    instead of refusing it."""
    if isinstance(inputs, (str, os.PathLike, AuditResult, MechanismSource)):
        inputs = [inputs]
    check_number(n_sequences, SAMPLES, "n_sequences")  # the sequences are one tensor
    if sink_eps is not None and not 0.0 <= sink_eps < 1.0:  # before any toy run is probed
        raise InputError(f"sink_eps must lie in [0, 1), got {sink_eps}", field="sink_eps")
    probing = ToyProbing(n_sequences, allow_unfinished)
    sources = [source for item in inputs for source in _sources_of(item, probing)]
    partial = [source.label for source in sources if source.probe.config.layers is not None]
    if partial:  # its cancellation and sink heads would speak for layers it never probed
        raise InputError(
            f"{partial[0]} was probed on some layers only (layers); the mechanism comparison reads every layer: "
            "probe or audit it without layers",
            field="inputs",
        )
    computed = [source for source in sources if source.origin == COMPUTED_PROBE]
    notes = (
        (
            f"{len(computed)} toy run(s) had no probe.json, so their probe was computed on the run's model "
            f"(nothing was written into the runs): {', '.join(source.label for source in computed)}.",
        )
        if computed
        else ()
    )
    unfinished = [
        f"{source.label} was probed although {reason.split(' ', 1)[1]} (allow_unfinished)."
        for source in computed
        if source.directory and (reason := unfinished_reason(source.directory))
    ]
    return compare_mechanisms(sources, (*notes, *unfinished), sink_eps)


def write_mechanism(comparison: MechanismComparison, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``mechanism.json``, ``mechanism.md`` and ``mechanism.png`` into ``out_dir``,
    built aside and swapped in whole (an existing ``out_dir`` only with ``overwrite``)."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir, replace=overwrite) as tmp:
        mechanism_figure(comparison, tmp / MECHANISM_FIGURE)
        atomic_write_text(tmp / MECHANISM_MD, mechanism_markdown(comparison))
        write_result(tmp / MECHANISM_FILE, comparison)
        write_provenance(tmp, "compare", source=", ".join(m.directory or m.source for m in comparison.models))
    return out_dir
