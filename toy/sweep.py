"""`sinkscope toy sweep`: the trigger task over a grid of sequence lengths, widths, heads,
layers, attention kinds, LayerNorm and MLP on/off, several seeds each, with a table and
plots of how often heads sink, the default-position error and how long models take to
converge. ``PHASE_DIAGRAM`` is the grid that asks where sinks form at all: every
attention kind x 1-4 layers x 1-4 heads x LayerNorm x MLP (``phase_diagram``).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.execution.outputs import experiment_directory
from sinkscope.infra.arguments import check_argument, check_path, refuse_duplicates
from sinkscope.infra.bounds import (
    NONNEGATIVE,
    POSITIVE,
    SAMPLES,
    SEEDS,
    Bound,
    Problem,
    check_bounds,
    relative_path_problems,
)
from sinkscope.infra.codec import Upgrade, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.interp.attention_kinds import validate_attention_kind
from sinkscope.toy.compiled_step import check_compile_choice
from sinkscope.toy.experiment import (
    SUMMARY_FILE,
    ModelSummary,
    heads_dataframe,
    run_jobs,
    upgrade_model_summary_v1,
)
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig, refuse_a_run_as_experiment_out
from sinkscope.toy.sweep_cells import Cell, SweepRow, upgrade_sweep_row_v1
from sinkscope.toy.sweep_plots import sweep_plots
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tracking import TrackingConfig
from sinkscope.toy.train import unit_device

SWEEP_FILE = "sweep.json"

if TYPE_CHECKING:
    import pandas

    from sinkscope.probes.probe import HeadProbe


@dataclass(frozen=True)
class SweepConfig:
    """The grid. Every combination of the tuples is one configuration, trained with
    ``seeds`` seeds; the evaluation trigger sits at 1-indexed 8 or, for shorter
    sequences, at the last position. Persisted as ``sweep.json``, the marker that lets
    a re-run resume (sweeps written before the LayerNorm and MLP axes read them as off)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "seq_lens": POSITIVE,
        "d_models": POSITIVE,
        "heads": POSITIVE,
        "layers": POSITIVE,
        "seeds": SEEDS,
        "max_steps": POSITIVE,
        "n_sequences": SAMPLES,
        "workers": POSITIVE,
    }

    SCHEMA: ClassVar[str] = "sweep_config"
    SCHEMA_VERSION: ClassVar[int] = 1

    seq_lens: tuple[int, ...] = (8, 16, 32)
    d_models: tuple[int, ...] = (8, 16, 32)
    heads: tuple[int, ...] = (1,)
    layers: tuple[int, ...] = (1,)
    attentions: tuple[str, ...] = ("softmax", "relu")
    layer_norms: tuple[bool, ...] = (False,)
    mlps: tuple[bool, ...] = (False,)
    seeds: int = 3
    max_steps: int = 20_000
    n_sequences: int = 500
    # how many run at once, not what is computed: a re-run may change it and still resume
    workers: int = field(default=2, compare=False)

    def __post_init__(self) -> None:
        for name in ("seq_lens", "d_models", "heads", "layers", "attentions", "layer_norms", "mlps"):
            if not getattr(self, name):
                raise InputError(f"the sweep needs at least one value for {name}", field=name)
            refuse_duplicates(getattr(self, name), name)
        for attention in self.attentions:
            validate_attention_kind(attention, field="attentions")
        check_bounds(self)  # seeds and the axes' values build the run list, a directory each
        # fail on an impossible grid point now, not after hours of training
        for seq_len, d_model in itertools.product(self.seq_lens, self.d_models):
            _task(seq_len, d_model)

    def grid(self) -> list[Cell]:
        """One ``Cell`` per configuration."""
        return [
            Cell(*values)
            for values in itertools.product(
                self.attentions, self.layers, self.heads, self.d_models, self.seq_lens, self.layer_norms, self.mlps
            )
        ]

    def jobs(self) -> list[tuple[str, RunConfig]]:
        jobs = []
        for cell in self.grid():
            for seed in range(self.seeds):
                model = ToyModelConfig(
                    n_layers=cell.n_layers,
                    n_heads=cell.n_heads,
                    attention=cell.attention,
                    d_model=cell.d_model,
                    seq_len=cell.seq_len,
                    layer_norm=cell.layer_norm,
                    mlp=cell.mlp,
                )
                config = RunConfig(
                    model, _task(cell.seq_len, cell.d_model), TrainConfig(seed=seed, max_steps=self.max_steps)
                )
                jobs.append((cell.run_name(seed), config))
        # costliest first (layers x heads x width x length) so parallel workers finish together
        return sorted(jobs, key=lambda job: -_cost(job[1]))


