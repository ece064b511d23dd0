"""Activation patching runner: which layers, heads and positions carry a behaviour.

``activation_patching(model, source_inputs, target_inputs, hook, metric_fn, per=...)``
runs the target inputs once per site with one hook's activation at that site copied
from the source run, and scores every output with ``metric_fn``. ``per`` chooses the
sites: one per layer, per (layer, head), per (layer, position) or per (layer, head,
position). It works on toy models and ``TransformerBridge`` models alike.

For each site the table reports the metric's mean over inputs on the patched run, on
the clean target run and on the source run, the effect ``patched - target`` and the
normalised effect ``(patched - target) / (source - target)``: 0 means the site carries
none of the difference, 1 means patching it alone turns the target's metric into the
source's. The normalised effect is NaN (None in JSON) when the source and target
metrics agree to 1e-6 (relative), e.g. when the target is patched with itself. Both come
with their 95% bootstrap interval over input pairs (``sinkscope.probes.patching_intervals``),
which needs ``metric_fn`` to return one value per input and at least two pairs.

Cost: per batch, one source run caching only the patched hooks (``names_filter``), one
clean target run and one patched run per site.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sinkscope.infra.bounds import COUNT, UNBOUNDED, Bound, Problem, at_most, index_problems
from sinkscope.infra.codec import Upgrade
from sinkscope.infra.errors import InputError
from sinkscope.infra.heartbeat import progress_bar
from sinkscope.infra.intervals import MIN_INTERVAL_UNITS, interval_possible
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.interp.model_spec import ModelSpec, upgrade_model_spec_v1
from sinkscope.probes.patch_hooks import PatchSite, capture_activations, hook_reaches_output, run_patched
from sinkscope.probes.patch_sites import check_hook_heads, checked_sites, validate_per
from sinkscope.probes.patching_intervals import SiteIntervals, no_intervals, patching_intervals
from sinkscope.probes.patching_metric import MetricContext, MetricFn, MetricValues, metric_values
from sinkscope.reports.frames import dataframe, row_of

if TYPE_CHECKING:
    import pandas
    from tqdm.auto import tqdm

PATCH_VALUES: tuple[str, ...] = ("patched", "effect", "normalised_effect")
AGREEMENT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class PatchingRow:
    """One site of the tidy table. ``head``/``position`` are None when ``per`` does not
    iterate over them; metrics are means over inputs. ``*_ci_low``/``*_ci_high``: the 95%
    bootstrap interval over input pairs of the effect and of the normalised effect
    (``sinkscope.probes.patching_intervals``; NaN: none, from fewer than two pairs or a
    metric that returns only the batch mean)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "layer": COUNT,
        "head": COUNT,
        "position": COUNT,
        "patched": UNBOUNDED,
        "target": UNBOUNDED,
        "source": UNBOUNDED,
        "effect": UNBOUNDED,
        "normalised_effect": UNBOUNDED,
        "effect_ci_low": UNBOUNDED,
        "effect_ci_high": UNBOUNDED,
        "normalised_effect_ci_low": UNBOUNDED,
        "normalised_effect_ci_high": UNBOUNDED,
    }

    layer: int
    head: int | None
    position: int | None
    patched: float
    target: float
    source: float
    effect: float
    normalised_effect: float
    # files written before intervals were stored read back without them
    effect_ci_low: float = math.nan
    effect_ci_high: float = math.nan
    normalised_effect_ci_low: float = math.nan
    normalised_effect_ci_high: float = math.nan

    def inconsistencies(self) -> Iterator[Problem]:
        """Interval ends in order (NaN ends compare as in order)."""
        yield from at_most("effect_ci_low", self.effect_ci_low, self.effect_ci_high, "effect_ci_high")
        yield from at_most(
            "normalised_effect_ci_low",
            self.normalised_effect_ci_low,
            self.normalised_effect_ci_high,
            "normalised_effect_ci_high",
        )


