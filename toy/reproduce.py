"""Reproduce the paper: train the six models (1x1, 2x2, 4x4 layers x heads; softmax and
ReLU) over several seeds, evaluate each like the paper's figures, and write
``summary.json`` and per-model heatmaps (``sinkscope report`` turns the directory into
``report.html`` and ``report.md``, the reproduction's one Markdown file).

Runs are independent, so they train in parallel worker processes (``sinkscope.toy.experiment``):
the seeds of one architecture train together as one batched computation
(``sinkscope.toy.train.train_seeds``), split across the workers. Every run lives in its own run directory, so an interrupted reproduction resumes
where it stopped.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.execution.outputs import experiment_directory
from sinkscope.infra.arguments import check_argument, check_path, check_seed, refuse_duplicates
from sinkscope.infra.bounds import (
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
from sinkscope.infra.codec import Upgrade, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.reports.formatting import plural
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
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tracking import TrackingConfig
from sinkscope.toy.tradeoff import write_tradeoff
from sinkscope.toy.train import unit_device

PAPER_ARCHITECTURES: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 4))
PAPER_ATTENTIONS: tuple[str, ...] = ("softmax", "relu")
QUICK_MAX_STEPS = 8_000
REPRODUCE_FILE = "reproduce.json"

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True)
class ReproduceConfig:
    """What to train. ``quick()`` is the README's preset: one seed, capped steps.
    Persisted as ``reproduce.json``, the marker that lets a re-run resume."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "seeds": SEEDS,
        "first_seed": SEED,
        "architectures": POSITIVE,
        "max_steps": POSITIVE,
        "n_sequences": SAMPLES,
        "workers": POSITIVE,
    }

    SCHEMA: ClassVar[str] = "reproduce_config"
    SCHEMA_VERSION: ClassVar[int] = 1

    seeds: int = 3
    first_seed: int = 0
    architectures: tuple[tuple[int, int], ...] = PAPER_ARCHITECTURES
    attentions: tuple[str, ...] = PAPER_ATTENTIONS
    max_steps: int = 50_000
    n_sequences: int = 1000
    # how many run at once, not what is computed: a re-run may change it and still resume
    workers: int = field(default=2, compare=False)
    task: TaskConfig = field(default_factory=TaskConfig)

    def __post_init__(self) -> None:
        for name in ("seeds", "first_seed", "workers", "max_steps", "n_sequences"):
            check_argument(getattr(self, name), int, name, "an integer")
        check_bounds(self)  # seeds: the run list, a directory each, is built whole before anything trains
        check_seed(self.first_seed + self.seeds - 1, "first_seed")  # the last seed trained
        refuse_duplicates(self.architectures, "architectures")
        refuse_duplicates(self.attentions, "attentions")
        for layers, heads in self.architectures:
            if layers < 1 or heads < 1:
                raise InputError(f"architecture {layers}x{heads} needs >= 1 layer and head", field="architectures")

    @classmethod
    def quick(cls, **overrides) -> ReproduceConfig:
        return cls(**{"seeds": 1, "max_steps": QUICK_MAX_STEPS, **overrides})

    def run_configs(self) -> list[tuple[str, RunConfig]]:
        """(run directory name, config) per model, the costliest first so that parallel
        workers finish together."""
        jobs = []
        for layers, heads in self.architectures:
            for attention in self.attentions:
                for seed in range(self.first_seed, self.first_seed + self.seeds):
                    model = ToyModelConfig(
                        n_layers=layers,
                        n_heads=heads,
                        attention=attention,
                        d_model=self.task.d_model,
                        seq_len=self.task.seq_len,
                    )
                    train_config = TrainConfig(seed=seed, max_steps=self.max_steps)
                    jobs.append((f"{attention}-{layers}x{heads}-seed{seed}", RunConfig(model, self.task, train_config)))
        return sorted(jobs, key=lambda job: -job[1].model.n_layers * job[1].model.n_heads)


@dataclass
class Check:
    """One of the paper's claims, checked on our numbers."""

    claim: str
    passed: bool
    detail: str


