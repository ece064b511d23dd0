"""`sinkscope toy sweep`: the trigger task over a grid of sequence lengths, widths, heads,
layers and attention kinds, several seeds each, with a table and plots of how often
heads sink and how long models take to converge.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean

import numpy as np

from interp.atomic_io import atomic_write_json, atomic_write_text
from interp.attention_kinds import validate_attention_kind
from interp.plots import bar_chart, heatmap
from interp.provenance import write_provenance
from toy.experiment import ModelSummary, markdown_table, experiment_directory, run_jobs
from toy.model import ToyModelConfig
from toy.run_dir import RunConfig, TrainConfig
from toy.task import TaskConfig
from toy.train import resolve_device

SWEEP_FILE = "sweep.json"


@dataclass(frozen=True)
class SweepConfig:
    """The grid. Every combination of the tuples is one configuration, trained with
    ``seeds`` seeds; the evaluation trigger sits at 1-indexed 8 or, for shorter
    sequences, at the last position."""

    seq_lens: tuple[int, ...] = (8, 16, 32)
    d_models: tuple[int, ...] = (8, 16, 32)
    heads: tuple[int, ...] = (1,)
    layers: tuple[int, ...] = (1,)
    attentions: tuple[str, ...] = ("softmax", "relu")
    seeds: int = 3
    max_steps: int = 20_000
    n_sequences: int = 500
    workers: int = 2

    def __post_init__(self) -> None:
        for name in ("seq_lens", "d_models", "heads", "layers", "attentions"):
            if not getattr(self, name):
                raise ValueError(f"the sweep needs at least one value for {name}")
        for attention in self.attentions:
            validate_attention_kind(attention)
        for name in ("seeds", "max_steps", "n_sequences", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        # fail on an impossible grid point now, not after hours of training
        for seq_len, d_model in itertools.product(self.seq_lens, self.d_models):
            _task(seq_len, d_model)

    def grid(self) -> list[tuple[str, int, int, int, int]]:
        """(attention, layers, heads, d_model, seq_len) per configuration."""
        return list(itertools.product(self.attentions, self.layers, self.heads, self.d_models, self.seq_lens))

    def jobs(self) -> list[tuple[str, RunConfig]]:
        jobs = []
        for attention, layers, heads, d_model, seq_len in self.grid():
            for seed in range(self.seeds):
                model = ToyModelConfig(n_layers=layers, n_heads=heads, attention=attention, d_model=d_model, seq_len=seq_len)
                config = RunConfig(model, _task(seq_len, d_model), TrainConfig(seed=seed, max_steps=self.max_steps))
                jobs.append((run_name(attention, layers, heads, d_model, seq_len, seed), config))
        # costliest first (layers x heads x width x length) so parallel workers finish together
        return sorted(jobs, key=lambda job: -_cost(job[1]))

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _task(seq_len: int, d_model: int) -> TaskConfig:
    return TaskConfig(d_model=d_model, seq_len=seq_len, eval_trigger_position=min(7, seq_len - 1))


def _cost(config: RunConfig) -> int:
    model = config.model
    return model.n_layers * model.n_heads * model.d_model * model.seq_len


def run_name(attention: str, layers: int, heads: int, d_model: int, seq_len: int, seed: int) -> str:
    return f"{attention}-{layers}x{heads}-d{d_model}-L{seq_len}-seed{seed}"


@dataclass
class SweepRow:
    """One configuration, aggregated over its seeds. ``sink_fraction``: the share of all
    its heads (over seeds) with ``anchor_mass_default >= 0.9``; steps and seconds are
    means over seeds."""

    attention: str
    layers: int
    heads: int
    d_model: int
    seq_len: int
    seeds: int
    converged: int
    mean_steps: float
    mean_seconds: float
    sink_fraction: float
    mean_anchor_mass_default: float
    seeds_with_sink: int

    @property
    def label(self) -> str:
        return f"{self.attention} {self.layers}x{self.heads} d{self.d_model} L{self.seq_len}"


@dataclass
class SweepResult:
    config: SweepConfig
    rows: list[SweepRow]
    models: list[ModelSummary]
    wall_seconds: float
    figures: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict) -> "SweepResult":
        """Read back ``summary.json``."""
        config = {k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()}
        return cls(
            config=SweepConfig(**config),
            rows=[SweepRow(**row) for row in data["rows"]],
            models=[ModelSummary.from_dict(model) for model in data["models"]],
            wall_seconds=data["wall_seconds"],
            figures=list(data["figures"]),
        )

    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "wall_seconds": self.wall_seconds,
            "figures": self.figures,
            "rows": [asdict(row) for row in self.rows],
            "models": [model.to_dict() for model in self.models],
        }


def aggregate(config: SweepConfig, by_name: dict[str, ModelSummary]) -> list[SweepRow]:
    rows = []
    for attention, layers, heads, d_model, seq_len in config.grid():
        models = [by_name[run_name(attention, layers, heads, d_model, seq_len, s)] for s in range(config.seeds)]
        head_rows = [row for m in models for row in m.heads_table]
        rows.append(SweepRow(
            attention=attention, layers=layers, heads=heads, d_model=d_model, seq_len=seq_len,
            seeds=len(models),
            converged=sum(m.converged for m in models),
            mean_steps=mean(m.steps for m in models),
            mean_seconds=mean(m.wall_seconds for m in models),
            sink_fraction=sum(r.is_sink_head for r in head_rows) / len(head_rows),
            mean_anchor_mass_default=mean(r.anchor_mass_default for r in head_rows),
            seeds_with_sink=sum(m.n_sink_heads > 0 for m in models),
        ))
    return rows


def _plots(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    figures = []
    labels = [row.label for row in rows]
    bar_chart(labels, [("sink fraction", [row.sink_fraction for row in rows])], out_dir / "sink_fraction.png",
              "fraction of sink heads per configuration", "sink fraction")
    bar_chart(labels, [("mean steps", [row.mean_steps for row in rows])], out_dir / "steps_to_converge.png",
              f"mean training steps (cap {config.max_steps})", "steps")
    figures += ["sink_fraction.png", "steps_to_converge.png"]
    if len(config.d_models) > 1 and len(config.seq_lens) > 1:
        for attention, layers, heads in itertools.product(config.attentions, config.layers, config.heads):
            grid = np.array([[next(r.sink_fraction for r in rows if (r.attention, r.layers, r.heads, r.d_model, r.seq_len)
                                   == (attention, layers, heads, d, L)) for L in config.seq_lens] for d in config.d_models])
            name = f"sink_fraction_{attention}_{layers}x{heads}.png"
            heatmap(grid, out_dir / name, f"{attention} {layers}x{heads}: sink fraction",
                    "sink fraction", xlabel="seq_len index " + str(list(config.seq_lens)),
                    ylabel="d_model index " + str(list(config.d_models)))
            figures.append(name)
    return figures


def sweep_markdown(result: SweepResult) -> str:
    header = ["attention", "layers x heads", "d_model", "seq_len", "converged", "mean steps",
              "mean seconds", "sink fraction", "seeds with a sink", "mean anchor_mass_default"]
    table = markdown_table(header, [[
        r.attention, f"{r.layers}x{r.heads}", str(r.d_model), str(r.seq_len), f"{r.converged}/{r.seeds}",
        f"{r.mean_steps:.0f}", f"{r.mean_seconds:.1f}", f"{r.sink_fraction:.2f}", f"{r.seeds_with_sink}/{r.seeds}",
        f"{r.mean_anchor_mass_default:.3f}",
    ] for r in result.rows])
    return (
        "# Toy sweep: how often do heads sink?\n\n"
        f"{len(result.rows)} configurations x {result.config.seeds} seeds, up to {result.config.max_steps} steps; "
        f"wall time {result.wall_seconds:.0f} s. A head sinks when its BOS mass at non-trigger queries is >= 0.9.\n\n"
        + table + "\n" + " ".join(f"![{Path(f).stem}]({f})" for f in result.figures) + "\n"
    )


def sweep(
    config: SweepConfig, out_dir: str | os.PathLike, overwrite: bool = False, progress: bool = True, device: str = "cpu"
) -> SweepResult:
    """Train and evaluate the grid into ``out_dir``; writes ``summary.json``, ``summary.md``
    and plots. Re-running with the same settings resumes. ``device``: where the models
    train (``cpu``, ``cuda[:N]`` or ``auto``)."""
    out_dir = Path(out_dir)
    target_device = resolve_device(device)  # before anything is written
    with experiment_directory(out_dir, SWEEP_FILE, config.to_dict(), "a sweep", overwrite) as work_dir:
        started = time.perf_counter()
        by_name = run_jobs(config.jobs(), work_dir, config.workers, config.n_sequences, progress, str(target_device))
        rows = aggregate(config, by_name)
        models = [by_name[name] for name in sorted(by_name)]
        result = SweepResult(config, rows, models, round(time.perf_counter() - started, 2))
        result.figures = _plots(config, rows, work_dir)
        atomic_write_json(work_dir / "summary.json", result.to_dict())
        atomic_write_text(work_dir / "summary.md", sweep_markdown(result))
        write_provenance(work_dir, "toy sweep")
    return result
