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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from sinkscope.infra.arguments import check_argument, check_path
from sinkscope.infra.bounds import COUNT, NONNEGATIVE, UNBOUNDED, Bound
from sinkscope.infra.codec import Upgrade
from sinkscope.infra.errors import InputError
from sinkscope.interp.attention_kinds import GATED_KINDS, NORMALISED_KINDS, NULL_SLOT_KINDS
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.probes.default_state import (
    DefaultStateResult,
    DefaultStateRow,
    default_state_test,
    split_all_sink_heads,
    tested_rows,
)
from sinkscope.probes.interventions import HeadRef, open_gate, remove_null
from sinkscope.probes.probe import HeadProbe, ProbeConfig
from sinkscope.probes.runner import probe_model
from sinkscope.reports.formatting import plural
from sinkscope.reports.frames import dataframe, row_of
from sinkscope.reports.plots import attention_grid
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.run_dir import RunConfig, load_model, read_config
from sinkscope.toy.task import TaskBatch, eval_batch, sample_batch

if TYPE_CHECKING:
    import pandas

FIGURE_SEED = 20_260_311
HELDOUT_SEED = 20_260_312
MEAN_FIGURE = "attention_mean.png"
STD_FIGURE = "attention_std.png"


def upgrade_toy_default_state_v1(state: dict[str, Any]) -> dict[str, Any]:
    """``default_state.json`` of schema version 1 (alone, or nested in a model summary) in
    version 2's layout: its row list ``heads`` (the all-sink-heads row last when there
    were several sink heads) becomes ``rows`` and ``all_sink_heads``."""
    upgraded = {key: value for key, value in state.items() if key != "heads"}
    upgraded["rows"], upgraded["all_sink_heads"] = split_all_sink_heads(
        state.get("heads", []), state.get("sink_heads", [])
    )
    return upgraded


