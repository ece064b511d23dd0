"""`sinkscope toy sweep`: the trigger task over a grid of sequence lengths, widths, heads,
layers, attention kinds, LayerNorm and MLP on/off, several seeds each, with a table and
plots of how often heads sink, the default-position error and how long models take to
converge. ``PHASE_DIAGRAM`` is the grid that asks where sinks form at all: every
attention kind x 1-4 layers x 1-4 heads x LayerNorm x MLP (``phase_diagram``).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sinkscope.execution.outputs import experiment_directory
from sinkscope.infra.codec import Upgrade, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.interp.attention_kinds import validate_attention_kind
from sinkscope.reports.plots import bar_chart, heatmap
from sinkscope.toy.experiment import (
    SUMMARY_FILE,
    ModelSummary,
    heads_dataframe,
    run_jobs,
    upgrade_model_summary_v1,
)
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tracking import TrackingConfig
from sinkscope.toy.train import unit_device

SWEEP_FILE = "sweep.json"

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True)
class SweepConfig:
    """The grid. Every combination of the tuples is one configuration, trained with
    ``seeds`` seeds; the evaluation trigger sits at 1-indexed 8 or, for shorter
    sequences, at the last position. Persisted as ``sweep.json``, the marker that lets
    a re-run resume (sweeps written before the LayerNorm and MLP axes read them as off)."""

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
        for attention in self.attentions:
            validate_attention_kind(attention)
        for name in ("seeds", "max_steps", "n_sequences", "workers"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
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


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid."""

    attention: str
    n_layers: int
    n_heads: int
    d_model: int
    seq_len: int
    layer_norm: bool = False
    mlp: bool = False

    @property
    def extras(self) -> str:
        return "".join(suffix for flag, suffix in ((self.layer_norm, "-ln"), (self.mlp, "-mlp")) if flag)

    def run_name(self, seed: int) -> str:
        return (
            f"{self.attention}-{self.n_layers}x{self.n_heads}-d{self.d_model}-L{self.seq_len}{self.extras}-seed{seed}"
        )


@dataclass
class SweepRow:
    """One configuration, aggregated over its seeds. ``sink_fraction``: the share of all
    its heads (over seeds) with ``anchor_mass_default >= 0.9``; steps and seconds are
    means over seeds. ``*_range``: the smallest and largest value over the seeds (per
    seed, the sink fraction is that model's share of sink heads); ``mean_default_mse``:
    the mean over seeds of the MSE at default (non-trigger) positions."""

    attention: str
    n_layers: int
    n_heads: int
    d_model: int
    seq_len: int
    seeds: int
    converged: int
    mean_steps: float
    mean_seconds: float
    sink_fraction: float
    mean_anchor_mass_default: float
    seeds_with_sink: int
    layer_norm: bool = False
    mlp: bool = False
    sink_fraction_range: tuple[float, float] | None = None
    steps_range: tuple[int, int] | None = None
    mean_default_mse: float | None = None
    default_mse_range: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        extras = "".join(text for flag, text in ((self.layer_norm, " +LN"), (self.mlp, " +MLP")) if flag)
        return f"{self.attention} {self.n_layers}x{self.n_heads} d{self.d_model} L{self.seq_len}{extras}"


def upgrade_sweep_row_v1(row: dict[str, Any]) -> dict[str, Any]:
    """A ``SweepRow`` of schema version 1 in today's names: its counts ``layers``/``heads``
    are ``n_layers``/``n_heads``."""
    names = {"layers": "n_layers", "heads": "n_heads"}
    return {names.get(key, key): value for key, value in row.items()}


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

    SCHEMA: ClassVar[str] = "sweep"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: SweepRow.n_layers/n_heads, ModelSummary version 2
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_sweep_v1}

    config: SweepConfig
    rows: list[SweepRow]
    models: list[ModelSummary]
    wall_seconds: float
    figures: list[str] = field(default_factory=list)

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
            )
        )
    return rows


