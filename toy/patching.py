"""Activation patching on the trigger task: which heads and positions carry the
trigger-conditional behaviour.

Source: evaluation inputs with the trigger at ``task.eval_trigger_position`` (j).
Target: the same inputs with the trigger turned into a content token (trigger flag 0,
bias 1), so the model should stay in its default state at j. Metric: the output at j
projected on the source's target there, <y_hat_j, y_j> / ||y_j||^2 (1 = the triggered
behaviour). Patching ``z`` per (layer, head) finds the heads that carry the trigger;
patching ``resid_pre`` per (layer, position) finds where in the residual stream it lives.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from sinkscope.infra.arguments import check_argument, check_number, check_path
from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
from sinkscope.infra.bounds import COUNT, SAMPLES, Bound, Problem, index_problems
from sinkscope.infra.codec import Upgrade, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import PROVENANCE_FILE, write_provenance
from sinkscope.probes.patching import (
    MetricContext,
    MetricFn,
    PatchingResult,
    activation_patching,
    upgrade_patching_v1,
)
from sinkscope.probes.tables import POSITION_COLUMN, shown_position
from sinkscope.reports.colour_scales import DIVERGING, signed_limits
from sinkscope.reports.plots import heatmap
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.run_dir import load_model, read_config, require_finished
from sinkscope.toy.source_run import SOURCE_RUN_FILE, copy_source_run
from sinkscope.toy.task import TRIGGER_FLAG, TaskBatch, TaskConfig, eval_batch

PATCHING_FILE = "patching.json"
HEADS_FILE = "patching_heads.json"
POSITIONS_FILE = "patching_positions.json"
HEADS_FIGURE = "patching_heads.png"
POSITIONS_FIGURE = "patching_positions.png"
TRIGGER_METRIC = "output at the trigger position projected on the triggered input's target"


def remove_trigger(batch: TaskBatch, task: TaskConfig) -> torch.Tensor:
    """``batch.tokens [batch, pos, d_model]`` with each row's trigger made a content
    token: trigger flag 0, bias 1, features unchanged."""
    tokens = batch.tokens.clone()
    rows = torch.arange(tokens.shape[0])
    tokens[rows, batch.trigger_position, TRIGGER_FLAG] = 0.0
    tokens[rows, batch.trigger_position, task.bias_coord] = 1.0
    return tokens


def trigger_projection(batch: TaskBatch) -> MetricFn:
    """Metric ``[batch]``: output at each row's trigger position projected on the
    source's target there, divided by that target's squared norm."""

    def metric(output: torch.Tensor, context: MetricContext) -> torch.Tensor:
        rows = torch.arange(len(context.rows))
        trigger = batch.trigger_position[context.rows].to(output.device)
        goal = batch.targets[context.rows].to(output.device)[rows, trigger]
        return (output[rows, trigger] * goal).sum(dim=-1) / goal.pow(2).sum(dim=-1)

    return metric


def upgrade_trigger_patching_v1(patching: dict[str, Any]) -> dict[str, Any]:
    """``patching.json`` of schema version 1 in version 2's names: the two patching
    results ``heads``/``positions`` are ``per_head``/``per_position``, each upgraded
    (``upgrade_patching_v1``)."""
    names = {"heads": "per_head", "positions": "per_position"}
    return {
        names.get(key, key): upgrade_patching_v1(value) if key in names and isinstance(value, dict) else value
        for key, value in patching.items()
    }


@dataclass(frozen=True)
class TriggerPatching:
    """``per_head``: ``z`` patched per (layer, head); ``per_position``: ``resid_pre``
    patched per (layer, position); both triggered -> untriggered at ``trigger_position``,
    scored by ``TRIGGER_METRIC``. Persisted as ``patching.json``. Every index is 0-indexed
    (layers, heads, positions and ``trigger_position``: the paper's 1-indexed position 8 is 7)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"trigger_position": COUNT}

    SCHEMA: ClassVar[str] = "trigger_patching"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: per_head and per_position (were heads and positions)
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_trigger_patching_v1}

    trigger_position: int
    per_head: PatchingResult
    per_position: PatchingResult

    def inconsistencies(self) -> Iterator[Problem]:
        """The trigger inside the patched inputs."""
        yield from index_problems([("trigger_position", self.trigger_position, self.per_position.n_pos, "n_pos")])


