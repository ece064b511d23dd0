"""Theorem 1's trade-off, measured: a one-layer softmax head can only make its error at
default (non-trigger) positions small by putting its attention on BOS.

A ``TradeoffPoint`` pairs a model's BOS mass at default queries with its errors on the
single-layer target. Families of points trace the trade-off: the softmax construction
over its score scale (``construction_curve``) and a trained model with its queries
rescaled (``query_scale_curve``, a temperature sweep of the learned scores).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

from sinkscope.infra.arguments import PATH_TYPES, check_argument, check_items, check_path
from sinkscope.infra.bounds import NONNEGATIVE, UNBOUNDED, Bound
from sinkscope.infra.codec import write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import write_provenance
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.probes.sink_metrics import anchor_mass
from sinkscope.reports.plots import LABEL_PT, SMALL_PT, TICK_PT, TITLE_PT, save_figure
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.run_dir import load_model, read_config, require_finished
from sinkscope.toy.task import TaskConfig, eval_batch

# colour-blind-safe, distinct from one another (Okabe-Ito): one per series, its labels too
SERIES_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
MSE_FLOOR = 1e-16  # where the log-scale plot draws errors that are exactly (or nearly) 0


@dataclass(frozen=True)
class TradeoffPoint:
    """One model's place on the trade-off.

    ``anchor_mass_default``: mean BOS weight over default queries (non-trigger, after
    BOS); ``default_mse`` / ``default_linf``: mean squared and max absolute error at those
    positions; ``trigger_mse``: mean squared error at the trigger position. ``scale`` is
    the family parameter that produced the model (None outside a family).
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "scale": UNBOUNDED,
        "anchor_mass_default": NONNEGATIVE,
        "default_mse": NONNEGATIVE,
        "default_linf": NONNEGATIVE,
        "trigger_mse": NONNEGATIVE,
    }

    label: str
    scale: float | None
    anchor_mass_default: float
    default_mse: float
    default_linf: float
    trigger_mse: float


def _check_tradeoff_model(model: ToyTransformer, task: TaskConfig) -> None:
    cfg = model.cfg
    if cfg.n_layers != 1 or cfg.n_heads != 1 or cfg.has_residual:
        raise InputError(
            f"the trade-off is measured on one-layer, one-head models without a residual "
            f"(Theorem 1's setting, trained on the 'single' target); got n_layers={cfg.n_layers}, "
            f"n_heads={cfg.n_heads}, residual={cfg.has_residual}; pass a run trained with n_layers=1, n_heads=1 "
            "and no residual (the defaults of sinkscope toy train)"
        )
    if cfg.d_model != task.d_model:
        raise InputError(
            f"model d_model={cfg.d_model} does not match the task's d_model={task.d_model}; "
            "measure with the TaskConfig the model was trained on"
        )


def measure_tradeoff(
    model: ToyTransformer,
    task: TaskConfig,
    n_sequences: int = 1000,
    seed: int = 1234,
    label: str = "",
) -> TradeoffPoint:
    """BOS mass and errors of a one-layer, one-head, no-residual model on the eval batch
    (``n_sequences`` sequences, trigger at ``task.eval_trigger_position``, target 'single')."""
    _check_tradeoff_model(model, task)
    if n_sequences < 1:
        raise InputError(f"n_sequences must be >= 1, got {n_sequences}", field="n_sequences")
    batch = eval_batch(task, n_sequences, seed, target="single")
    hook = pattern_hook(0)
    device = next(model.parameters()).device
    with torch.no_grad():
        output, cache = model.run_with_cache(batch.tokens.to(device), names_filter=hook)
    pattern = cache[hook].cpu()  # [batch, head, query, key]
    error = output.cpu() - batch.targets  # [batch, pos, d_model]
    default_mask = batch.default_query_mask()  # [batch, pos]
    default_error = error[default_mask]  # [n_default_positions, d_model]
    trigger_error = error[batch.trigger_query_mask()]  # [batch, d_model]
    return TradeoffPoint(
        label=label,
        scale=None,
        anchor_mass_default=float(anchor_mass(pattern, 0, default_mask)[0]),
        default_mse=float(default_error.pow(2).mean()),
        default_linf=float(default_error.abs().max()),
        trigger_mse=float(trigger_error.pow(2).mean()),
    )


def _check_scale(value: float, name: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"every {name} must be a finite number >= 0, got {value}")
    return float(value)


def construction_curve(
    task: TaskConfig,
    scales: Iterable[float],
    n_sequences: int = 1000,
    seed: int = 1234,
) -> list[TradeoffPoint]:
    """The softmax construction (``softmax_scaled_model``) measured at each score scale."""
    points = []
    for scale in scales:
        scale = _check_scale(scale, "scale")
        model = softmax_scaled_model(task, scale)
        point = measure_tradeoff(model, task, n_sequences, seed, label=f"construction scale={scale:g}")
        points.append(replace(point, scale=scale))
    return points


