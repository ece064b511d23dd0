"""Running many toy trainings as one experiment: the shared machinery of
``sinkscope toy reproduce`` and ``sinkscope toy sweep``.

Each job trains one model into its own run directory (resumable) and evaluates it the
way the paper's figures do; seeds of one configuration train together as one unit
(``execution``), which writes each run's ``evaluation.json`` when it finishes, so a
re-run skips it. Units run in worker processes (or Ray tasks) with one torch thread each
(``sinkscope.toy.train.TRAIN_THREADS``): the models are tiny, so more processes beat more threads
per process, and a unit keeps its speed when other work shares the machine.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.execution import Unit, run_units, units_failed
from sinkscope.infra.bounds import (
    COUNT,
    NONNEGATIVE,
    POSITIVE,
    UNBOUNDED,
    Bound,
    Problem,
    at_most,
    head_grid_problems,
    head_ref_problems,
    relative_path_problems,
)
from sinkscope.infra.codec import Upgrade, read_result, write_result
from sinkscope.probes.probe import HeadProbe
from sinkscope.reports.frames import dataframe, row_of
from sinkscope.toy.evaluate import ToyDefaultState, evaluate_run, upgrade_toy_default_state_v1
from sinkscope.toy.paper_reference import PAPER_SINK_HEADS, paper_reference
from sinkscope.toy.progress import ExperimentProgress
from sinkscope.toy.run_dir import RunConfig, TrainResult, checkpoint_dirs
from sinkscope.toy.tracking import RunTrackers, TrackingConfig
from sinkscope.toy.train import train_seeds

SUMMARY_FILE = "summary.json"  # an experiment's result (reproduce, sweep)
EVALUATION_FILE = "evaluation.json"  # a run's ModelSummary, written when its unit finishes

if TYPE_CHECKING:
    import pandas


# ModelSummary's fields renamed in schema version 2 (version 1 name -> version 2 name)
_MODEL_SUMMARY_V2_NAMES = {
    "layers": "n_layers",
    "heads": "n_heads",
    "heads_table": "heads",
    "default_state_test": "default_state",
    "paper_sink_heads": "paper_n_sink_heads",
}


def upgrade_model_summary_v1(summary: dict[str, Any]) -> dict[str, Any]:
    """A model summary of schema version 1 (``evaluation.json``, or a row of an
    experiment's ``summary.json``) in version 2's names: the counts ``layers``/``heads``
    are ``n_layers``/``n_heads``, the row list ``heads_table`` is ``heads``, the paper's
    count ``paper_sink_heads`` is ``paper_n_sink_heads``, and ``default_state_test`` is
    ``default_state``, itself upgraded (``upgrade_toy_default_state_v1``)."""
    upgraded = {_MODEL_SUMMARY_V2_NAMES.get(key, key): value for key, value in summary.items()}
    if isinstance(upgraded.get("default_state"), dict):
        upgraded["default_state"] = upgrade_toy_default_state_v1(upgraded["default_state"])
    return upgraded


@dataclass
class ModelSummary:
    """One trained and evaluated model of an experiment (a row of ``summary.json``; alone,
    its run's ``evaluation.json``)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "seed": UNBOUNDED,
        "steps": COUNT,
        "wall_seconds": NONNEGATIVE,
        "linf_error": NONNEGATIVE,
        "heldout_linf_error": NONNEGATIVE,
        "heldout_mse": NONNEGATIVE,
        "n_sink_heads": COUNT,
        "trigger_rows": NONNEGATIVE,
        "paper_n_sink_heads": COUNT,
        "default_mse": NONNEGATIVE,
    }

    SCHEMA: ClassVar[str] = "model_summary"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: n_layers, n_heads, heads, default_state, paper_n_sink_heads
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_model_summary_v1}

    name: str
    n_layers: int
    n_heads: int
    attention: str
    seed: int
    converged: bool
    status: str
    steps: int
    wall_seconds: float
    linf_error: float
    heldout_linf_error: float
    heldout_mse: float
    n_sink_heads: int
    heads: tuple[HeadProbe, ...]
    trigger_rows: tuple[tuple[float, ...], ...]
    default_state: ToyDefaultState | None
    paper: str
    paper_n_sink_heads: int | None
    figures: list[str]
    default_mse: float | None = None  # MSE at default positions (absent from older summaries)
    # the default-state test removing every head's null / forcing every gate open (mitigation kinds)
    null_state: ToyDefaultState | None = None
    gate_state: ToyDefaultState | None = None

    def inconsistencies(self) -> Iterator[Problem]:
        """Every (layer, head) of the model once; sink heads among them; figures inside the result."""
        yield from head_grid_problems(self.heads, self.n_layers, self.n_heads)
        yield from at_most("n_sink_heads", self.n_sink_heads, len(self.heads), "the number of heads")
        yield from relative_path_problems(self.figures)
        if self.converged != (self.status == "converged"):
            yield "converged", str(self.converged), f"{self.status == 'converged'} (status is {self.status!r})"
        if self.default_state is not None:
            refs = self.default_state.sink_heads
            yield from head_ref_problems(refs, self.n_layers, self.n_heads, "default_state.sink_heads")

    def _repr_html_(self) -> str:
        """Inline display in a notebook: training outcome and anchor mass per head."""
        from sinkscope.toy.display import model_html  # the display imports this module's types for typing only

        return model_html(self)


