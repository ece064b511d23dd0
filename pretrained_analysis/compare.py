"""Compare audits: several models, or several training checkpoints (revisions) of one.

``compare_audits(results)`` makes one row per audit, in the order given (so a checkpoint
sweep reads left to right); ``write_comparison(comparison, directory)`` writes
``comparison.json``, ``comparison.md`` and two figures, three when a model's checkpoints
have training steps (``trajectory_figures``: sinks against the step),
(``sinkscope.pretrained_analysis.compare_figures``): the sink rate per model (one line per
model through its checkpoints when rows are revisions of one model, separate markers for
unrelated models) and the anchor mass of every measured layer of every model (never
interpolated onto another model's depth).

Rows are revisions of one model when they share ``model`` (the name it was loaded by) and
differ in ``revision``: that is all a comparison knows of where its audits came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sinkscope.infra.arguments import check_argument, check_items, check_path
from sinkscope.infra.atomic_io import atomic_write_text
from sinkscope.infra.bounds import COUNT, FRACTION, NONNEGATIVE, PERCENT, POSITIVE, UNBOUNDED, Bound, Problem, at_most
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditResult
from sinkscope.pretrained_analysis.compare_figures import (
    is_checkpoint_series,
    layer_figure,
    model_label,
    sink_rate_figure,
)
from sinkscope.pretrained_analysis.prompts import PromptSpec
from sinkscope.pretrained_analysis.tables import comparison_definition
from sinkscope.pretrained_analysis.training_steps import check_steps, check_steps_used, training_step
from sinkscope.pretrained_analysis.trajectory_figures import trajectory_figure
from sinkscope.probes.default_state import Estimate
from sinkscope.probes.tables import SINK_RATE_NAME
from sinkscope.reports.document import Table
from sinkscope.reports.frames import dataframe
from sinkscope.reports.markdown import md_escape, table_markdown

if TYPE_CHECKING:
    import pandas

COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
SINK_RATE_FIGURE = "comparison_sink_rate.png"
LAYER_FIGURE = "comparison_anchor_mass_by_layer.png"
TRAJECTORY_FIGURE = "comparison_over_training.png"


@dataclass(frozen=True)
class ComparisonRow:
    """One audited model. sink_rate: Sink_1^eps in percent keyed by eps (``"0.3"``);
    layer_anchor_mass ``[layer]``: mean over heads; the loss fields are None without
    ``--ablate`` (or for encoders)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "n_params": COUNT,
        "n_sink_heads": COUNT,
        "sink_rate": PERCENT,
        "mean_anchor_mass": NONNEGATIVE,
        "layer_anchor_mass": NONNEGATIVE,
        "base_loss": NONNEGATIVE,
        "all_sink_heads_loss_delta": UNBOUNDED,
        "evict_anchor_loss_delta": UNBOUNDED,
        "step": COUNT,
        "ablation_prompts": COUNT,
    }

    label: str
    model: str
    revision: str | None
    directory: str | None
    n_layers: int
    n_heads: int
    n_params: int
    n_sink_heads: int
    sink_rate: dict[str, float]
    mean_anchor_mass: float
    layer_anchor_mass: tuple[float, ...]
    base_loss: float | None
    all_sink_heads_loss_delta: float | None
    evict_anchor_loss_delta: float | None
    step: int | None = None  # the checkpoint's training step (``training_steps``); None: unknown
    # the two loss changes with their bootstrap intervals over the prompts (None without
    # ablations, and in comparisons written before they were recorded)
    all_sink_heads_loss_change: Estimate | None = None
    evict_anchor_loss_change: Estimate | None = None
    ablation_prompts: int | None = None  # the prompts those intervals are over

    def inconsistencies(self) -> Iterator[Problem]:
        """One anchor mass per layer; sink heads among the model's heads."""
        if len(self.layer_anchor_mass) != self.n_layers:
            yield (
                "layer_anchor_mass",
                f"{len(self.layer_anchor_mass)} values",
                f"one per layer, n_layers = {self.n_layers}",
            )
        yield from at_most("n_sink_heads", self.n_sink_heads, self.n_layers * self.n_heads, "n_layers x n_heads")