def _plots(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Write every sweep figure into ``out_dir``; their file names, in writing order."""
    return [
        *_summary_bars(config, rows, out_dir),
        *_size_heatmaps(config, rows, out_dir),
        *_phase_diagrams(config, rows, out_dir),
    ]


def _summary_bars(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Bar charts of the sink fraction and of the mean training steps per configuration."""
    labels = [row.label for row in rows]
    bar_chart(
        labels,
        [("sink fraction", [row.sink_fraction for row in rows])],
        out_dir / "sink_fraction.png",
        "fraction of sink heads per configuration",
        "sink fraction",
    )
    bar_chart(
        labels,
        [("mean steps", [row.mean_steps for row in rows])],
        out_dir / "steps_to_converge.png",
        f"mean training steps (cap {config.max_steps})",
        "steps",
    )
    return ["sink_fraction.png", "steps_to_converge.png"]


def _size_heatmaps(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Sink fraction over d_model x seq_len, one heatmap per kind, shape and block (none
    unless both sizes vary)."""
    figures = []
    for attention, layers, heads, layer_norm, mlp in itertools.product(
        config.attentions, config.layers, config.heads, config.layer_norms, config.mlps
    ):
        if len(config.d_models) == 1 or len(config.seq_lens) == 1:
            break
        grid = np.array(
            [
                [_row(rows, attention, layers, heads, d, L, layer_norm, mlp).sink_fraction for L in config.seq_lens]
                for d in config.d_models
            ]
        )
        extras = Cell(attention, layers, heads, 0, 0, layer_norm, mlp).extras.replace("-", "_")
        name = f"sink_fraction_{attention}_{layers}x{heads}{extras}.png"
        heatmap(
            grid,
            out_dir / name,
            f"{attention} {layers}x{heads}{extras}: sink fraction",
            "sink fraction",
            xlabel="seq_len",
            ylabel="d_model",
            x_tick_labels=[str(L) for L in config.seq_lens],
            y_tick_labels=[str(d) for d in config.d_models],
        )
        figures.append(name)
    return figures


def _phase_diagrams(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """The phase diagram: sink fraction over layers x heads, one heatmap per kind, block
    and size (none unless layers or heads vary)."""
    figures: list[str] = []
    if len(config.layers) <= 1 and len(config.heads) <= 1:
        return figures
    for attention, layer_norm, mlp, d_model, seq_len in itertools.product(
        config.attentions, config.layer_norms, config.mlps, config.d_models, config.seq_lens
    ):
        grid = np.array(
            [
                [
                    _row(rows, attention, layers, heads, d_model, seq_len, layer_norm, mlp).sink_fraction
                    for heads in config.heads
                ]
                for layers in config.layers
            ]
        )
        cell = Cell(attention, 0, 0, d_model, seq_len, layer_norm, mlp)
        name = f"phase_{attention}_d{d_model}_L{seq_len}{cell.extras.replace('-', '_')}.png"
        heatmap(
            grid,
            out_dir / name,
            f"{attention}{cell.extras.replace('-', ' +')}: sink fraction by layers x heads",
            "sink fraction",
            xlabel="heads",
            ylabel="layers",
            vmin=0.0,
            vmax=1.0,
            x_tick_labels=[str(h) for h in config.heads],
            y_tick_labels=[str(n) for n in config.layers],
        )
        figures.append(name)
    return figures


def _row(
    rows: list[SweepRow],
    attention: str,
    layers: int,
    heads: int,
    d_model: int,
    seq_len: int,
    layer_norm: bool,
    mlp: bool,
) -> SweepRow:
    key = (attention, layers, heads, d_model, seq_len, layer_norm, mlp)
    return next(
        r for r in rows if (r.attention, r.n_layers, r.n_heads, r.d_model, r.seq_len, r.layer_norm, r.mlp) == key
    )


def sweep(
    config: SweepConfig,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    progress: bool = True,
    device: str = "cpu",
    executor: str = "local",
    ray_address: str | None = None,
    tracking: TrackingConfig | None = None,
) -> SweepResult:
    """Train and evaluate the grid into ``out_dir``; writes ``summary.json`` and plots
    (``sinkscope report`` turns the directory into ``report.html`` and ``report.md``). Re-running with the same settings resumes: finished seed groups are read
    back. ``device``: where the models train (``cpu``, ``cuda[:N]`` or ``auto``);
    ``executor``/``ray_address``: where the units run (``sinkscope.toy.experiment.run_jobs``).
    ``tracking``: log every model that trains to W&B and/or TensorBoard, grouped by
    ``out_dir``'s name (``sinkscope.toy.tracking``); not a resume setting."""
    out_dir = Path(out_dir)
    target_device = unit_device(device, executor)  # before anything is written
    if tracking is not None:
        tracking.check()
        tracking = tracking.for_units(out_dir)  # grouped by this directory's name, not a staging one's
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
        )
        rows = aggregate(config, by_name)
        models = [by_name[name] for name in sorted(by_name)]
        result = SweepResult(config, rows, models, round(time.perf_counter() - started, 2))
        result.figures = _plots(config, rows, work_dir)
        write_result(work_dir / SUMMARY_FILE, result)
        write_provenance(work_dir, "toy sweep")
    return result
