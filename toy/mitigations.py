"""`sinkscope toy mitigations`: every attention kind that is meant to remove the sink,
trained on the paper's task beside softmax and ReLU, with the theory's prediction of
where each kind's default state lives beside what the heads measure.

The models train and evaluate as a reproduction's do (``sinkscope.toy.experiment``:
resumable run directories, seeds of one architecture as one vmapped stack, local workers
or Ray). Each evaluated model carries its per-head rows (``HeadProbe.default_source``:
gate, anchor, null, anchor and null, quiet rows or none) and its default-state tests:
the anchor's sink removed (sink heads), every head's null removed (``remove_null``),
every gate forced open (``open_gate``), each against the matched random-key control.
A kind's finding compares the measured sources with ``PREDICTIONS`` (docs/toy-task.md,
written before any run); a disagreement is reported as a finding.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sinkscope.execution.outputs import experiment_directory
from sinkscope.infra.arguments import check_argument, check_path, refuse_duplicates
from sinkscope.infra.bounds import (
    COUNT,
    NONNEGATIVE,
    POSITIVE,
    SAMPLES,
    SEED,
    SEEDS,
    Bound,
    Problem,
    check_bounds,
    relative_path_problems,
)
from sinkscope.infra.codec import write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.interp.attention_kinds import validate_attention_kind
from sinkscope.probes.sink_metrics import DEFAULT_SOURCES
from sinkscope.toy.compiled_step import check_compile_choice
from sinkscope.toy.experiment import SUMMARY_FILE, ModelSummary, heads_dataframe, run_jobs
from sinkscope.toy.reproduce import PAPER_ARCHITECTURES, ReproduceConfig
from sinkscope.toy.run_dir import RunConfig, refuse_a_run_as_experiment_out
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tracking import TrackingConfig
from sinkscope.toy.train import unit_device

if TYPE_CHECKING:
    import pandas

MITIGATIONS_FILE = "mitigations.json"  # the config: the marker that lets a re-run resume
QUICK_MAX_STEPS = 8_000


@dataclass(frozen=True)
class Prediction:
    """What the theory says of a kind (docs/toy-task.md): whether it needs the anchor, and
    the ``HeadProbe.default_source`` its default state should measure as."""

    needs_anchor: bool
    source: str
    why: str


PREDICTIONS: dict[str, Prediction] = {
    "softmax": Prediction(
        True, "anchor", "a softmax row must put its mass on a key, and BOS is the only one every query sees"
    ),
    "relu": Prediction(False, "quiet rows", "ReLU rows are not normalised: a default query attends to nothing"),
    "softmax1": Prediction(False, "null", "the 1 in the denominator takes a row whose scores are all low"),
    "learned_sink": Prediction(False, "null", "the learned sink logit takes the row when the keys score low"),
    "kv_bias": Prediction(False, "null", "the bias slot takes the row, its value driven to write nothing"),
    "kv_bias_zero_value": Prediction(False, "null", "the bias slot takes the row and writes nothing"),
    "softpick": Prediction(False, "null", "scores at or below zero leave an all-zero row"),
    "gated_head": Prediction(False, "gate", "the gate closes at default positions and opens at the trigger"),
    "gated_element": Prediction(False, "gate", "the gates close at default positions and open at the trigger"),
    "value_gated": Prediction(
        True, "anchor", "the gate sees the key, not the query, so it cannot tell a default query from the trigger"
    ),
}
MITIGATION_KINDS: tuple[str, ...] = tuple(PREDICTIONS)


@dataclass(frozen=True)
class MitigationsConfig:
    """What to train: every kind x architecture x seed. ``quick()`` is the README's preset:
    the 1x1 models, three seeds, capped steps. Persisted as ``mitigations.json``."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "seeds": SEEDS,
        "first_seed": SEED,
        "architectures": POSITIVE,
        "max_steps": POSITIVE,
        "n_sequences": SAMPLES,
        "workers": POSITIVE,
    }

    SCHEMA: ClassVar[str] = "mitigations_config"
    SCHEMA_VERSION: ClassVar[int] = 1

    kinds: tuple[str, ...] = MITIGATION_KINDS
    architectures: tuple[tuple[int, int], ...] = PAPER_ARCHITECTURES
    seeds: int = 3
    first_seed: int = 0
    max_steps: int = 50_000
    n_sequences: int = 1000
    # how many run at once, not what is computed: a re-run may change it and still resume
    workers: int = field(default=2, compare=False)
    task: TaskConfig = field(default_factory=TaskConfig)

    def __post_init__(self) -> None:
        if not self.kinds:
            raise InputError(f"kinds must name at least one kind of {', '.join(MITIGATION_KINDS)}", field="kinds")
        for kind in self.kinds:
            validate_attention_kind(kind, "kinds")
            if kind not in PREDICTIONS:
                raise InputError(
                    f"{kind} has no prediction to compare with; choose among {', '.join(MITIGATION_KINDS)}",
                    field="kinds",
                )
        refuse_duplicates(self.kinds, "kinds")
        check_bounds(self)
        self._as_reproduction()  # its checks: seeds, steps, sequences, workers, architectures

    @classmethod
    def quick(cls, **overrides) -> MitigationsConfig:
        return cls(**{"architectures": ((1, 1),), "max_steps": QUICK_MAX_STEPS, **overrides})

    def _as_reproduction(self) -> ReproduceConfig:
        """The same grid as a reproduction's, whose job list this command trains."""
        return ReproduceConfig(
            seeds=self.seeds,
            first_seed=self.first_seed,
            architectures=self.architectures,
            attentions=self.kinds,
            max_steps=self.max_steps,
            n_sequences=self.n_sequences,
            workers=self.workers,
            task=self.task,
        )

    def run_configs(self) -> list[tuple[str, RunConfig]]:
        """(run directory name, config) per model, the costliest first."""
        return self._as_reproduction().run_configs()


