"""When a toy run's sink forms: its logged metrics (``metrics.jsonl``) drawn against the step.

Every logged step holds, on that step's training batch, each head's BOS mass at the
non-trigger queries (``anchor_mass_default``), the number of heads with a sink (BOS mass
>= 0.9) and Gu et al.'s sink rate per ε (runs logged before the sink rate was recorded
draw the first two only). One point per logged step, nothing between them interpolated.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sinkscope.probes.sink_metrics import SINK_EPS
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, save_figure
from sinkscope.reports.step_axis import STEP_AXIS, set_step_scale

SINK_FORMATION_FIGURE = "sink_formation.png"


def _layer_means(record: dict) -> list[float]:
    """Mean BOS mass over each layer's heads at the non-trigger queries (NaN: none logged)."""
    return [
        float(np.mean([mass for mass in layer if mass is not None])) if any(m is not None for m in layer) else math.nan
        for layer in record["anchor_mass_default"]
    ]


def _sink_heads(record: dict) -> int:
    return sum(mass is not None and mass >= 1.0 - SINK_EPS for layer in record["anchor_mass_default"] for mass in layer)


def _masses(value: object) -> bool:
    """``[layer][head]`` numbers or nulls, every layer with the same number of heads."""
    if not isinstance(value, list) or not value or not all(isinstance(layer, list) and layer for layer in value):
        return False
    numbers = all(m is None or (isinstance(m, (int, float)) and not isinstance(m, bool)) for ly in value for m in ly)
    return numbers and len({len(layer) for layer in value}) == 1


def _rates(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(rate, (int, float)) and not isinstance(rate, bool) for rate in value.values()
    )


def formation_records(records: Sequence[dict]) -> list[dict]:
    """The logged lines that can be drawn, in step order (a step logged twice, as after a
    resume that redid it: its last line): a whole-number step and per-head BOS masses of
    the same shape as the first such line's; a ``sink_rate`` kept only where every line
    has one with the same thresholds (a line edited by hand is left out, not drawn)."""
    by_step: dict[int, dict] = {}
    for record in records:
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and _masses(record.get("anchor_mass_default")):
            by_step[step] = record
    rows = [by_step[step] for step in sorted(by_step)]
    if rows:
        shape = [len(layer) for layer in rows[0]["anchor_mass_default"]]
        rows = [row for row in rows if [len(layer) for layer in row["anchor_mass_default"]] == shape]
    rated = rows and all(_rates(row.get("sink_rate")) for row in rows)
    if rated and len({tuple(row["sink_rate"]) for row in rows}) == 1:
        return rows
    return [{key: value for key, value in row.items() if key != "sink_rate"} for row in rows]


def sink_formation_figure(records: Sequence[dict], title: str, path: str | os.PathLike) -> Figure:
    """Sink rate (where logged), sink heads and each layer's BOS mass against the step."""
    rows = formation_records(records)
    steps = [record["step"] for record in rows]
    rated = all(isinstance(record.get("sink_rate"), dict) for record in rows)
    fig = Figure(figsize=(PAGE_WIDTH_IN, 3.9), layout="constrained")
    axes = list(fig.subplots(1, 3 if rated else 2))
    if rated:
        rate_ax = axes.pop(0)
        for k, eps in enumerate(rows[0]["sink_rate"]):
            rate_ax.plot(steps, [record["sink_rate"][eps] for record in rows], marker=".", color=f"C{k}")
            rate_ax.lines[-1].set_label(f"ε = {eps}")
        rate_ax.set_ylim(-2.0, 102.0)
        _legend_under(rate_ax)
        _style(rate_ax, "sink rate (Sink₁(ε)), training batch", "% of (sequence, layer, head)", steps)
    heads_ax, layer_ax = axes
    heads_ax.plot(steps, [_sink_heads(record) for record in rows], marker=".", color="C3")
    n_heads = sum(len(layer) for layer in rows[0]["anchor_mass_default"])
    heads_ax.set_ylim(-0.3, n_heads + 0.3)
    heads_ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of heads
    _style(heads_ax, f"heads with BOS mass ≥ {1 - SINK_EPS:g} (of {n_heads})", "sink heads", steps)
    means = np.array([_layer_means(record) for record in rows])  # [step, layer]
    for layer in range(means.shape[1]):
        layer_ax.plot(steps, means[:, layer], marker=".", label=f"layer {layer}")
    layer_ax.set_ylim(-0.02, 1.02)
    _legend_under(layer_ax)
    _style(layer_ax, "BOS mass at non-trigger queries (mean over heads)", "anchor mass", steps)
    fig.suptitle(title, fontsize=TITLE_PT)
    return save_figure(fig, path)


def _legend_under(ax) -> None:
    """The panel's legend under its x axis: inside, it sat on the curves' plateaus at 0 and 1."""
    n_labels = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize=TICK_PT, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=min(4, n_labels), frameon=False)


def _style(ax, title: str, ylabel: str, steps: Sequence[int]) -> None:
    set_step_scale(ax, steps)
    ax.set_title(title, fontsize=TITLE_PT)
    ax.set_xlabel(STEP_AXIS, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(alpha=0.3)


def formation_finding(records: Sequence[dict], name: str) -> str | None:
    """The first logged step with a sink head, and how many there were at the last one."""
    rows = formation_records(records)
    if len(rows) < 2:
        return None
    first = next((record for record in rows if _sink_heads(record) > 0), None)
    last = rows[-1]
    if first is None:
        return (
            f"{name} formed no sink head over its {len(rows)} logged steps (to step {last['step']:,}): no head's BOS mass "
            f"at the non-trigger queries of its training batch reached {1 - SINK_EPS:g}."
        )
    return (
        f"{name}'s first sink head appears at logged step {first['step']:,} (of {len(rows)} logged, every "
        f"{_interval(rows)} steps); at step {last['step']:,} it has {_sink_heads(last)} (BOS mass ≥ {1 - SINK_EPS:g} "
        "at the non-trigger queries of that step's training batch)."
    )


def _interval(rows: Sequence[dict]) -> str:
    gaps = {b["step"] - a["step"] for a, b in zip(rows, rows[1:])}
    return f"{min(gaps):,}" if len(gaps) == 1 else f"{min(gaps):,} to {max(gaps):,}"