def phase_diagram(
    device_type: str, seeds: int | None = None, max_steps: int = 20_000, n_sequences: int = 500, workers: int = 2
) -> SweepConfig:
    """The sink phase diagram: softmax, relu, relu_prefix and sigmoid attention x layers x
    heads x LayerNorm off/on x MLP off/on at d_model 16, seq_len 16. On a GPU the full grid
    (4 x 4 x 4 x 2 x 2 = 256 configurations x 4 seeds = 1,024 models); on a CPU a small one
    (1-2 layers x 1-2 heads, MLP off: 32 configurations x 2 seeds = 64 models)."""
    full = device_type == "cuda"
    return SweepConfig(
        seq_lens=(16,),
        d_models=(16,),
        heads=(1, 2, 3, 4) if full else (1, 2),
        layers=(1, 2, 3, 4) if full else (1, 2),
        attentions=("softmax", "relu", "relu_prefix", "sigmoid"),
        layer_norms=(False, True),
        mlps=(False, True) if full else (False,),
        seeds=seeds if seeds is not None else (4 if full else 2),
        max_steps=max_steps,
        n_sequences=n_sequences,
        workers=workers,
    )


def _task(seq_len: int, d_model: int) -> TaskConfig:
    return TaskConfig(d_model=d_model, seq_len=seq_len, eval_trigger_position=min(7, seq_len - 1))


def _cost(config: RunConfig) -> int:
    model = config.model
    return model.n_layers * model.n_heads * model.d_model * model.seq_len


def upgrade_sweep_v1(result: dict[str, Any]) -> dict[str, Any]:
    """A sweep's ``summary.json`` of schema version 1 in version 2's names: each row
    (``upgrade_sweep_row_v1``) and each model summary (``upgrade_model_summary_v1``)."""
    return {
        **result,
        "rows": [upgrade_sweep_row_v1(row) for row in result.get("rows", [])],
        "models": [upgrade_model_summary_v1(model) for model in result.get("models", [])],
    }


@dataclass
class SweepResult:
    """The sweep (``summary.json``): one row per configuration, every model."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"wall_seconds": NONNEGATIVE}

    SCHEMA: ClassVar[str] = "sweep"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: SweepRow.n_layers/n_heads, ModelSummary version 2
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_sweep_v1}

    config: SweepConfig
    rows: list[SweepRow]
    models: list[ModelSummary]
    wall_seconds: float
    figures: list[str] = field(default_factory=list)

    def inconsistencies(self) -> Iterator[Problem]:
        """At least one configuration and one model; figures inside the result directory."""
        yield from relative_path_problems(self.figures)
        if not self.rows:
            yield "rows", "empty", "one row per configuration of the grid (at least one)"
        if not self.models:
            yield "models", "empty", "one summary per trained model (at least one)"

    def _repr_html_(self) -> str:
        """Inline display in a notebook: one row per configuration."""
        from sinkscope.toy.display import sweep_html  # the display imports this module's types for typing only

        return sweep_html(self)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (model, layer, head): the grid's axes (attention, n_layers, n_heads,
        d_model, seq_len, layer_norm, mlp), seed and outcome, every ``HeadProbe`` metric a
        column; the per-configuration aggregates are ``rows``."""
        axes = {
            cell.run_name(seed): {
                "d_model": cell.d_model,
                "seq_len": cell.seq_len,
                "layer_norm": cell.layer_norm,
                "mlp": cell.mlp,
            }
            for cell in self.config.grid()
            for seed in range(self.config.seeds)
        }
        return heads_dataframe(self.models, axes)