def upgrade_reproduction_v1(summary: dict[str, Any]) -> dict[str, Any]:
    """A reproduction's ``summary.json`` of schema version 1 in version 2's names: each
    model summary upgraded (``upgrade_model_summary_v1``)."""
    return {**summary, "models": [upgrade_model_summary_v1(model) for model in summary.get("models", [])]}


@dataclass
class ReproduceSummary:
    """The reproduction (``summary.json``): every model, the paper's claims checked."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"wall_seconds": NONNEGATIVE}

    SCHEMA: ClassVar[str] = "reproduction"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: ModelSummary version 2
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_reproduction_v1}

    config: ReproduceConfig
    models: list[ModelSummary]
    checks: list[Check]
    wall_seconds: float
    figures: list[str] = field(default_factory=list)

    def inconsistencies(self) -> Iterator[Problem]:
        """Figures inside the result directory; a model said to converge below the stop threshold."""
        yield from relative_path_problems(self.figures)
        stop_linf = TrainConfig().stop_linf  # every reproduction trains with the paper's threshold
        for index, model in enumerate(self.models):
            if model.converged and not model.linf_error < stop_linf:
                yield (
                    f"models[{index}].converged",
                    f"True with linf_error {model.linf_error:g}",
                    f"linf_error < {stop_linf:g}",
                )

    def _repr_html_(self) -> str:
        """Inline display in a notebook: the paper's checks, the models, the anchor-mass map."""
        from sinkscope.toy.display import reproduction_html  # the display imports this module's types for typing only

        return reproduction_html(self)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (model, layer, head), every ``HeadProbe`` metric a column."""
        return heads_dataframe(self.models)


def _one_head_checks(m: ModelSummary) -> list[Check]:
    """The paper's claims about a 1-layer, 1-head model's head (softmax or ReLU)."""
    if (m.n_layers, m.n_heads) != (1, 1) or m.attention not in ("softmax", "relu"):
        return []
    row = m.heads[0]
    if m.attention == "relu":
        return [
            Check(
                f"{m.name}: off-trigger rows sum to <= 0.01",
                row.row_mass <= 0.01,
                f"row_mass = {row.row_mass:.4f}",
            )
        ]
    trigger_keys = m.trigger_rows[0][1:]
    worst = max(abs(w - 1 / len(trigger_keys)) for w in trigger_keys)
    return [
        Check(
            f"{m.name}: off-trigger BOS mass >= 0.99",
            row.anchor_mass >= 0.99,
            f"anchor_mass = {row.anchor_mass:.4f}",
        ),
        Check(
            f"{m.name}: trigger row within 0.03 of 1/{len(trigger_keys)} on each content key",
            worst <= 0.03,
            f"largest deviation {worst:.4f}",
        ),
    ]


def _default_state_checks(m: ModelSummary) -> list[Check]:
    """The default-state claim for a softmax model with sink heads: removing the sinks
    raises the default-position error far more than the matched control."""
    test = m.default_state
    if (
        m.attention != "softmax"
        or test is None
        or not test.sink_heads
        or test.default_error_before is None
        or test.default_error_after_remove is None
        or test.default_error_after_control is None
    ):
        return []
    remove_rise = test.default_error_after_remove - test.default_error_before
    control_rise = max(test.default_error_after_control - test.default_error_before, 0.0)
    return [
        Check(
            f"{m.name}: removing the sinks raises default-position error >= 10x more than the control",
            remove_rise >= 10 * control_rise and remove_rise > 0,
            f"MSE {test.default_error_before:.1e} -> {test.default_error_after_remove:.1e} (remove) vs "
            f"{test.default_error_after_control:.1e} (control)",
        )
    ]


def check_claims(models: list[ModelSummary], stop_linf: float) -> list[Check]:
    """The paper's claims that every seed must satisfy, as pass/fail lines."""
    checks: list[Check] = []
    for m in models:
        checks += _one_head_checks(m)
        if m.n_layers > 1 and m.attention == "softmax":
            checks.append(
                Check(
                    f"{m.name}: at least one sink head (Theorem 2)",
                    m.n_sink_heads >= 1,
                    f"sink heads: {m.n_sink_heads} of {len(m.heads)}",
                )
            )
        checks += _default_state_checks(m)
        if m.attention != "softmax":
            worst_row = max(r.row_mass for r in m.heads)
            checks.append(
                Check(
                    f"{m.name}: no head attends off-trigger (row mass <= 0.05)",
                    worst_row <= 0.05,
                    f"largest off-trigger row mass {worst_row:.4f}",
                )
            )
        checks.append(
            Check(
                f"{m.name}: reaches L-inf < {stop_linf:g}",
                m.converged,
                f"{m.status} after {plural(m.steps, 'step')}, batch L-inf {m.linf_error:.2e}, "
                f"held-out L-inf {m.heldout_linf_error:.2e}",
            )
        )
    return checks