def query_scale_curve(
    model: ToyTransformer,
    task: TaskConfig,
    factors: Iterable[float],
    n_sequences: int = 1000,
    seed: int = 1234,
) -> list[TradeoffPoint]:
    """A model measured with its W_Q multiplied by each factor (scores scale linearly, so
    this sweeps the temperature of the learned scores); ``model`` itself is not changed."""
    _check_tradeoff_model(model, task)
    points = []
    for factor in factors:
        factor = _check_scale(factor, "factor")
        scaled = copy.deepcopy(model)
        with torch.no_grad():
            scaled.attention(0).W_Q.mul_(factor)
        point = measure_tradeoff(scaled, task, n_sequences, seed, label=f"W_Q x {factor:g}")
        points.append(replace(point, scale=factor))
    return points


# where a point's label may go, in points from the point: nearest first, so a label moves
# only as far as it must to clear the labels placed before it
LABEL_OFFSETS = tuple(
    (dx * r, dy * r) for r in (1, 2, 3, 4) for dx, dy in ((5, 4), (5, -11), (-5, 4), (-5, -11), (0, 9), (0, -15))
)


def _place_labels(figure: Figure, labels: list[Annotation]) -> None:
    """Move each point label to the first offset (``LABEL_OFFSETS``) where it overlaps no
    label placed before it and no point's marker, inside the axes: crowded points near BOS
    mass 1 keep every label, further out, with a thin line back to their point. Where no
    offset clears all three, the first that clears the other labels."""
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    figure.draw_without_rendering()
    radius = 3.5 * figure.dpi / 72  # a marker's radius (6 pt across) and a little air
    markers = [
        Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)
        for x, y in (label.axes.transData.transform(label.xy) for label in labels if label.axes is not None)
    ]
    kept: list[Bbox] = []
    for label in labels:
        frame = label.axes.get_window_extent(renderer) if label.axes is not None else None
        fallback = None
        for dx, dy in LABEL_OFFSETS:
            _offset(label, dx, dy)
            box = label_box(label, renderer).expanded(1.05, 1.1)
            if any(box.overlaps(other) for other in kept):
                continue
            fallback = fallback or (dx, dy)
            inside = frame is None or (
                frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            )
            if inside and not any(box.overlaps(marker) for marker in markers):
                break
        else:
            _offset(label, *(fallback or LABEL_OFFSETS[0]))
        kept.append(label_box(label, renderer))


def label_box(label: Annotation, renderer: Any) -> Bbox:
    """The label's text as drawn at its current offset, without its line back to the point
    (``get_window_extent`` spans that line, which always reaches the point's marker)."""
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)


def _offset(label: Annotation, dx: float, dy: float) -> None:
    label.set_position((dx, dy))
    label.set_horizontalalignment("left" if dx >= 0 else "right")


def point_label(series: str, point: TradeoffPoint) -> str:
    """A point's label, saying which parameter it is so equal numbers of two series differ:
    ``s=4`` (the construction's score scale), ``×0.5`` (the factor on a run's W_Q)."""
    if point.scale is None:
        return "MSE 0" if point.default_mse == 0 else f"MSE {point.default_mse:.1g}"
    return f"s={point.scale:g}" if series == CONSTRUCTION_SERIES else f"\u00d7{point.scale:g}"


def plot_tradeoff(points_by_series: dict[str, list[TradeoffPoint]], path: str | Path) -> Path:
    """``tradeoff_figure`` written to ``path`` as PNG; returns ``path``."""
    save_figure(tradeoff_figure(points_by_series), path, dpi=120)
    return Path(path)