def heads_dataframe(
    models: Iterable[ModelSummary], settings: Mapping[str, Mapping[str, Any]] | None = None
) -> pandas.DataFrame:
    """One row per (model, layer, head) of an experiment: the model's settings and outcome
    (plus ``settings[model name]``, e.g. a sweep's grid axes), then every ``HeadProbe``
    metric."""
    settings = settings or {}
    return dataframe(
        row_of(
            row,
            model=m.name,
            attention=m.attention,
            n_layers=m.n_layers,
            n_heads=m.n_heads,
            **settings.get(m.name, {}),
            seed=m.seed,
            status=m.status,
            steps=m.steps,
        )
        for m in models
        for row in m.heads
    )


def seed_groups(jobs: list[tuple[str, RunConfig]], workers: int) -> list[list[tuple[str, RunConfig]]]:
    """Jobs whose configs differ only in ``train.seed``, in groups trained as one batched
    computation (``sinkscope.toy.train.train_seeds``): at most ceil(seeds / workers) seeds a group, so
    every worker gets a share of the costliest configuration. Order is kept (groups
    follow their first job), so costliest-first stays costliest-first."""
    by_key: dict[RunConfig, list[tuple[str, RunConfig]]] = {}
    for name, config in jobs:
        by_key.setdefault(config.without_seed(), []).append((name, config))
    groups = []
    for members in by_key.values():
        size = -(-len(members) // max(1, workers))
        groups += [members[start : start + size] for start in range(0, len(members), size)]
    return groups


def train_and_evaluate(
    group: list[tuple[str, RunConfig]],
    out_dir: str,
    n_sequences: int,
    device: str = "cpu",
    tracking: TrackingConfig | None = None,
    compile: str = "auto",
) -> list[ModelSummary]:
    """One unit of an experiment: train (or resume) ``out_dir/name`` for each job of
    ``group`` (one config, or seeds of one config trained together) on ``device``,
    evaluate each (on the CPU) and write its ``evaluation.json``, the mark of a finished
    run that a re-run skips. ``tracking``: each run is a tracked run, opened here (in the
    unit's own process), with its evaluation (``evaluation_values``) beside its result.
    ``compile``: the training step compiled or not (``train_seeds``)."""
    names, configs = [name for name, _ in group], [config for _, config in group]
    run_dirs = [Path(out_dir) / name for name in names]
    with RunTrackers(tracking, list(zip(run_dirs, configs))) as trackers:
        results = train_seeds(configs, run_dirs, progress=False, device=device, on_log=trackers.on_log, compile=compile)
        summaries = [
            _evaluate(name, config, result, Path(out_dir), n_sequences)
            for name, config, result in zip(names, configs, results)
        ]
        for run_dir, summary in zip(run_dirs, summaries):
            trackers.summary(run_dir, evaluation_values(summary))
            write_result(run_dir / EVALUATION_FILE, summary)
    return summaries


def evaluation_values(summary: ModelSummary) -> dict[str, float | str]:
    """What a tracked run gets from its evaluation, under ``eval/``: held-out errors, the
    number of sink heads and each head's anchor mass (``eval/anchor_mass/L{layer}H{head}``)."""
    values: dict[str, float | str] = {
        "eval/heldout_linf_error": summary.heldout_linf_error,
        "eval/heldout_mse": summary.heldout_mse,
        "eval/n_sink_heads": float(summary.n_sink_heads),
    }
    if summary.default_mse is not None:
        values["eval/default_mse"] = summary.default_mse
    for row in summary.heads:
        values[f"eval/anchor_mass/L{row.layer}H{row.head}"] = row.anchor_mass
    return values


def _unit(
    group: list[tuple[str, RunConfig]],
    out_dir: Path,
    n_sequences: int,
    device: str,
    tracking: TrackingConfig | None,
    compile: str,
) -> Unit:
    """A seed group as a unit: a CPU each, a GPU each when training on CUDA."""
    return Unit(
        name="+".join(name for name, _ in group),
        function=train_and_evaluate,
        args=(group, str(out_dir), n_sequences, device, tracking, compile),
        gpus=1 if device.startswith("cuda") else 0,
    )


def _evaluated(group: list[tuple[str, RunConfig]], out_dir: Path) -> list[ModelSummary] | None:
    """The group's summaries when every run of it finished in an earlier invocation."""
    paths = [out_dir / name / EVALUATION_FILE for name, _ in group]
    if not all(path.is_file() for path in paths):
        return None
    return [read_result(path, ModelSummary, "delete it to evaluate the run again") for path in paths]


def _evaluate(name: str, config: RunConfig, result: TrainResult, out_dir: Path, n_sequences: int) -> ModelSummary:
    evaluation = evaluate_run(out_dir / name, n_sequences)
    key = (config.model.attention, config.model.n_layers, config.model.n_heads)
    return ModelSummary(
        name=name,
        n_layers=config.model.n_layers,
        n_heads=config.model.n_heads,
        attention=config.model.attention,
        seed=config.train.seed,
        converged=result.converged,
        status=result.status,
        steps=result.steps,
        wall_seconds=round(result.wall_seconds, 2),
        linf_error=result.linf_error,
        heldout_linf_error=evaluation.heldout_linf_error,
        heldout_mse=evaluation.heldout_mse,
        n_sink_heads=len(evaluation.sink_heads()),
        heads=evaluation.heads,
        trigger_rows=evaluation.trigger_rows,
        default_state=evaluation.default_state,
        paper=paper_reference(*key),
        paper_n_sink_heads=PAPER_SINK_HEADS.get(key),
        figures=[f"{name}/{figure}" for figure in evaluation.figures],
        default_mse=evaluation.default_mse,
        null_state=evaluation.null_state,
        gate_state=evaluation.gate_state,
    )


def _say_what_resumes(out_dir: Path, to_train: list[str], finished: int) -> None:
    """One stderr line when a re-run picks up earlier work: how many finished runs it
    keeps and how many continue from their checkpoints (stdout and --json unchanged)."""
    resumed = sum(1 for name in to_train if checkpoint_dirs(out_dir / name))
    if finished or resumed:
        print(
            f"sinkscope: resuming {out_dir}: {finished} finished run(s) kept, {resumed} run(s) continue from their "
            f"checkpoints, {len(to_train) - resumed} start from step 0",
            file=sys.stderr,
        )


def run_jobs(
    jobs: list[tuple[str, RunConfig]],
    out_dir: Path,
    workers: int,
    n_sequences: int,
    progress: bool = True,
    device: str = "cpu",
    executor: str = "local",
    ray_address: str | None = None,
    tracking: TrackingConfig | None = None,
    compile: str = "auto",
) -> dict[str, ModelSummary]:
    """Train and evaluate every ``(run name, config)`` job as units (``execution``): seeds
    of one config train together (``seed_groups``), one unit per group, on ``workers``
    local processes (1: in this process) or on Ray (``executor="ray"``, ``ray_address``:
    None starts a local instance, ``auto`` or ``host:port`` joins a cluster). Groups
    that finished in an earlier invocation are read back, not rerun; a failed unit stops
    no other, and the failures are one ``UnitsFailed`` at the end. Pass the costliest
    jobs first so the workers finish together. ``progress``: one line per running model
    on stderr (``sinkscope.toy.progress``). ``tracking``: each unit logs its runs there (give it
    the experiment's group and absolute paths: ``TrackingConfig.for_units``). ``compile``:
    each unit's training step compiled or not (``train_seeds``)."""
    groups = seed_groups(jobs, workers)
    # absolute paths: a Ray worker on another node has its own working directory
    units = [_unit(group, out_dir.resolve(), n_sequences, device, tracking, compile) for group in groups]
    done = {unit.name: _evaluated(group, out_dir) for unit, group in zip(units, groups)}
    pending = [name for unit, group in zip(units, groups) if done[unit.name] is None for name, _ in group]
    _say_what_resumes(out_dir, pending, finished=len(jobs) - len(pending))
    with ExperimentProgress(out_dir, jobs, enabled=progress):
        report = run_units(
            units,
            executor,
            workers,
            ray_address,
            skip=lambda unit: done[unit.name] is not None,
        )
    if report.failed:
        raise units_failed(report.failed, len(units), "training")
    by_name: dict[str, ModelSummary] = {}
    for unit in units:
        for summary in report.finished.get(unit.name) or done[unit.name] or []:
            by_name[summary.name] = summary
    return by_name