def trigger_patching(model: ToyTransformer, task: TaskConfig, n_inputs: int = 256, seed: int = 0) -> TriggerPatching:
    """Patch triggered inputs into their untriggered copies (see the module docstring)."""
    if model.cfg.d_model != task.d_model:
        raise InputError(
            f"model d_model={model.cfg.d_model} differs from task d_model={task.d_model}; use the run's own task config"
        )
    check_number(n_inputs, SAMPLES, "n_inputs")  # the pairs are one tensor
    batch = eval_batch(task, n_inputs, seed=seed, target=model.cfg.target)
    source, target, metric = batch.tokens, remove_trigger(batch, task), trigger_projection(batch)
    return TriggerPatching(
        trigger_position=task.eval_trigger_position,
        per_head=activation_patching(model, source, target, "z", metric, per=("layer", "head")),
        per_position=activation_patching(model, source, target, "resid_pre", metric, per=("layer", "position")),
    )


def patching_figures(result: TriggerPatching, name: str, out_dir: Path) -> list[Any]:
    """The two effect maps, returned: layers and heads counted from 0 (as head names are),
    positions from 1 with BOS at 1 (as every report counts them)."""
    drawn: list[Any] = []
    for patched, figure, what, axis in (
        (result.per_head, HEADS_FIGURE, "z patched per head", "head (0-indexed)"),
        (result.per_position, POSITIONS_FIGURE, "resid_pre patched per position", POSITION_COLUMN),
    ):
        matrix = np.nan_to_num(patched.matrix().numpy())
        low, high = signed_limits(matrix.ravel())  # a signed effect: 0 at the diverging scale's white centre
        drawn.append(
            heatmap(
                matrix,
                out_dir / figure,
                f"{name}: {what} (normalised effect)",
                "normalised effect",
                xlabel=axis,
                ylabel="layer (0-indexed)",
                vmin=low,
                vmax=high,
                cmap=DIVERGING,
                x_tick_labels=[str(shown_position(p)) for p in range(matrix.shape[1])]
                if patched is result.per_position
                else None,
            )
        )
    return drawn


def patch_run(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    n_inputs: int = 256,
    overwrite: bool = False,
    allow_unfinished: bool = False,
) -> tuple[TriggerPatching, list[str]]:
    """`sinkscope toy patch RUN_DIR`: patching results as JSON and heatmaps in ``out_dir``
    (default ``RUN_DIR/patch``); returns the result and the files written."""
    check_path(run_dir, "run_dir", "a toy run directory (str or pathlib.Path)")
    if out_dir is not None:
        check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path) or None")
    check_argument(n_inputs, int, "n_inputs", "an integer")
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "patch"
    unfinished = require_finished(run_dir, allow_unfinished, "patch")  # before --out is touched
    model = load_model(run_dir)
    source = copy_source_run(run_dir, config, with_metrics=False)  # what the report says of the run
    with claim_output_directory(out_dir, overwrite, [run_dir], "the run", own_places=[run_dir / "patch"]):
        result = trigger_patching(model, config.task, n_inputs)
        if unfinished is not None:
            result = replace(
                result,
                per_head=replace(result.per_head, notes=(*result.per_head.notes, unfinished)),
                per_position=replace(result.per_position, notes=(*result.per_position.notes, unfinished)),
            )
        # built aside and swapped in whole: an old result stays complete until the new one is
        with atomic_directory(out_dir, replace=overwrite) as tmp:
            write_result(tmp / PATCHING_FILE, result)
            write_result(tmp / HEADS_FILE, result.per_head)
            write_result(tmp / POSITIONS_FILE, result.per_position)
            write_result(tmp / SOURCE_RUN_FILE, source)
            write_provenance(tmp, "toy patch", source=str(run_dir.resolve()))
            patching_figures(result, run_dir.name, tmp)
    files = [
        PATCHING_FILE,
        HEADS_FILE,
        POSITIONS_FILE,
        HEADS_FIGURE,
        POSITIONS_FIGURE,
        SOURCE_RUN_FILE,
        PROVENANCE_FILE,
    ]
    return result, files