def tradeoff_figure(points_by_series: dict[str, list[TradeoffPoint]]) -> Figure:
    """A figure of default-position MSE (log scale) against BOS mass at default queries,
    one line per series in its own colour, each point labelled in that colour with its
    parameter (``point_label``). Errors below ``MSE_FLOOR`` (e.g. the exact ReLU
    construction's 0) are drawn at the floor."""
    if not any(points_by_series.values()):
        raise InputError("plot_tradeoff needs at least one series with at least one point")
    figure = Figure(figsize=(6.4, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    clipped = False
    labels = []
    for index, (name, points) in enumerate((name, points) for name, points in points_by_series.items() if points):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        xs = [p.anchor_mass_default for p in points]
        ys = [max(p.default_mse, MSE_FLOOR) for p in points]
        clipped = clipped or any(p.default_mse < MSE_FLOOR for p in points)
        axes.plot(xs, ys, marker="o", label=_legend_label(name), color=colour)
        for point, x, y in zip(points, xs, ys):
            labels.append(
                axes.annotate(
                    point_label(name, point),
                    (x, y),
                    textcoords="offset points",
                    xytext=LABEL_OFFSETS[0],
                    fontsize=SMALL_PT,
                    color=colour,
                    arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.4, "shrinkA": 0, "shrinkB": 4},
                )
            )
    axes.set_yscale("log")
    axes.set_xlabel("BOS mass at default (non-trigger) queries", fontsize=LABEL_PT)
    ylabel = "MSE at default positions"
    if clipped:
        ylabel += f" (< {MSE_FLOOR:g} drawn at {MSE_FLOOR:g})"
    axes.set_ylabel(ylabel, fontsize=LABEL_PT)
    axes.tick_params(labelsize=TICK_PT)
    axes.set_title("Theorem 1: default-position error vs sink mass", fontsize=TITLE_PT)
    axes.grid(True, which="major", alpha=0.3)
    figure.legend(loc="outside lower center", fontsize=TICK_PT, frameon=False, ncols=1)
    _place_labels(figure, labels)
    return figure


def _legend_label(series: str) -> str:
    """The series' legend entry, saying what its point labels count."""
    if series == CONSTRUCTION_SERIES:
        return "softmax construction (labels s=: score scale)"
    if series.endswith(RUN_SERIES_SUFFIX):
        return series.removesuffix(RUN_SERIES_SUFFIX) + " trained (labels \u00d7: factor on its W_Q)"
    return series


CONSTRUCTION_SCALES = (0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0)
QUERY_FACTORS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
TRADEOFF_FILE = "tradeoff.json"
TRADEOFF_FIGURE = "tradeoff.png"
CONSTRUCTION_SERIES = "softmax construction (scale)"
RELU_SERIES = "ReLU construction"
RUN_SERIES_SUFFIX = " (W_Q x factor)"  # after a trained run's directory name


@dataclass(frozen=True)
class TradeoffResult:
    """The trade-off experiment (``tradeoff.json``): the task and each named series."""

    SCHEMA: ClassVar[str] = "tradeoff"
    SCHEMA_VERSION: ClassVar[int] = 1

    task: TaskConfig
    series: dict[str, tuple[TradeoffPoint, ...]]
    notes: tuple[str, ...] = ()  # e.g. a run analysed although unfinished (allow_unfinished)


def unfinished_notes(run_dirs: Iterable[Path], allow_unfinished: bool) -> tuple[str, ...]:
    """Every run's status checked before any is analysed (``require_finished``); the notes
    of the unfinished ones that ``allow_unfinished`` lets through."""
    notes = []
    for run_dir in run_dirs:
        read_config(run_dir)  # not a run at all: said first
        notes.append(require_finished(run_dir, allow_unfinished, "measure the trade-off of"))
    return tuple(note for note in notes if note is not None)


def write_tradeoff(
    out_dir: str | Path,
    run_dirs: Iterable[str | Path] = (),
    task: TaskConfig | None = None,
    n_sequences: int = 1000,
    allow_unfinished: bool = False,
) -> TradeoffResult:
    """The trade-off experiment: the softmax construction over its scale, the exact ReLU
    construction, and each trained one-layer run (under a sweep of its query scale).
    Writes ``tradeoff.json``, ``tradeoff.png`` and ``provenance.json`` in ``out_dir``.
    An unfinished or diverged run is refused unless ``allow_unfinished`` (then the
    result's notes say so)."""
    check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path)")
    run_paths = [Path(r) for r in check_items(run_dirs, PATH_TYPES, "run_dirs", "run directory paths")]
    if task is not None:
        check_argument(task, TaskConfig, "task", "a TaskConfig or None")
    notes = unfinished_notes(run_paths, allow_unfinished)
    if task is None:
        task = read_config(run_paths[0]).task if run_paths else TaskConfig()
    series: dict[str, list[TradeoffPoint]] = {
        CONSTRUCTION_SERIES: construction_curve(task, CONSTRUCTION_SCALES, n_sequences),
        RELU_SERIES: [measure_tradeoff(relu_exact_model(task), task, n_sequences, label="relu construction")],
    }
    for run_dir in run_paths:
        config = read_config(run_dir)
        if config.task != task:
            raise InputError(f"{run_dir} was trained on a different task layout; pass runs of one task")
        series[run_dir.name + RUN_SERIES_SUFFIX] = query_scale_curve(
            load_model(run_dir), task, QUERY_FACTORS, n_sequences
        )
    out_dir = Path(out_dir)
    plot_tradeoff(series, out_dir / TRADEOFF_FIGURE)
    result = TradeoffResult(task, {name: tuple(points) for name, points in series.items()}, notes)
    write_result(out_dir / TRADEOFF_FILE, result)
    write_provenance(out_dir, "toy tradeoff", source=", ".join(str(run_dir.resolve()) for run_dir in run_paths))
    return result