def upgrade_patching_v1(patching: dict[str, Any]) -> dict[str, Any]:
    """A patching result of schema version 1 (alone, or nested in a toy patching run) in
    version 2's names: its model spec's ``attention_kind`` is ``attention``."""
    if not isinstance(patching.get("model"), dict):
        return patching
    return {**patching, "model": upgrade_model_spec_v1(patching["model"])}


@dataclass(frozen=True)
class PatchingResult:
    """All sites of one patching run.

    fixed_heads / fixed_positions: the heads / positions every site covers along an
    axis that ``per`` does not iterate (None: all of them). Persisted with
    ``sinkscope.infra.codec`` (a NaN normalised effect is null in the file).
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "fixed_heads": COUNT,
        "fixed_positions": COUNT,
        "n_inputs": COUNT,
        "n_pos": COUNT,
        "source_metric": UNBOUNDED,
        "target_metric": UNBOUNDED,
    }

    SCHEMA: ClassVar[str] = "patching"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: ModelSpec.attention
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_patching_v1}

    model: ModelSpec
    hook: str
    per: tuple[str, ...]
    fixed_heads: tuple[int, ...] | None
    fixed_positions: tuple[int, ...] | None
    n_inputs: int
    n_pos: int
    source_metric: float
    target_metric: float
    rows: tuple[PatchingRow, ...]
    notes: tuple[str, ...] = ()

    def inconsistencies(self) -> Iterator[Problem]:
        """Sites inside the model and the inputs: layers, heads and positions below their counts."""
        model = self.model
        for index, row in enumerate(self.rows):
            sites = [(f"rows[{index}].layer", row.layer, model.n_layers, "model.n_layers")]
            if row.head is not None:
                sites.append((f"rows[{index}].head", row.head, model.n_heads, "model.n_heads"))
            if row.position is not None:
                sites.append((f"rows[{index}].position", row.position, self.n_pos, "n_pos"))
            yield from index_problems(sites)

    def matrix(self, value: str = "normalised_effect") -> torch.Tensor:
        """One ``PatchingRow`` value laid out over the ``per`` axes, NaN at sites not
        patched: ``[layer]``, ``[layer, head]``, ``[layer, position]`` or
        ``[layer, head, position]`` (float64)."""
        if value not in PATCH_VALUES:
            raise InputError(f"unknown patching value {value!r}; choose one of {', '.join(PATCH_VALUES)}")
        sizes = {"layer": self.model.n_layers, "head": self.model.heads_of(self.hook), "position": self.n_pos}
        matrix = torch.full([sizes[axis] for axis in self.per], float("nan"), dtype=torch.float64)
        for row in self.rows:
            index = tuple({"layer": row.layer, "head": row.head, "position": row.position}[axis] for axis in self.per)
            matrix[index] = getattr(row, value)
        return matrix

    def _repr_html_(self) -> str:
        """Inline display in a notebook: the effect map and the largest effects."""
        from sinkscope.probes.display import patching_html  # the display imports this module's types for typing only

        return patching_html(self)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per patched site (layer, head, position; None along axes not iterated)."""
        return dataframe(row_of(row, hook=self.hook) for row in self.rows)

    def table(self) -> list[dict[str, Any]]:
        """One dict per site (the tidy table)."""
        return [asdict(row) for row in self.rows]


def _prepare_pair(
    model: HookedModel,
    source_inputs: torch.Tensor | Sequence[str],
    target_inputs: torch.Tensor | Sequence[str],
    attention_mask: torch.Tensor | None,
) -> tuple[PreparedBatch, PreparedBatch]:
    source = model.prepare(source_inputs, attention_mask)
    target = model.prepare(target_inputs, attention_mask)
    if source.model_input.shape != target.model_input.shape:
        raise InputError(
            f"source inputs {tuple(source.model_input.shape)} and target inputs "
            f"{tuple(target.model_input.shape)} must have the same shape; pair each target with one "
            "source of the same length (pass token ids to control tokenization)"
        )
    if not torch.equal(source.attention_mask, target.attention_mask):
        raise InputError(
            "source and target inputs have different padding; pair inputs of equal token length "
            "or pass token ids with one shared attention_mask"
        )
    return source, target