@dataclass(frozen=True)
class CostRange:
    """A default-state test's increase in default-position MSE over a kind's converged runs:
    the mean and the range of the runs' own means (each run's 95% bootstrap interval over
    its test sequences is in its row of ``models``), with n runs. None where no run had it."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"n_runs": COUNT}

    n_runs: int
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class KindFinding:
    """One kind, over its converged runs (every architecture): how many converged and in how
    many steps (median), the per-head means at default positions, how many heads measure at
    each default source, what removing each candidate costs, and the prediction beside it."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_runs": COUNT,
        "n_converged": COUNT,
        "n_heads": COUNT,
        "n_sink_heads": COUNT,
        "median_steps": NONNEGATIVE,
        "anchor_mass": NONNEGATIVE,
        "null_mass": NONNEGATIVE,
        "gate_default": NONNEGATIVE,
        "gate_trigger": NONNEGATIVE,
    }

    kind: str
    predicted_source: str
    predicted_needs_anchor: bool
    why: str
    n_runs: int
    n_converged: int
    median_steps: float
    n_heads: int
    n_sink_heads: int
    anchor_mass: float
    null_mass: float
    gate_default: float
    gate_trigger: float
    sources: dict[str, int]
    measured_source: str
    agrees: bool | None
    remove_anchor: CostRange | None
    remove_null: CostRange | None
    open_gate: CostRange | None
    control: CostRange | None

    def inconsistencies(self) -> Iterator[Problem]:
        if self.n_converged > self.n_runs:
            yield "n_converged", str(self.n_converged), f"at most n_runs ({self.n_runs})"
        if sum(self.sources.values()) != self.n_heads:
            yield "sources", str(sum(self.sources.values())), f"the number of heads ({self.n_heads})"


@dataclass
class MitigationsSummary:
    """The comparison (``summary.json`` beside ``mitigations.json``): every model, one
    finding per kind."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"wall_seconds": NONNEGATIVE}

    SCHEMA: ClassVar[str] = "mitigations"
    SCHEMA_VERSION: ClassVar[int] = 1

    config: MitigationsConfig
    models: list[ModelSummary]
    kinds: list[KindFinding]
    wall_seconds: float
    figures: list[str] = field(default_factory=list)

    def inconsistencies(self) -> Iterator[Problem]:
        yield from relative_path_problems(self.figures)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (model, layer, head), every ``HeadProbe`` metric a column."""
        return heads_dataframe(self.models)

    def _repr_html_(self) -> str:
        from sinkscope.toy.mitigations_report import mitigations_html  # imports this module's types for typing only

        return mitigations_html(self)


def _mean(values: list[float]) -> float:
    finite = [value for value in values if value == value]
    return statistics.fmean(finite) if finite else float("nan")


