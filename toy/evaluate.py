"""Evaluate a trained toy model the way the paper's figures do.

Two evaluation sets, both fresh (never seen in training):
- the figure set: ``n_sequences`` sequences with the trigger at ``eval_trigger_position``
  (1-indexed 8), for attention heatmaps (mean and std over sequences) and the per-head
  table;
- the held-out set: sequences from the training distribution (trigger anywhere in the
  training range), for ``heldout_linf_error`` and ``heldout_mse``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from interp.attention_kinds import NORMALISED_KINDS
from interp.errors import InputError
from interp.hook_names import pattern_hook
from probes.default_state import DefaultStateResult, DefaultStateRow, default_state_test
from probes.sink_metrics import anchor_mass, is_sink_head
from reports.plots import attention_grid
from toy.model import ToyTransformer
from toy.run_dir import RunConfig, load_model, read_config
from toy.task import TaskBatch, eval_batch, sample_batch

FIGURE_SEED = 20_260_311
HELDOUT_SEED = 20_260_312
SINK_EPS = 0.1  # is_sink_head: anchor_mass_default >= 0.9, as the paper reads its heatmaps


@dataclass
class HeadRow:
    """One head of a toy model on the figure set.

    ``anchor_mass_default``: mean BOS weight over non-trigger queries 2..L (1-indexed);
    ``anchor_mass_trigger``: BOS weight at the trigger query;
    ``default_row_mass``: mean total weight of non-trigger rows (1 for softmax; for ReLU
    kinds, whether the head attends at all off-trigger);
    ``trigger_row``: mean weights of the trigger row over keys 0..trigger.
    """

    layer: int
    head: int
    anchor_mass_default: float
    anchor_mass_trigger: float
    is_sink_head: bool
    default_row_mass: float
    trigger_row: list[float]


@dataclass
class ToyDefaultState:
    """The default-state hypothesis test on the figure set (see ``probes.default_state``).

    Errors are the mean squared error at default (non-trigger) positions over the test
    inputs: before, after removing every sink head's sink at once, and after the matched
    control (one random visible non-anchor key masked per query instead). CIs are 95%
    bootstrap intervals of the per-input increase; ``error_growth_*`` is the error after
    divided by the error before. ``heads`` has the per-head rows. Persisted as a toy
    probe's ``default_state.json``.
    """

    SCHEMA: ClassVar[str] = "toy_default_state"
    SCHEMA_VERSION: ClassVar[int] = 1

    sink_heads: list[list[int]]
    default_error_before: float | None
    default_error_after_remove: float | None
    default_error_after_control: float | None
    remove_increase_ci: list[float] | None
    control_increase_ci: list[float] | None
    error_growth_remove: float | None
    error_growth_control: float | None
    note: str
    heads: list[DefaultStateRow]

    @classmethod
    def from_result(cls, result: DefaultStateResult) -> ToyDefaultState:
        sink_heads = [list(head) for head in result.sink_heads]
        if not result.rows:
            return cls(sink_heads, None, None, None, None, None, None, None, result.note, [])
        together = result.rows[-1]  # all sink heads together (or the only one)
        remove, control = together.remove_increase, together.control_increase
        return cls(
            sink_heads=sink_heads,
            default_error_before=together.error_before,
            default_error_after_remove=together.error_after_remove,
            default_error_after_control=together.error_after_control,
            remove_increase_ci=[remove.ci_low, remove.ci_high],
            control_increase_ci=[control.ci_low, control.ci_high],
            error_growth_remove=together.error_after_remove / together.error_before,
            error_growth_control=together.error_after_control / together.error_before,
            note=result.note,
            heads=list(result.rows),
        )


def default_position_mse(targets: torch.Tensor, default_mask: torch.Tensor):
    """An ``error_fn`` for ``default_state_test``: per-input MSE ``[batch]`` at default
    positions, for outputs and targets ``[batch, pos, d_model]``."""
    weights = default_mask.unsqueeze(-1).to(targets.dtype)
    denominator = default_mask.sum(dim=1).to(targets.dtype) * targets.shape[-1]

    def error_fn(output: torch.Tensor, _batch) -> torch.Tensor:
        return ((output - targets).pow(2) * weights).sum(dim=(1, 2)) / denominator

    return error_fn


@dataclass
class ModelEvaluation:
    attention: str
    layers: int
    heads: int
    normalised: bool
    heads_table: list[HeadRow]
    heldout_linf_error: float
    heldout_mse: float
    figure_linf_error: float
    n_sequences: int
    trigger_position_1indexed: int
    default_state_test: ToyDefaultState | None = None
    figures: list[str] = field(default_factory=list)
    default_mse: float = float("nan")  # MSE at default (non-trigger) positions of the figure set

    @property
    def sink_heads(self) -> list[tuple[int, int]]:
        return [(row.layer, row.head) for row in self.heads_table if row.is_sink_head]


def _pattern_stats(model: ToyTransformer, batch: TaskBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    names = {pattern_hook(layer) for layer in range(model.cfg.n_layers)}
    with torch.no_grad():
        output, cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    return output, [cache[pattern_hook(layer)] for layer in range(model.cfg.n_layers)]


def _head_rows(
    patterns: list[torch.Tensor], batch: TaskBatch, trigger: int
) -> tuple[list[HeadRow], list[np.ndarray], list[np.ndarray]]:
    """One ``HeadRow`` per (layer, head) of the figure set's patterns, and each layer's
    mean and std pattern over sequences ``[head, query, key]``."""
    default_mask, trigger_mask = batch.default_query_mask(), batch.trigger_query_mask()
    rows: list[HeadRow] = []
    means, stds = [], []
    for layer, pattern in enumerate(patterns):
        default_mass = anchor_mass(pattern, 0, default_mask)
        trigger_mass = anchor_mass(pattern, 0, trigger_mask)
        mean_pattern = pattern.mean(dim=0)  # [head, query, key]
        means.append(mean_pattern.numpy())
        stds.append(pattern.std(dim=0).numpy())
        default_rows = default_mask[0].nonzero().squeeze(-1)
        for head in range(pattern.shape[1]):
            rows.append(
                HeadRow(
                    layer=layer,
                    head=head,
                    anchor_mass_default=float(default_mass[head]),
                    anchor_mass_trigger=float(trigger_mass[head]),
                    is_sink_head=bool(is_sink_head(float(default_mass[head]), SINK_EPS)),
                    default_row_mass=float(mean_pattern[head, default_rows].sum(dim=-1).mean()),
                    trigger_row=[round(float(x), 6) for x in mean_pattern[head, trigger, : trigger + 1]],
                )
            )
    return rows, means, stds


def _write_attention_figures(
    figure_dir: Path,
    means: list[np.ndarray],
    stds: list[np.ndarray],
    config: RunConfig,
    n_sequences: int,
    title: str,
) -> list[str]:
    """Write the mean and std attention heatmaps into ``figure_dir``; their file names."""
    trigger = config.task.eval_trigger_position
    labels = [str(i + 1) for i in range(config.task.seq_len)]
    label = f"{title} " if title else ""
    attention_grid(
        np.stack(means),
        figure_dir / "attention_mean.png",
        f"{label}mean attention over {n_sequences} sequences (trigger at position {trigger + 1})",
        tick_labels=labels,
        vmax=1.0 if config.model.attention in NORMALISED_KINDS else None,
    )
    attention_grid(
        np.stack(stds),
        figure_dir / "attention_std.png",
        f"{label}std of attention over {n_sequences} sequences",
        tick_labels=labels,
    )
    return ["attention_mean.png", "attention_std.png"]


def evaluate_model(
    model: ToyTransformer,
    config: RunConfig,
    n_sequences: int = 1000,
    figure_dir: str | os.PathLike | None = None,
    title: str = "",
) -> ModelEvaluation:
    """Measure the per-head table and held-out errors; optionally write the heatmaps."""
    if n_sequences < 1:
        raise InputError(f"n_sequences must be >= 1, got {n_sequences}", field="n_sequences")
    task, target = config.task, config.model.target
    batch = eval_batch(task, n_sequences, FIGURE_SEED, target)
    output, patterns = _pattern_stats(model, batch)
    trigger = task.eval_trigger_position
    default_mask = batch.default_query_mask()
    rows, means, stds = _head_rows(patterns, batch, trigger)
    sink_heads = [(row.layer, row.head) for row in rows if row.is_sink_head]
    default_state = ToyDefaultState.from_result(
        default_state_test(
            model,
            batch.tokens,
            sink_heads,
            default_position_mse(batch.targets, default_mask),
        )
    )
    heldout = sample_batch(task, n_sequences, torch.Generator().manual_seed(HELDOUT_SEED), target)
    with torch.no_grad():
        heldout_error = model(heldout.tokens) - heldout.targets
    figures: list[str] = []
    if figure_dir is not None:
        figures = _write_attention_figures(Path(figure_dir), means, stds, config, n_sequences, title)
    return ModelEvaluation(
        attention=config.model.attention,
        layers=config.model.n_layers,
        heads=config.model.n_heads,
        normalised=config.model.attention in NORMALISED_KINDS,
        heads_table=rows,
        heldout_linf_error=float(heldout_error.abs().max()),
        heldout_mse=float(heldout_error.pow(2).mean()),
        figure_linf_error=float((output - batch.targets).abs().max()),
        n_sequences=n_sequences,
        trigger_position_1indexed=trigger + 1,
        default_state_test=default_state,
        figures=figures,
        default_mse=float(default_position_mse(batch.targets, default_mask)(output, None).mean()),
    )


def evaluate_run(run_dir: str | os.PathLike, n_sequences: int = 1000, write_figures: bool = True) -> ModelEvaluation:
    """``evaluate_model`` on a run directory's trained model; figures go into the run dir."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    model = load_model(run_dir)
    return evaluate_model(model, config, n_sequences, run_dir if write_figures else None, title=run_dir.name)