def _check_reaches_output(hooked: HookedModel, target: PreparedBatch, hook_name: str) -> None:
    """Refuse a bridge hook whose edits never reach the model's output."""
    if hooked.is_bridge and not hook_reaches_output(
        hooked, target.select(torch.arange(1, device=target.anchor.device)), hook_name
    ):
        raise InputError(
            f"edits at {hook_name} do not reach this model's output (a read-only hook in this bridge); "
            "patch 'z' or 'resid_pre' instead"
        )


def _metric_runs(
    hooked: HookedModel,
    source: PreparedBatch,
    target: PreparedBatch,
    sites: list[PatchSite],
    hook_names: list[str],
    metric_fn: MetricFn,
    batch_size: int,
    bar: tqdm,
) -> MetricValues:
    """The metric for every input on the source run (caching ``hook_names``), the clean
    target run and the target run patched at each site, batch by batch."""
    n = target.batch_size
    values = MetricValues(
        torch.empty(n, dtype=torch.float64),
        torch.empty(n, dtype=torch.float64),
        torch.empty(len(sites), n, dtype=torch.float64),
        per_input=True,
    )
    every_per_input = True
    for start in range(0, n, batch_size):
        rows = torch.arange(start, min(start + batch_size, n))
        device_rows = rows.to(target.anchor.device)
        source_batch, target_batch = source.select(device_rows), target.select(device_rows)
        context = MetricContext(rows=rows, batch=target_batch)
        source_output, cache = capture_activations(hooked, source_batch, hook_names)
        values.source[rows], per_input = metric_values(metric_fn, source_output, context)
        with torch.no_grad():
            values.target[rows], _ = metric_values(metric_fn, hooked.forward(target_batch), context)
        every_per_input &= per_input
        bar.update(2)
        for index, site in enumerate(sites):
            output = run_patched(hooked, target_batch, [site], cache)
            values.patched[index, rows], _ = metric_values(metric_fn, output, context)
            bar.update(1)
        del cache, source_output  # freed before the next batch's capture
    return replace(values, per_input=every_per_input)


def _patching_rows(
    sites: list[PatchSite], axes: tuple[str, ...], values: MetricValues
) -> tuple[tuple[PatchingRow, ...], float, float, tuple[str, ...]]:
    """One ``PatchingRow`` per site (means over inputs, with their intervals), the source
    and target metrics, and notes: when source and target agree (then every normalised
    effect is NaN) and when there are no intervals."""
    n = values.target.shape[0]
    source_metric, target_metric = float(values.source.mean()), float(values.target.mean())
    difference = source_metric - target_metric
    agree = abs(difference) <= AGREEMENT_TOLERANCE * max(1.0, abs(source_metric), abs(target_metric))
    intervals = (
        patching_intervals(values.source, values.target, values.patched)
        if values.per_input
        else no_intervals(len(sites))
    )
    rows = tuple(
        _row(site, axes, float(values.patched[index].mean()), target_metric, source_metric, agree, intervals, index)
        for index, site in enumerate(sites)
    )
    notes: list[str] = []
    if agree:
        notes.append(
            f"source and target metrics agree ({source_metric:.6g} vs {target_metric:.6g}): "
            "normalised_effect is undefined (NaN); read effect instead"
        )
    if not values.per_input:
        notes.append(
            "metric_fn returned one value per batch (its mean), not one per input: no intervals; "
            "return a tensor [batch] for them"
        )
    elif not interval_possible(n):
        notes.append(f"n = {n} input {'pair' if n == 1 else 'pairs'}, no interval (fewer than {MIN_INTERVAL_UNITS})")
    elif not agree and not intervals.normalised_defined:
        notes.append(
            "source - target changes sign or vanishes in some bootstrap draws: normalised_effect has no "
            "interval; read effect's"
        )
    return rows, source_metric, target_metric, tuple(notes)