@dataclass(frozen=True)
class Comparison:
    """Rows in the given order, plus what every audit shared; persisted as
    ``comparison.json`` (``sinkscope.infra.codec``)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"sink_eps": FRACTION, "prompts_used": COUNT}

    SCHEMA: ClassVar[str] = "comparison"
    SCHEMA_VERSION: ClassVar[int] = 1

    rows: tuple[ComparisonRow, ...]
    prompts: PromptSpec
    prompt_location: str
    sink_eps: float
    # prompts each audit ran on (a source may hold fewer than the spec asks for); None in
    # comparisons written before it was recorded
    prompts_used: int | None = None

    def epsilons(self) -> list[str]:
        return list(self.rows[0].sink_rate) if self.rows else []

    def model_groups(self) -> list[tuple[str, tuple[ComparisonRow, ...]]]:
        """The rows grouped by the model they audit (``model``, in order of first
        appearance), each named by its label without ``@revision``."""
        groups: dict[str, list[ComparisonRow]] = {}
        for row in self.rows:
            groups.setdefault(row.model, []).append(row)
        return [(model_label(rows[0]), tuple(rows)) for rows in groups.values()]

    def has_checkpoints(self) -> bool:
        """Whether some model is audited at two or more revisions (a checkpoint suite)."""
        return any(is_checkpoint_series(rows) for _, rows in self.model_groups())

    def trajectories(self) -> list[tuple[str, tuple[ComparisonRow, ...]]]:
        """The models audited at two or more checkpoints whose steps are all known and
        distinct, each with its rows in step order: what is drawn against the step."""
        found = []
        for model, rows in self.model_groups():
            steps = [row.step for row in rows]
            if len(rows) > 1 and None not in steps and len(set(steps)) == len(steps):
                found.append((model, tuple(sorted(rows, key=lambda row: int(row.step or 0)))))
        return found

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (model, revision, layer): the layer's anchor mass (mean over heads)
        beside the audit's own figures, sink rates as ``sink_rate_<eps>`` columns."""
        return dataframe(
            {
                "model": row.label,
                "revision": row.revision,
                "step": row.step,
                "layer": layer,
                "anchor_mass": mass,
                "n_layers": row.n_layers,
                "n_heads": row.n_heads,
                "n_params": row.n_params,
                "n_sink_heads": row.n_sink_heads,
                **{f"sink_rate_{eps}": percent for eps, percent in row.sink_rate.items()},
                "mean_anchor_mass": row.mean_anchor_mass,
                "base_loss": row.base_loss,
                "all_sink_heads_loss_delta": row.all_sink_heads_loss_delta,
                "evict_anchor_loss_delta": row.evict_anchor_loss_delta,
                **_interval_columns("all_sink_heads_loss_delta", row.all_sink_heads_loss_change),
                **_interval_columns("evict_anchor_loss_delta", row.evict_anchor_loss_change),
            }
            for row in self.rows
            for layer, mass in enumerate(row.layer_anchor_mass)
        )

    def _repr_html_(self) -> str:
        """Inline display in a notebook: findings, the table, anchor mass per layer."""
        from sinkscope.pretrained_analysis.display import comparison_html  # loads the report phrases only when shown

        return comparison_html(self)

    @property
    def sink_head_rule(self) -> str:
        return f"anchor mass >= {1.0 - self.sink_eps:g}"

    def table(self) -> Table:
        """The comparison's one table (``sinkscope.pretrained_analysis.tables``)."""
        with_step = any(row.step is not None for row in self.rows)
        return comparison_definition(self.epsilons(), with_step).table(self.rows)

    def to_markdown(self) -> str:
        """``comparison.md``: the table, then what every audit shared."""
        bos = "with BOS prepended" if self.prompts.prepend_bos else "without BOS"
        shared = md_escape(
            f"Prompts: up to {self.prompts.n_prompts} from {self.prompt_location}, "
            f"at most {self.prompts.max_len} tokens, {bos}. "
            f"Sink heads: {self.sink_head_rule}. Sink rate: Gu et al.'s {SINK_RATE_NAME} at sink-rate threshold ε."
        )
        return "# Attention-sink comparison\n\n" + table_markdown(self.table()) + "\n\n" + shared + "\n"


def _interval_columns(name: str, change: Estimate | None) -> dict[str, float | None]:
    """A loss change's 95% interval as two DataFrame columns (None where not recorded)."""
    return {
        f"{name}_ci_low": None if change is None else change.ci_low,
        f"{name}_ci_high": None if change is None else change.ci_high,
    }