def reproduce(
    config: ReproduceConfig,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    progress: bool = True,
    device: str = "cpu",
    compile: str = "auto",
    executor: str = "local",
    ray_address: str | None = None,
    tracking: TrackingConfig | None = None,
) -> ReproduceSummary:
    """Train and evaluate every model of ``config`` into ``out_dir``; write ``summary.json``.
    ``device``: where the models train (``cpu``, ``cuda[:N]`` or ``auto``); evaluation
    runs on the CPU. ``executor``/``ray_address``: where the units run (``run_jobs``).
    ``compile``: ``auto``, ``on`` or ``off``, the training step compiled or not
    (``sinkscope.toy.train.train_seeds``; not a resume setting). ``tracking``: log every model that trains to W&B and/or TensorBoard, grouped by
    ``out_dir``'s name (``sinkscope.toy.tracking``); not a resume setting."""
    check_argument(config, ReproduceConfig, "config", "a ReproduceConfig")
    check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path)")
    out_dir = Path(out_dir)
    target_device = unit_device(device, executor)  # before anything is written
    check_compile_choice(compile)
    if tracking is not None:
        tracking.check()
        tracking = tracking.for_units(out_dir)  # grouped by this directory's name, not a staging one's
    refuse_a_run_as_experiment_out(out_dir)
    with experiment_directory(out_dir, REPRODUCE_FILE, config, "a reproduction", overwrite) as work_dir:
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
        models = [by_name[name] for name, _ in sorted(jobs, key=_job_order)]
        one_layer_softmax = [
            work_dir / m.name for m in models if (m.n_layers, m.n_heads, m.attention) == (1, 1, "softmax")
        ]
        if progress:  # the trade-off and summary take seconds more after the last model finished
            print(_closing_line(len(one_layer_softmax)), file=sys.stderr, flush=True)
        if one_layer_softmax:
            write_tradeoff(work_dir, one_layer_softmax, config.task, n_sequences=config.n_sequences)
        summary = ReproduceSummary(
            config=config,
            models=models,
            checks=check_claims(models, TrainConfig().stop_linf),
            wall_seconds=round(time.perf_counter() - started, 2),
            figures=["tradeoff.png"] if one_layer_softmax else [],
        )
        write_result(work_dir / SUMMARY_FILE, summary)
        write_provenance(work_dir, "toy reproduce")
    return summary


def _closing_line(n_tradeoff_models: int) -> str:
    """What a reproduction does between its last model finishing and its summary."""
    tradeoff = (
        f"measuring Theorem 1's trade-off on {n_tradeoff_models} 1-layer softmax model(s), "
        if n_tradeoff_models
        else ""
    )
    return f"every model trained and evaluated; {tradeoff}checking the paper's claims, writing summary.json ..."


def _job_order(job: tuple[str, RunConfig]) -> tuple:
    model = job[1].model
    return (
        model.n_layers,
        model.n_heads,
        PAPER_ATTENTIONS.index(model.attention) if model.attention in PAPER_ATTENTIONS else 9,
        job[1].train.seed,
    )