def _row(
    site: PatchSite,
    axes: tuple[str, ...],
    patched: float,
    target: float,
    source: float,
    agree: bool,
    intervals: SiteIntervals,
    index: int,
) -> PatchingRow:
    nan = float("nan")
    return PatchingRow(
        layer=site.layer,
        head=site.heads[0] if "head" in axes and site.heads is not None else None,
        position=site.positions[0] if "position" in axes and site.positions is not None else None,
        patched=patched,
        target=target,
        source=source,
        effect=patched - target,
        normalised_effect=nan if agree else (patched - target) / (source - target),
        effect_ci_low=float(intervals.effect_low[index]),
        effect_ci_high=float(intervals.effect_high[index]),
        normalised_effect_ci_low=nan if agree else float(intervals.normalised_low[index]),
        normalised_effect_ci_high=nan if agree else float(intervals.normalised_high[index]),
    )


def activation_patching(
    model: torch.nn.Module | HookedModel,
    source_inputs: torch.Tensor | Sequence[str],
    target_inputs: torch.Tensor | Sequence[str],
    hook: str,
    metric_fn: MetricFn,
    per: Sequence[str] = ("layer", "head"),
    attention_mask: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    batch_size: int = 32,
    progress: bool = False,
) -> PatchingResult:
    """Patch ``hook`` from the source run into the target run, one site at a time.

    source_inputs / target_inputs: paired inputs of the same shape: toy tokens
    ``[n, pos, d_model]``, token ids ``[n, pos]`` or strings that tokenize to equal
    lengths; attention_mask: ``[n, pos]``, shared by both (token ids only).
    hook: a short hook name (``"z"``, ``"pattern"``, ``"resid_pre"``, ``"attn_out"``, ...;
    see ``sinkscope.probes.patch_hooks``); for ``pattern``/``attn_scores`` a position is a query row.
    metric_fn(output, context) -> ``[batch]`` or a scalar (the batch mean): output is the
    model output (toy ``[batch, pos, d_model]`` or logits ``[batch, pos, vocab]``).
    per: the axes to iterate. Heads are query heads, except for ``k`` and ``v`` on
    grouped- or multi-query models, whose heads are the ``n_kv_heads`` key/value heads
    (patching kv head g changes every query head that reads it). layers / heads / positions restrict the sites; along an
    axis not in ``per``, every site covers all the given heads / positions together.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}", field="batch_size")
    hooked = model if isinstance(model, HookedModel) else HookedModel(model)
    spec = hooked.spec
    axes = validate_per(per)
    check_hook_heads(hook, axes, heads)
    source, target = _prepare_pair(hooked, source_inputs, target_inputs, attention_mask)
    if target.batch_size < 1:
        raise InputError("activation patching needs at least one pair of source and target inputs; pass some")
    sites, head_list, position_list = checked_sites(spec, hook, axes, layers, heads, positions, target.n_pos)
    hook_names = sorted({site.hook_name for site in sites})
    spec.require_hooks(hook_names, f"patching {hook!r}")
    _check_reaches_output(hooked, target, hook_names[0])
    total_runs = math.ceil(target.batch_size / batch_size) * (len(sites) + 2)
    with progress_bar(total_runs, f"patching {hook}", progress, leave=True) as bar:
        values = _metric_runs(hooked, source, target, sites, hook_names, metric_fn, batch_size, bar)
    rows, source_metric, target_metric, notes = _patching_rows(sites, axes, values)
    return PatchingResult(
        model=spec,
        hook=hook,
        per=axes,
        fixed_heads=None if "head" in axes else head_list,
        fixed_positions=None if "position" in axes else position_list,
        n_inputs=target.batch_size,
        n_pos=target.n_pos,
        source_metric=source_metric,
        target_metric=target_metric,
        rows=rows,
        notes=notes,
    )