def _row(result: AuditResult, directory: str | None, steps: Mapping[str, int] | None) -> ComparisonRow:
    layers = tuple(layer.anchor_mass for layer in result.probe.layers)
    ablation = result.ablation
    all_sinks = all_sinks_change = None
    if ablation is not None and ablation.sink == "anchor" and ablation.default_state.all_sink_heads is not None:
        row = ablation.default_state.all_sink_heads
        all_sinks, all_sinks_change = row.error_after_remove - row.error_before, row.remove_increase
    return ComparisonRow(
        label=result.model.label,
        model=result.model.name,
        revision=result.model.revision,
        directory=directory,
        n_layers=result.model.n_layers,
        n_heads=result.model.n_heads,
        n_params=result.model.n_params,
        n_sink_heads=len(result.sink_heads()),
        sink_rate={str(rate.eps): rate.percent for rate in result.sink_rates},
        mean_anchor_mass=sum(layers) / len(layers),
        layer_anchor_mass=layers,
        base_loss=None if ablation is None else ablation.base_loss,
        all_sink_heads_loss_delta=all_sinks,
        evict_anchor_loss_delta=None if ablation is None else ablation.evict_anchor_delta,
        step=training_step(result.model.revision, steps),
        all_sink_heads_loss_change=all_sinks_change,
        evict_anchor_loss_change=None if ablation is None else ablation.evict_anchor_increase,
        ablation_prompts=None if ablation is None else ablation.default_state.n_inputs,
    )


def check_comparable(results: Sequence[AuditResult], names: Sequence[str | Path]) -> None:
    """Audits compare only on the same prompts (``PromptSummary.same_prompts``) and sink
    threshold; every pair is checked, so the order of the audits does not matter."""
    for i, (name, result) in enumerate(zip(names, results)):
        if result.config.layers is not None:
            raise InputError(
                f"{name} probed only layers {', '.join(map(str, result.config.layers))} (layers); a comparison "
                "draws every layer of each model: compare audits of every layer",
                field="directories",
            )
        for earlier, other in zip(names[:i], results[:i]):
            if not result.prompts.same_prompts(other.prompts) or result.config.sink_eps != other.config.sink_eps:
                raise InputError(
                    f"{name} was audited on other prompts or another sink threshold than {earlier}; "
                    "compare audits of the same prompts and sink_eps",
                    field="directories",
                )


def compare_audits(
    results: Sequence[AuditResult], directories: Sequence[str] | None = None, steps: Mapping[str, int] | None = None
) -> Comparison:
    """One row per audit; ``directories``: where each audit was written (relative paths);
    ``steps``: the training step of each revision (``{"step1000": 1000}``) where its name
    does not say it (``training_steps.step_from_revision``)."""
    results = check_items(results, AuditResult, "results", "AuditResults (what audit or read_audit returns)")
    if directories is not None:
        directories = check_items(directories, str, "directories", "directory names")
    if not results:
        raise InputError("nothing to compare; pass at least one audit result")
    if directories is not None and len(directories) != len(results):
        raise InputError(f"{len(directories)} directories for {len(results)} audits; pass one per audit")
    check_comparable(results, directories or [result.model.label for result in results])
    if steps is not None:
        steps = check_steps(steps)
        check_steps_used(steps, {result.model.revision for result in results if result.model.revision})
    rows = tuple(
        _row(result, None if directories is None else directories[k], steps) for k, result in enumerate(results)
    )
    first = results[0]
    return Comparison(
        rows=rows,
        prompts=first.prompts.spec,
        prompt_location=first.prompts.location,
        sink_eps=first.config.sink_eps,
        prompts_used=first.prompts.n_prompts,
    )


def read_comparison(directory: str | Path) -> Comparison:
    """``directory/comparison.json`` read back."""
    check_path(directory, "directory")
    return read_result(Path(directory) / COMPARISON_JSON, Comparison, "regenerate it with sinkscope audit")


def write_comparison(comparison: Comparison, directory: str | Path) -> Path:
    """Write ``comparison.json``, ``comparison.md`` and the two figures into ``directory``."""
    check_argument(comparison, Comparison, "comparison", "a Comparison (what compare_audits returns)")
    check_path(directory, "directory")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sink_rate_figure(comparison, directory / SINK_RATE_FIGURE)
    layer_figure(comparison, directory / LAYER_FIGURE)
    if comparison.trajectories():
        trajectory_figure(comparison, directory / TRAJECTORY_FIGURE)
    atomic_write_text(directory / COMPARISON_MD, comparison.to_markdown())
    write_result(directory / COMPARISON_JSON, comparison)
    return directory