def aggregate(config: SweepConfig, by_name: dict[str, ModelSummary]) -> list[SweepRow]:
    rows = []
    for cell in config.grid():
        models = [by_name[cell.run_name(s)] for s in range(config.seeds)]
        head_rows = [row for m in models for row in m.heads]
        per_seed_fraction = [m.n_sink_heads / (cell.n_layers * cell.n_heads) for m in models]
        default_mses = [m.default_mse for m in models if m.default_mse is not None]
        rows.append(
            SweepRow(
                attention=cell.attention,
                n_layers=cell.n_layers,
                n_heads=cell.n_heads,
                d_model=cell.d_model,
                seq_len=cell.seq_len,
                seeds=len(models),
                converged=sum(m.converged for m in models),
                mean_steps=mean(m.steps for m in models),
                mean_seconds=mean(m.wall_seconds for m in models),
                sink_fraction=sum(r.is_sink_head for r in head_rows) / len(head_rows),
                mean_anchor_mass_default=mean(r.anchor_mass for r in head_rows),
                seeds_with_sink=sum(m.n_sink_heads > 0 for m in models),
                layer_norm=cell.layer_norm,
                mlp=cell.mlp,
                sink_fraction_range=(min(per_seed_fraction), max(per_seed_fraction)),
                steps_range=(min(m.steps for m in models), max(m.steps for m in models)),
                mean_default_mse=mean(default_mses) if default_mses else None,
                default_mse_range=(min(default_mses), max(default_mses)) if default_mses else None,
                mean_row_mass=_mean_row_mass(head_rows),
            )
        )
    return rows


def _mean_row_mass(heads: list[HeadProbe]) -> float | None:
    """The mean row mass over ``heads`` (None when no head measured it: older summaries)."""
    masses = [head.row_mass for head in heads if not math.isnan(head.row_mass)]
    return mean(masses) if masses else None


def sweep(
    config: SweepConfig,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    progress: bool = True,
    device: str = "cpu",
    compile: str = "auto",
    executor: str = "local",
    ray_address: str | None = None,
    tracking: TrackingConfig | None = None,
) -> SweepResult:
    """Train and evaluate the grid into ``out_dir``; writes ``summary.json`` and plots
    (``sinkscope report`` turns the directory into ``report.html`` and ``report.md``). Re-running with the same settings resumes: finished seed groups are read
    back. ``device``: where the models train (``cpu``, ``cuda[:N]`` or ``auto``);
    ``executor``/``ray_address``: where the units run (``sinkscope.toy.experiment.run_jobs``).
    ``compile``: ``auto``, ``on`` or ``off``, the training step compiled or not
    (``sinkscope.toy.train.train_seeds``; not a resume setting). ``tracking``: log every model that trains to W&B and/or TensorBoard, grouped by
    ``out_dir``'s name (``sinkscope.toy.tracking``); not a resume setting."""
    check_argument(config, SweepConfig, "config", "a SweepConfig")
    check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path)")
    out_dir = Path(out_dir)
    target_device = unit_device(device, executor)  # before anything is written
    check_compile_choice(compile)
    if tracking is not None:
        tracking.check()
        tracking = tracking.for_units(out_dir)  # grouped by this directory's name, not a staging one's
    refuse_a_run_as_experiment_out(out_dir)
    with experiment_directory(out_dir, SWEEP_FILE, config, "a sweep", overwrite) as work_dir:
        started = time.perf_counter()
        by_name = run_jobs(
            config.jobs(),
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
        rows = aggregate(config, by_name)
        models = [by_name[name] for name in sorted(by_name)]
        result = SweepResult(config, rows, models, round(time.perf_counter() - started, 2))
        result.figures = sweep_plots(config, rows, work_dir)
        write_result(work_dir / SUMMARY_FILE, result)
        write_provenance(work_dir, "toy sweep")
    return result
