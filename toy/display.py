"""Inline notebook display (``_repr_html_``) of toy results: an evaluated model, a
reproduction (the paper's checks first) and a sweep; every model's anchor mass per
(layer, head) as one heat map with sink heads outlined."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.probes.sink_metrics import SINK_EPS
from sinkscope.reports.inline_html import bullets, fragment, heat_grid, table

if TYPE_CHECKING:
    from sinkscope.probes.probe import HeadProbe
    from sinkscope.toy.evaluate import ModelEvaluation
    from sinkscope.toy.experiment import ModelSummary
    from sinkscope.toy.reproduce import ReproduceSummary
    from sinkscope.toy.sweep import SweepResult

MODEL_COLUMNS = (
    ("model", ""),
    ("converged", ""),
    ("steps", ",d"),
    ("batch L-inf", ".2e"),
    ("held-out L-inf", ".2e"),
    ("held-out MSE", ".2e"),
    ("sink heads", ""),
)


def models_table(models: Sequence[ModelSummary]) -> str:
    rows = [
        (
            m.name,
            m.converged,
            m.steps,
            m.linf_error,
            m.heldout_linf_error,
            m.heldout_mse,
            f"{m.n_sink_heads} of {m.n_layers * m.n_heads}",
        )
        for m in models
    ]
    return table(MODEL_COLUMNS, rows, scroll=len(rows) > 12)


def anchor_mass_map(models: Sequence[tuple[str, Sequence[HeadProbe]]]) -> str:
    """One row per (model, layer), one column per head: BOS mass over non-trigger
    queries; ``models`` are (name, per-head rows) pairs."""
    width = max((row.head + 1 for _, rows in models for row in rows), default=0)
    values: list[list[float]] = []
    labels: list[str] = []
    marked: set[tuple[int, int]] = set()
    for name, rows in models:
        for layer in range(max((row.layer + 1 for row in rows), default=0)):
            cells = [float("nan")] * width
            for row in rows:
                if row.layer == layer:
                    cells[row.head] = row.anchor_mass
                    if row.is_sink_head:
                        marked.add((len(values), row.head))
            values.append(cells)
            labels.append(f"{name} L{layer}")
    return heat_grid(
        values,
        f"BOS mass over non-trigger queries (outlined: sink heads, \u2265 {1 - SINK_EPS:g})",
        row_name="model, layer",
        marked=frozenset(marked),
        row_labels=labels,
    )


def model_html(model: ModelSummary) -> str:
    subtitle = f"{model.attention} attention, {model.n_layers} layers x {model.n_heads} heads, seed {model.seed}"
    parts = [models_table([model]), anchor_mass_map([(model.name, model.heads)])]
    return fragment(f"Toy model {model.name}", subtitle, parts)


def evaluation_html(evaluation: ModelEvaluation) -> str:
    name = f"{evaluation.attention}-{evaluation.n_layers}x{evaluation.n_heads}"
    errors = table(
        (("held-out L-inf", ".2e"), ("held-out MSE", ".2e"), ("default-position MSE", ".2e"), ("sink heads", "")),
        [
            (
                evaluation.heldout_linf_error,
                evaluation.heldout_mse,
                evaluation.default_mse,
                f"{len(evaluation.sink_heads())} of {len(evaluation.heads)}",
            )
        ],
    )
    subtitle = (
        f"{evaluation.n_sequences:,} held-out sequences, trigger at 1-indexed position "
        f"{evaluation.trigger_position_1indexed}"
    )
    return fragment(f"Toy model {name}", subtitle, [errors, anchor_mass_map([(name, evaluation.heads)])])


def reproduction_html(summary: ReproduceSummary) -> str:
    passed = sum(check.passed for check in summary.checks)
    findings = [f"{passed} of {len(summary.checks)} checks of the paper's claims pass."] + [
        f"FAILED: {check.claim} ({check.detail})" for check in summary.checks if not check.passed
    ]
    subtitle = f"{len(summary.models)} models, {summary.wall_seconds:.0f} s"
    parts = [
        bullets(findings),
        models_table(summary.models),
        anchor_mass_map([(m.name, m.heads) for m in summary.models]),
    ]
    return fragment("Toy reproduction", subtitle, parts)


def sweep_html(result: SweepResult) -> str:
    columns = (
        ("configuration", ""),
        ("seeds", ""),
        ("converged", ""),
        ("mean steps", ",.0f"),
        ("sink fraction", ".2f"),
        ("mean anchor mass", ".3f"),
        ("mean default MSE", ".2e"),
    )
    rows = [
        (
            row.label,
            row.seeds,
            row.converged,
            row.mean_steps,
            row.sink_fraction,
            row.mean_anchor_mass_default,
            row.mean_default_mse,
        )
        for row in result.rows
    ]
    subtitle = f"{len(result.rows)} configurations, {len(result.models)} models, {result.wall_seconds:.0f} s"
    return fragment("Toy sweep", subtitle, [table(columns, rows, scroll=len(rows) > 12)])
