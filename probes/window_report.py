"""The streaming window test, presented once for every medium: its table (mean loss per
setting with intervals over units), its figure (loss against position), its one-sentence
finding, the report document and the inline notebook display."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sinkscope.infra.codec import read_result
from sinkscope.infra.intervals import MIN_INTERVAL_UNITS, interval_possible
from sinkscope.probes.window_masks import WindowSetting
from sinkscope.probes.window_test import SettingLoss, WindowTestResult
from sinkscope.reports.curves import position_curves, running_mean
from sinkscope.reports.document import (
    Column,
    Figure,
    KeyValues,
    Paragraph,
    ReportDocument,
    Section,
    TableDefinition,
)
from sinkscope.reports.formatting import estimate_text, plural, shared_decimals, sig
from sinkscope.reports.html import bullets_html, fragment, inline_table
from sinkscope.reports.write import ReportKind

RESULT_FILE = "window_test.json"
FIGURE_FILE = "window_test_loss.png"
FIRST_SHADES = ("#6baed6", "#2171b5", "#08306b")
RANDOM_SHADES = ("#fdae6b", "#e6550d", "#7f2704")
# (colour, line style) per setting kind: the window alone stands out, the control is dashed
KIND_STYLE = {
    "full": ("#000000", "-"),
    "window": ("#d62728", "-"),
    "first": ("#1f77b4", "-"),
    "random": ("#ff7f0e", "--"),
}


def _interval(estimate: Any, n_units: int) -> tuple[float, float]:
    return (estimate.ci_low, estimate.ci_high) if n_units >= 2 else (math.nan, math.nan)


def window_definition(result: WindowTestResult) -> TableDefinition[SettingLoss]:
    """The table: per setting, the mean loss over the scored positions and its increase
    over full attention, each with its 95% bootstrap interval over the units."""
    n, unit = result.n_units, result.unit
    fmt = _loss_format(result)
    return TableDefinition(
        f"Mean {result.loss_name} per setting, positions {result.scored_from + 1} to {result.n_positions}",
        (
            Column("setting"),
            Column("W", numeric=True),
            Column("S", numeric=True),
            Column("mean loss", fmt, numeric=True),
            Column("95% CI low", fmt, numeric=True),
            Column("95% CI high", fmt, numeric=True),
            Column("increase over full", "+" + fmt, numeric=True),
            Column("increase 95% CI low", "+" + fmt, numeric=True),
            Column("increase 95% CI high", "+" + fmt, numeric=True),
        ),
        lambda row: (
            row.setting.label,
            row.setting.window or None,
            row.setting.sinks or None,
            row.loss.mean,
            *_interval(row.loss, n),
            # full attention is the reference: its increase is zero by definition, not a measurement
            *((None, None, None) if row.setting.kind == "full" else (row.increase.mean, *_interval(row.increase, n))),
        ),
        note=(
            f"Each {unit}'s loss is its mean over the scored positions; the table averages the "
            f"{plural(n, unit)} and bootstraps over them ({result.n_bootstrap} resamples, paired for the "
            f"increase; n = {n}{', no interval' if n < 2 else ''}). Positions are 1-indexed; the first "
            f"{result.scored_from} are left out because some setting still sees every key there."
        ),
    )


def _loss_format(result: WindowTestResult) -> str:
    """One number format for every loss and increase of the table: four significant digits
    of the largest mean loss as fixed decimals (3.046 beside +0.197, not +0.1970 beside
    +2.45), or g format for losses too small or large for fixed decimals (a toy's MSE)."""
    decimals = shared_decimals((row.loss.mean for row in result.rows), 4)
    return ".4g" if decimals is None else f".{decimals}f"


def window_rows(result: WindowTestResult) -> list[dict[str, Any]]:
    """The table's rows as records (``to_dataframe``)."""
    return [
        {
            "setting": row.setting.label,
            "kind": row.setting.kind,
            "window": row.setting.window,
            "sinks": row.setting.sinks,
            "mean_loss": row.loss.mean,
            "ci_low": row.loss.ci_low,
            "ci_high": row.loss.ci_high,
            "increase": row.increase.mean,
            "increase_ci_low": row.increase.ci_low,
            "increase_ci_high": row.increase.ci_high,
            "n_units": result.n_units,
            "unit": result.unit,
        }
        for row in result.rows
    ]


def window_findings(result: WindowTestResult) -> tuple[str, ...]:
    """What was measured, and what it shows (``window_finding``)."""
    unit = result.unit if result.n_units == 1 else f"{result.unit}s"
    few = (
        ""
        if interval_possible(result.n_units)
        else f"; from fewer than {MIN_INTERVAL_UNITS} {result.unit}s none is given"
    )
    measured = (
        f"{result.model} on {result.n_units} {unit} from {result.source}, {result.n_positions} positions with a "
        f"loss each: the mean {result.loss_name} over positions {result.scored_from + 1} to {result.n_positions} "
        f"(1-indexed) of each, then over the {unit}; intervals are 95% bootstrap intervals over the {unit} (paired "
        f"for increases{few})."
    )
    return (measured, window_finding(result), *result.notes)


def window_finding(result: WindowTestResult) -> str:
    """One sentence: at the narrowest window and fewest kept tokens, the loss with the window
    alone, with the first S tokens and with S random tokens, against full attention."""
    restricted = [row for row in result.rows if row.setting.kind == "first"]
    full = result.rows[0].loss
    if not restricted:
        return f"Full attention only: mean {result.loss_name} {sig(full.mean, 4)}."
    first = min(restricted, key=lambda row: (row.setting.window, row.setting.sinks))
    w, s = first.setting.window, first.setting.sinks
    alone = next(row for row in result.rows if row.setting.kind == "window" and row.setting.window == w)
    control = next(
        row for row in result.rows if row.setting.kind == "random" and (row.setting.window, row.setting.sinks) == (w, s)
    )
    n = result.n_units

    def increase(row: SettingLoss) -> str:
        return estimate_text(row.increase.mean, *_interval(row.increase, n), n)

    return (
        f"With only the last {w} keys visible, {result.model}'s mean {result.loss_name} over {plural(n, result.unit)} "
        f"goes from {sig(full.mean, 4)} (full attention) to {sig(alone.loss.mean, 4)} (increase {increase(alone)}); "
        f"keeping {'the first token' if s == 1 else f'the first {s} tokens'} makes it {sig(first.loss.mean, 4)} "
        f"(increase {increase(first)}), while {s} random earlier token{'s' if s != 1 else ''} "
        f"make{'s' if s == 1 else ''} it {sig(control.loss.mean, 4)} (increase {increase(control)})."
    )


def smoothing_width(result: WindowTestResult) -> int:
    """Positions per running mean in the figure: about 1/32 of the positions, at least 1
    (a single token's loss swings by nats; fewer than about 8 per mean reads as noise)."""
    return max(1, result.n_positions // 32)


def _style(setting: WindowSetting, sinks: list[int]) -> tuple[str, str]:
    """(colour, line style): black full attention, red window alone, blues for the first S
    and oranges (dashed) for the control, darker for larger S."""
    if setting.kind in ("full", "window"):
        return KIND_STYLE[setting.kind]
    shades = FIRST_SHADES if setting.kind == "first" else RANDOM_SHADES
    return shades[sinks.index(setting.sinks) % len(shades)], KIND_STYLE[setting.kind][1]


def window_figure(result: WindowTestResult, path: Path) -> Any:
    """Loss against position (running mean, ``smoothing_width``), one panel per W with full
    attention, the window alone, and each S kept first and at random."""
    width = smoothing_width(result)
    sinks = sorted({row.setting.sinks for row in result.rows if row.setting.sinks})
    full = (result.rows[0].setting.label, running_mean(result.curves[0], width), *KIND_STYLE["full"])
    panels = []
    for window in sorted({row.setting.window for row in result.rows if row.setting.window}):
        series = [
            (
                row.setting.label.replace(f"last {window}", "last W"),
                running_mean(curve, width),
                *_style(row.setting, sinks),
            )
            for row, curve in zip(result.rows, result.curves, strict=True)
            if row.setting.window == window
        ]
        panels.append((f"W = {window}", [full, *series]))
    return position_curves(
        panels or [("full attention", [full])],
        path,
        f"Window test: {result.model}, {plural(result.n_units, result.unit)}",
        f"{result.loss_name} (running mean of {width})" if width > 1 else result.loss_name,
        marker_at=result.scored_from,
        marker_label="scored from here",
    )


def window_document(result: WindowTestResult, figure_dir: Path) -> ReportDocument:
    """The report: the finding, the figure, the table, what was run and what it costs."""
    window_figure(result, figure_dir / FIGURE_FILE)
    width = smoothing_width(result)
    caption = (
        f"{result.loss_name} at each position, mean over {plural(result.n_units, result.unit)}"
        + (f", then a running mean over the {width} positions up to each point" if width > 1 else "")
        + ". Masks keep every token's original position (no re-indexing)."
    )
    table = window_definition(result).table(result.rows)
    run = KeyValues(
        "What was run",
        (
            ("model", result.model),
            ("text", result.source),
            ("units", f"{plural(result.n_units, result.unit)} of {result.n_positions} positions with a loss"),
            ("seed (random control, bootstrap)", str(result.seed)),
            (
                "cost",
                f"{result.seconds:.1f} s for {result.tokens:,} positions forwarded "
                f"({result.seconds_per_1k_tokens:.3g} s per 1,000)",
            ),
        ),
    )
    sections = (
        Section("Loss against position", (Figure(figure_dir / FIGURE_FILE, caption, figure_dir),)),
        Section("Mean loss per setting", (table, Paragraph(MASK_NOTE))),
        Section("Run", (run,)),
    )
    return ReportDocument(
        "Streaming window test", f"{result.model} on {result.source}", window_findings(result), sections
    )


MASK_NOTE = (
    "Each setting hides keys from every head of every layer and keeps every token at its original "
    "position; StreamingLLM's rolling cache instead re-indexes the kept keys to consecutive positions. "
    "The random control keeps S keys drawn per query from the earlier keys that are neither first nor "
    "in the window."
)


def window_html(result: WindowTestResult) -> str:
    """Inline notebook display: the finding and the table."""
    table = window_definition(result).table(result.rows)
    return fragment(
        f"Streaming window test: {result.model}",
        f"{result.source}; {plural(result.n_units, result.unit)}",
        [bullets_html(list(window_findings(result))), inline_table(table)],
    )


def _build(result_dir: Path, figure_dir: Path) -> ReportDocument:
    return window_document(read_result(result_dir / RESULT_FILE, WindowTestResult), figure_dir)


REPORT_KINDS: tuple[ReportKind, ...] = (ReportKind("window test", (RESULT_FILE,), _build),)