@dataclass
class ToyDefaultState:
    """The default-state hypothesis test on the figure set (see ``sinkscope.probes.default_state``).

    Errors are the mean squared error at default (non-trigger) positions over the test
    inputs: before, after removing every sink head's sink at once, and after the matched
    control (one random visible non-anchor key masked per query instead). CIs are 95%
    bootstrap intervals of the per-input increase; ``error_growth_*`` is the error after
    divided by the error before. ``rows``: each sink head alone; ``all_sink_heads``: all
    of them at once (the one head's row when there is one), the row the errors above
    come from. Persisted as a toy probe's ``default_state.json``.
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "sink_heads": COUNT,
        "default_error_before": NONNEGATIVE,
        "default_error_after_remove": NONNEGATIVE,
        "default_error_after_control": NONNEGATIVE,
        "remove_increase_ci": UNBOUNDED,
        "control_increase_ci": UNBOUNDED,
        "error_growth_remove": UNBOUNDED,
        "error_growth_control": UNBOUNDED,
    }

    SCHEMA: ClassVar[str] = "toy_default_state"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: (layer, head) pairs, rows and all_sink_heads
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_toy_default_state_v1}

    sink_heads: tuple[HeadRef, ...]
    default_error_before: float | None
    default_error_after_remove: float | None
    default_error_after_control: float | None
    remove_increase_ci: list[float] | None
    control_increase_ci: list[float] | None
    error_growth_remove: float | None
    error_growth_control: float | None
    note: str
    rows: tuple[DefaultStateRow, ...]
    all_sink_heads: DefaultStateRow | None

    @classmethod
    def from_result(cls, result: DefaultStateResult) -> ToyDefaultState:
        together = result.all_sink_heads
        if together is None:
            return cls(result.sink_heads, None, None, None, None, None, None, None, result.note, result.rows, None)
        remove, control = together.remove_increase, together.control_increase
        before = together.error_before  # exactly 0 where rows write nothing at all (softpick): no growth factor
        return cls(
            sink_heads=result.sink_heads,
            default_error_before=together.error_before,
            default_error_after_remove=together.error_after_remove,
            default_error_after_control=together.error_after_control,
            remove_increase_ci=[remove.ci_low, remove.ci_high],
            control_increase_ci=[control.ci_low, control.ci_high],
            error_growth_remove=together.error_after_remove / before if before else None,
            error_growth_control=together.error_after_control / before if before else None,
            note=result.note,
            rows=result.rows,
            all_sink_heads=together,
        )

    def tested_rows(self) -> tuple[DefaultStateRow, ...]:
        """Every test run, once each (``sinkscope.probes.default_state.tested_rows``)."""
        return tested_rows(self.rows, self.all_sink_heads)


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
    """A toy model on the figure set. heads: the probe's per-head rows over default
    (non-trigger) queries, so ``anchor_mass_other`` is the trigger query's;
    trigger_rows: per head, in ``heads`` order, the mean attention of the trigger
    row over keys 0..trigger."""

    attention: str
    n_layers: int
    n_heads: int
    normalised: bool
    heads: tuple[HeadProbe, ...]
    trigger_rows: tuple[tuple[float, ...], ...]
    heldout_linf_error: float
    heldout_mse: float
    figure_linf_error: float
    n_sequences: int
    trigger_position_1indexed: int
    default_state: ToyDefaultState | None = None
    figures: list[str] = field(default_factory=list)
    default_mse: float = float("nan")  # MSE at default (non-trigger) positions of the figure set
    # the same test removing every head's null / forcing every head's gate open (mitigation kinds)
    null_state: ToyDefaultState | None = None
    gate_state: ToyDefaultState | None = None

    def sink_heads(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of every sink head, as ``ProbeResult.sink_heads()``."""
        return [(row.layer, row.head) for row in self.heads if row.is_sink_head]

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (layer, head), every ``HeadProbe`` metric a column."""
        return dataframe(row_of(row) for row in self.heads)

    def _repr_html_(self) -> str:
        """Inline display in a notebook: held-out errors and anchor mass per head."""
        from sinkscope.toy.display import evaluation_html  # the display imports this module's types for typing only

        return evaluation_html(self)


def _pattern_stats(model: ToyTransformer, batch: TaskBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    names = {pattern_hook(layer) for layer in range(model.cfg.n_layers)}
    with torch.no_grad():
        output, cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    return output, [cache[pattern_hook(layer)] for layer in range(model.cfg.n_layers)]


def _mean_patterns(
    patterns: list[torch.Tensor], trigger: int
) -> tuple[list[np.ndarray], list[np.ndarray], tuple[tuple[float, ...], ...]]:
    """Each layer's mean and std pattern over sequences ``[head, query, key]``, and each
    head's mean trigger row over keys 0..trigger (layer-major, like the probe's rows)."""
    means, stds, trigger_rows = [], [], []
    for pattern in patterns:
        mean_pattern = pattern.mean(dim=0)  # [head, query, key]
        means.append(mean_pattern.numpy())
        stds.append(pattern.std(dim=0).numpy())
        trigger_rows += [
            tuple(round(float(x), 6) for x in mean_pattern[head, trigger, : trigger + 1])
            for head in range(pattern.shape[1])
        ]
    return means, stds, tuple(trigger_rows)


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
        figure_dir / MEAN_FIGURE,
        f"{label}mean attention over {plural(n_sequences, 'sequence')} (trigger at position {trigger + 1})",
        tick_labels=labels,
        vmax=1.0 if config.model.attention in NORMALISED_KINDS else None,
    )
    attention_grid(
        np.stack(stds),
        figure_dir / STD_FIGURE,
        f"{label}std of attention over {plural(n_sequences, 'sequence')}",
        tick_labels=labels,
        colorbar_label="std of attention weight",
    )
    return [MEAN_FIGURE, STD_FIGURE]


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
    probe = probe_model(model, batch.tokens, query_mask=default_mask, config=ProbeConfig(batch_size=250))
    means, stds, trigger_rows = _mean_patterns(patterns, trigger)
    sink_heads = probe.sink_heads()
    error_fn = default_position_mse(batch.targets, default_mask)
    default_state = ToyDefaultState.from_result(default_state_test(model, batch.tokens, sink_heads, error_fn))
    every_head = [(row.layer, row.head) for row in probe.heads]
    kind = config.model.attention
    null_state, gate_state = (
        ToyDefaultState.from_result(default_state_test(model, batch.tokens, every_head, error_fn, removal=removal))
        if applies
        else None
        for removal, applies in ((remove_null, kind in NULL_SLOT_KINDS), (open_gate, kind in GATED_KINDS))
    )
    heldout = sample_batch(task, n_sequences, torch.Generator().manual_seed(HELDOUT_SEED), target)
    with torch.no_grad():
        heldout_error = model(heldout.tokens) - heldout.targets
    figures: list[str] = []
    if figure_dir is not None:
        figures = _write_attention_figures(Path(figure_dir), means, stds, config, n_sequences, title)
    return ModelEvaluation(
        attention=config.model.attention,
        n_layers=config.model.n_layers,
        n_heads=config.model.n_heads,
        normalised=config.model.attention in NORMALISED_KINDS,
        heads=probe.heads,
        trigger_rows=trigger_rows,
        heldout_linf_error=float(heldout_error.abs().max()),
        heldout_mse=float(heldout_error.pow(2).mean()),
        figure_linf_error=float((output - batch.targets).abs().max()),
        n_sequences=n_sequences,
        trigger_position_1indexed=trigger + 1,
        default_state=default_state,
        figures=figures,
        default_mse=float(error_fn(output, None).mean()),
        null_state=null_state,
        gate_state=gate_state,
    )


def evaluate_run(run_dir: str | os.PathLike, n_sequences: int = 1000, write_figures: bool = True) -> ModelEvaluation:
    """``evaluate_model`` on a run directory's trained model; figures go into the run dir."""
    check_path(run_dir, "run_dir", "a toy run directory (str or pathlib.Path)")
    check_argument(n_sequences, int, "n_sequences", "an integer")
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    model = load_model(run_dir)
    return evaluate_model(model, config, n_sequences, run_dir if write_figures else None, title=run_dir.name)