def _cost(models: list[ModelSummary], which: str) -> CostRange | None:
    """The all-heads row of each model's ``which`` test ("remove", or "control" of the anchor
    test where it ran, else of the null or gate test)."""
    means = []
    for model in models:
        if which == "control":
            tests = (model.default_state, model.null_state, model.gate_state)
            row = next((t.all_sink_heads for t in tests if t is not None and t.all_sink_heads is not None), None)
            if row is not None:
                means.append(row.control_increase.mean)
            continue
        test = {"anchor": model.default_state, "null": model.null_state, "gate": model.gate_state}[which]
        if test is not None and test.all_sink_heads is not None:
            means.append(test.all_sink_heads.remove_increase.mean)
    if not means:
        return None
    return CostRange(len(means), statistics.fmean(means), min(means), max(means))


def measured_source(sources: dict[str, int]) -> str:
    """The kind's measured home of the default state: the source of most heads other than
    "none" (heads that carry no default state, e.g. the trigger's in a deep model); "none"
    when every head is "none"; ties name both, in ``DEFAULT_SOURCES`` order."""
    counted = {source: n for source, n in sources.items() if source != "none" and n > 0}
    if not counted:
        return "none"
    top = max(counted.values())
    return " / ".join(source for source in DEFAULT_SOURCES if counted.get(source) == top)


def kind_finding(kind: str, models: list[ModelSummary]) -> KindFinding:
    """One kind's finding from its models (every architecture and seed)."""
    prediction = PREDICTIONS[kind]
    converged = [model for model in models if model.converged]
    heads = [row for model in converged for row in model.heads]
    sources = Counter(row.default_source or "none" for row in heads)
    measured = measured_source(dict(sources))
    return KindFinding(
        kind=kind,
        predicted_source=prediction.source,
        predicted_needs_anchor=prediction.needs_anchor,
        why=prediction.why,
        n_runs=len(models),
        n_converged=len(converged),
        median_steps=float(statistics.median(m.steps for m in converged)) if converged else float("nan"),
        n_heads=len(heads),
        n_sink_heads=sum(row.is_sink_head for row in heads),
        anchor_mass=_mean([row.anchor_mass for row in heads]),
        null_mass=_mean([row.null_mass for row in heads]),
        gate_default=_mean([row.gate_default for row in heads]),
        gate_trigger=_mean([row.gate_trigger for row in heads]),
        sources={source: sources.get(source, 0) for source in DEFAULT_SOURCES},
        measured_source=measured,
        agrees=None if not heads else prediction.source in measured.split(" / "),
        remove_anchor=_cost(converged, "anchor"),
        remove_null=_cost(converged, "null"),
        open_gate=_cost(converged, "gate"),
        control=_cost(converged, "control"),
    )


def compare_mitigations(
    config: MitigationsConfig,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    progress: bool = True,
    device: str = "cpu",
    compile: str = "auto",
    executor: str = "local",
    ray_address: str | None = None,
    tracking: TrackingConfig | None = None,
) -> MitigationsSummary:
    """Train and evaluate every model of ``config`` into ``out_dir`` (a re-run resumes it);
    write ``summary.json`` and the figure. The arguments after ``out_dir`` are
    ``sinkscope.toy.reproduce.reproduce``'s."""
    check_argument(config, MitigationsConfig, "config", "a MitigationsConfig")
    check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path)")
    out_dir = Path(out_dir)
    target_device = unit_device(device, executor)  # before anything is written
    check_compile_choice(compile)
    if tracking is not None:
        tracking.check()
        tracking = tracking.for_units(out_dir)
    refuse_a_run_as_experiment_out(out_dir)
    with experiment_directory(out_dir, MITIGATIONS_FILE, config, "a mitigation comparison", overwrite) as work_dir:
        jobs = config.run_configs()
        started = time.perf_counter()
        by_name = run_jobs(
            jobs,
            work_dir,
            config.workers,
            config.n_sequences,
            progress,
            str(target_device),
            executor,
            ray_address,
            tracking,
            compile,
        )
        order = {kind: index for index, kind in enumerate(config.kinds)}
        models = sorted(
            (by_name[name] for name, _ in jobs),
            key=lambda m: (order[m.attention], m.n_layers, m.n_heads, m.seed),
        )
        kinds = [kind_finding(kind, [m for m in models if m.attention == kind]) for kind in config.kinds]
        summary = MitigationsSummary(config, models, kinds, round(time.perf_counter() - started, 2))
        write_result(work_dir / SUMMARY_FILE, summary)
        write_provenance(work_dir, "toy mitigations")
    return summary
