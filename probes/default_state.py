"""The default-state hypothesis test, generic over a model, inputs and an error function.

A sink head parks its mass on the anchor when it has nothing to do (the default
state). If that is what the sink is for, ``remove_sink`` (take the anchor away and
renormalise) should break the default positions' outputs, while the matched control
``mask_random_key`` (take one random visible non-anchor key away per query and
renormalise) should barely matter. For each sink head, and for all sink heads
together, this reports the error before, after removal and after the control, the
per-input increases with bootstrap confidence intervals over inputs, and Cohen's d of
the paired difference (removal increase minus control increase).

``error_fn(output, batch) -> [batch]`` scores each input: e.g. the mean squared error
at the toy task's default positions, or a language model's per-input loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sinkscope.infra.arguments import check_argument, check_seed
from sinkscope.infra.bounds import COUNT, FRACTION, UNBOUNDED, Bound, Problem, at_most
from sinkscope.infra.errors import InputError
from sinkscope.infra.intervals import interval_possible
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.probes.head_ablations import batch_head_means, head_ablation_reading
from sinkscope.probes.interventions import (
    HeadMeans,
    HeadRef,
    Intervention,
    intervention_hooks,
    mask_random_key,
    mean_ablate_head,
    open_gate,
    remove_learned_sink,
    remove_null,
    remove_sink,
    zero_head,
)
from sinkscope.reports.frames import dataframe

if TYPE_CHECKING:
    import pandas

ErrorFn = Callable[[torch.Tensor, PreparedBatch], torch.Tensor]
# what the test may take a default state away with: the anchor key, learned sink logits,
# any null, or a gate (forced open)
REMOVALS = (remove_sink, remove_learned_sink, remove_null, open_gate)
ALL_SINK_HEADS = "all_sink_heads"  # the label of the row that removes every sink head at once


@dataclass(frozen=True)
class DefaultStateConfig:
    """n_bootstrap resamples of the inputs for ``confidence`` intervals; ``seed`` fixes
    both the control's random keys and the bootstrap; ``batch_size``: run the inputs in
    chunks of this many (None: all at once); ``max_single_heads``: test at most this many
    sink heads one by one, the first ones in the order given (None: every one); the set
    of all sink heads is tested together either way. Each tested set costs two forward
    passes over the inputs, which on a model with dozens of sink heads is most of the work;
    ``head_ablations``: each tested set's output also zero- and mean-ablated beside its
    sink removal (sinkscope.probes.head_ablations), two more passes per set and one for
    the heads' mean outputs."""

    n_bootstrap: int = 1000
    confidence: float = 0.95
    seed: int = 0
    batch_size: int | None = None
    max_single_heads: int | None = None
    head_ablations: bool = True

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if not isinstance(self.head_ablations, bool):
            raise InputError(
                f"head_ablations must be True or False, got {self.head_ablations!r}", field="head_ablations"
            )
        for name in ("n_bootstrap", "batch_size", "max_single_heads"):
            value = getattr(self, name)
            if value is not None:
                check_argument(value, int, name, "an integer" if name == "n_bootstrap" else "an integer or None")
        check_argument(self.confidence, (int, float), "confidence", "a number in (0, 1), e.g. 0.95")
        if self.max_single_heads is not None and self.max_single_heads < 0:
            raise InputError(
                f"max_single_heads must be >= 0 or None, got {self.max_single_heads}", field="max_single_heads"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}", field="batch_size")
        if self.n_bootstrap < 1:
            raise InputError(f"n_bootstrap must be >= 1, got {self.n_bootstrap}", field="n_bootstrap")
        if not 0.0 < self.confidence < 1.0:
            raise InputError(f"confidence must lie in (0, 1), got {self.confidence}", field="confidence")


@dataclass(frozen=True)
class Estimate:
    """A mean over inputs with its bootstrap confidence interval (NaN ends from fewer than
    two inputs: no interval)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"mean": UNBOUNDED, "ci_low": UNBOUNDED, "ci_high": UNBOUNDED}

    mean: float
    ci_low: float
    ci_high: float

    def inconsistencies(self) -> Iterator[Problem]:
        """An interval whose ends are in order (NaN ends compare as in order)."""
        yield from at_most("ci_low", self.ci_low, self.ci_high, "ci_high")


@dataclass(frozen=True)
class DefaultStateRow:
    """One tested head set: ``head_set``, the ``(layer, head)`` pairs whose sink it removes,
    ``label`` "L{layer}H{head}" or ``ALL_SINK_HEADS``."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "head_set": COUNT,
        "error_before": UNBOUNDED,
        "error_after_remove": UNBOUNDED,
        "error_after_control": UNBOUNDED,
        "cohens_d": UNBOUNDED,
    }

    label: str
    head_set: tuple[HeadRef, ...]
    error_before: float
    error_after_remove: float
    error_after_control: float
    remove_increase: Estimate
    control_increase: Estimate
    cohens_d: float
    # the head ablations (None where not run, and in files written before them): the
    # increase under zero- and mean-ablation of the heads' output, and the paired
    # difference of sink removal's increase minus the mean-ablation's
    zero_increase: Estimate | None = None
    mean_increase: Estimate | None = None
    remove_minus_mean: Estimate | None = None


def tested_rows(rows: tuple[DefaultStateRow, ...], together: DefaultStateRow | None) -> tuple[DefaultStateRow, ...]:
    """Every test run, once each, in table order: the heads alone, then all of them together
    unless that set is one of the heads already tested alone (a single sink head)."""
    if together is None or together.label in {row.label for row in rows}:
        return rows
    return (*rows, together)


@dataclass(frozen=True)
class DefaultStateResult:
    """The test of ``sink_heads`` (``(layer, head)`` pairs in the order given; an audit gives
    them strongest first). ``rows``: each sink head alone, in that order, up to the cap
    (``max_single_heads``); ``all_sink_heads``: every sink head removed at once, a test of
    its own when there are several, the one head's row when there is only one (the same
    test), None when nothing was tested; ``note`` says why (no sink heads) or what the cap
    left out."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"sink_heads": COUNT, "n_inputs": COUNT, "confidence": FRACTION}

    sink_heads: tuple[HeadRef, ...]
    n_inputs: int
    rows: tuple[DefaultStateRow, ...]
    all_sink_heads: DefaultStateRow | None
    note: str
    confidence: float = 0.95  # the intervals' level (DefaultStateConfig.confidence)

    def tested_rows(self) -> tuple[DefaultStateRow, ...]:
        """Every test run, once each, in table order (``tested_rows``)."""
        return tested_rows(self.rows, self.all_sink_heads)

    def _repr_html_(self) -> str:
        """Inline display in a notebook: the table of removals beside their controls."""
        from sinkscope.probes.display import (
            default_state_html,  # the display imports this module's types for typing only
        )

        return default_state_html(self)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per tested head set: errors, the two increases with their intervals, d."""
        return dataframe(
            {
                "label": row.label,
                "head_set": " ".join(f"L{layer}H{head}" for layer, head in row.head_set),
                "error_before": row.error_before,
                "error_after_remove": row.error_after_remove,
                "error_after_control": row.error_after_control,
                **_estimate_columns(row),
                "cohens_d": row.cohens_d,
                "head_ablation_reading": head_ablation_reading(row),
            }
            for row in self.tested_rows()
        )


ESTIMATE_FIELDS = ("remove_increase", "control_increase", "zero_increase", "mean_increase", "remove_minus_mean")


def _estimate_columns(row: DefaultStateRow) -> dict[str, float]:
    """Each estimate's mean and interval ends as columns (NaN where the row has none)."""
    columns = {}
    for name in ESTIMATE_FIELDS:
        estimate = getattr(row, name)
        for part in ("mean", "ci_low", "ci_high"):
            columns[f"{name}_{part}"] = math.nan if estimate is None else getattr(estimate, part)
    return columns


def upgrade_default_state_row_v1(row: dict[str, Any]) -> dict[str, Any]:
    """A ``DefaultStateRow`` of schema version 1 in today's names (``heads`` became ``head_set``)."""
    return {("head_set" if key == "heads" else key): value for key, value in row.items()}


def split_all_sink_heads(rows: list[Any], sink_heads: list[Any]) -> tuple[list[Any], Any]:
    """Schema version 1's rows of a default-state test (JSON objects; the all-sink-heads
    row last when there were several sink heads) as today's (the heads tested alone, the
    all-sink-heads row or None), the way ``default_state_test`` now returns them."""
    upgraded = [upgrade_default_state_row_v1(row) for row in rows]
    alone = [row for row in upgraded if row.get("label") != ALL_SINK_HEADS]
    together = next((row for row in upgraded if row.get("label") == ALL_SINK_HEADS), None)
    if together is None and len(sink_heads) == 1 and alone:
        together = alone[0]
    return alone, together


def upgrade_default_state_result_v1(result: dict[str, Any]) -> dict[str, Any]:
    """A default-state result as files of schema version 1 nest it (an audit's ablation)
    in version 2's layout (see ``split_all_sink_heads``)."""
    rows, together = split_all_sink_heads(result.get("rows", []), result.get("sink_heads", []))
    return {**result, "rows": rows, "all_sink_heads": together}


def bootstrap(values: torch.Tensor, n_bootstrap: int, generator: torch.Generator, confidence: float = 0.95) -> Estimate:
    """Mean of ``values [n]`` and its percentile bootstrap interval over the n units: none
    (NaN ends) from fewer than ``MIN_INTERVAL_UNITS`` (sinkscope.infra.intervals). Two calls with
    generators seeded alike draw the same resamples, so their intervals pair unit by unit."""
    n = int(values.shape[0])
    values = values.double()
    if not interval_possible(n):
        return Estimate(mean=float(values.mean()), ci_low=math.nan, ci_high=math.nan)
    draws = torch.randint(0, n, (n_bootstrap, n), generator=generator)
    means = values[draws].mean(dim=1)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=means.dtype))
    return Estimate(mean=float(values.mean()), ci_low=float(low), ci_high=float(high))


def ratio_bootstrap(
    numerator: torch.Tensor,
    denominator: torch.Tensor,
    n_bootstrap: int,
    generator: torch.Generator,
    confidence: float = 0.95,
) -> Estimate:
    """sum(numerator) / sum(denominator) over ``[n]`` paired units, and its percentile
    bootstrap interval from resampling the units (pairs stay together): none (NaN ends)
    from fewer than ``MIN_INTERVAL_UNITS``. A zero denominator sum gives NaN throughout."""
    n = int(numerator.shape[0])
    numerator, denominator = numerator.double(), denominator.double()
    total = float(denominator.sum())
    ratio = float(numerator.sum()) / total if total != 0 else math.nan
    if not interval_possible(n) or math.isnan(ratio):
        return Estimate(mean=ratio, ci_low=math.nan, ci_high=math.nan)
    draws = torch.randint(0, n, (n_bootstrap, n), generator=generator)
    ratios = numerator[draws].sum(dim=1) / denominator[draws].sum(dim=1)
    tail = (1.0 - confidence) / 2
    low, high = torch.nanquantile(ratios, torch.tensor([tail, 1.0 - tail], dtype=ratios.dtype))
    return Estimate(mean=ratio, ci_low=float(low), ci_high=float(high))


def _errors(
    model: HookedModel,
    batch: PreparedBatch,
    error_fn: ErrorFn,
    intervention: Intervention | None,
    batch_size: int | None,
) -> torch.Tensor:
    step = batch_size or batch.batch_size
    chunks = []
    for start in range(0, batch.batch_size, step):
        stop = min(start + step, batch.batch_size)
        part = (
            batch if step >= batch.batch_size else batch.select(torch.arange(start, stop, device=batch.anchor.device))
        )
        hooks = [] if intervention is None else intervention_hooks(model, part, intervention)
        with torch.no_grad():
            output = model.run_with_hooks(part, hooks)
        errors = error_fn(output, part)
        if errors.shape != (part.batch_size,):
            raise InputError(
                f"error_fn must return one error per input, shape [{part.batch_size}], got {tuple(errors.shape)}"
            )
        chunks.append(errors.detach().double().cpu())
    return torch.cat(chunks)


def _check_functions(error_fn: object, removal: object) -> None:
    if removal not in REMOVALS:
        raise InputError(
            "removal must be remove_sink, remove_learned_sink, remove_null or open_gate (from "
            f"sinkscope.probes.interventions), got {removal!r}",
            field="removal",
        )
    if not callable(error_fn):
        raise InputError(f"error_fn must be a function (logits, batch) -> errors, got {error_fn!r}", field="error_fn")


def default_state_test(
    model: torch.nn.Module | HookedModel,
    inputs: torch.Tensor | Sequence[str],
    sink_heads: Sequence[HeadRef],
    error_fn: ErrorFn,
    attention_mask: torch.Tensor | None = None,
    config: DefaultStateConfig = DefaultStateConfig(),
    removal: Callable[[Sequence[HeadRef]], Intervention] = remove_sink,
) -> DefaultStateResult:
    """Run the test on one batch of ``inputs`` (see the module docstring). ``sink_heads``: e.g. ``probe_model(...).sink_heads()``; empty means there is no sink
    to remove, which the result reports instead of testing. ``removal``: how a head's sink
    is taken away: ``remove_sink`` (the anchor key), ``remove_learned_sink`` for a
    model's learned sink logits (gpt-oss), ``remove_null`` for any null (a mitigation
    kind's), or ``open_gate`` (a gated kind's gate forced open), each against the same
    random-key control.
    """
    _check_functions(error_fn, removal)
    hooked = model if isinstance(model, HookedModel) else HookedModel(model)
    batch = hooked.prepare(inputs, attention_mask)
    heads = remove_sink(sink_heads).heads if len(sink_heads) else ()  # (layer, head) pairs or names like "L0H3"
    if not heads:
        return DefaultStateResult(
            heads, batch.batch_size, (), None, "no sink heads: there is no sink to remove", config.confidence
        )
    if len(set(heads)) < len(heads):
        repeated = sorted({f"L{layer}H{head}" for layer, head in heads if heads.count((layer, head)) > 1})
        raise InputError(
            f"sink_heads names {', '.join(repeated)} more than once; give each head once", field="sink_heads"
        )
    if batch.batch_size == 0:
        raise InputError("the default-state test needs at least one input; pass a non-empty batch", field="inputs")
    test = _HeadSetTest(
        hooked,
        batch,
        error_fn,
        removal,
        config,
        before=_errors(hooked, batch, error_fn, None, config.batch_size),
        means=batch_head_means(hooked, batch, config.batch_size) if config.head_ablations else None,
    )
    singles = heads if config.max_single_heads is None else heads[: config.max_single_heads]
    if len(singles) == len(heads):
        note = ""
    elif len(heads) == 1:
        note = "the one sink head tested once, as all sink heads (max_single_heads = 0)"
    else:
        note = (
            f"{len(singles)} of {len(heads)} sink heads tested one by one (the first {len(singles)} in the order given), "
            f"all {len(heads)} together"
        )
    # the heads alone first, then all together: the bootstrap draws from one generator in this order
    rows = tuple(test.row(f"L{layer}H{head}", ((layer, head),)) for layer, head in singles)
    if len(heads) > 1:
        together: DefaultStateRow | None = test.row(ALL_SINK_HEADS, heads)
    else:  # one sink head: removing all of them is removing it, tested once (alone, unless the cap left it out)
        ((layer, head),) = heads
        together = rows[0] if rows else test.row(f"L{layer}H{head}", heads)
    return DefaultStateResult(heads, batch.batch_size, rows, together, note, config.confidence)


@dataclass
class _HeadSetTest:
    """One default-state test in progress: the inputs' errors with nothing removed, and the
    generators its intervals draw from (the head ablations from a second one, so that
    adding them left the removal's and control's intervals as they were)."""

    hooked: HookedModel
    batch: PreparedBatch
    error_fn: ErrorFn
    removal: Callable[[Sequence[HeadRef]], Intervention]
    config: DefaultStateConfig
    before: torch.Tensor
    means: HeadMeans | None

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.ablation_generator = torch.Generator().manual_seed(self.config.seed)

    def increase(self, intervention: Intervention) -> torch.Tensor:
        """Each input's error change under ``intervention`` ``[n]``."""
        return _errors(self.hooked, self.batch, self.error_fn, intervention, self.config.batch_size) - self.before

    def estimate(self, values: torch.Tensor, generator: torch.Generator) -> Estimate:
        return bootstrap(values, self.config.n_bootstrap, generator, self.config.confidence)

    def row(self, label: str, head_set: tuple[HeadRef, ...]) -> DefaultStateRow:
        before = self.before
        removed = self.increase(self.removal(head_set))
        control = self.increase(mask_random_key(head_set, seed=self.config.seed))
        difference = removed - control
        spread = float(difference.std()) if difference.numel() > 1 else 0.0
        row = DefaultStateRow(
            label=label,
            head_set=head_set,
            error_before=float(before.mean()),
            error_after_remove=float((before + removed).mean()),
            error_after_control=float((before + control).mean()),
            remove_increase=self.estimate(removed, self.generator),
            control_increase=self.estimate(control, self.generator),
            cohens_d=float(difference.mean()) / spread if spread > 0 else float("nan"),
        )
        if self.means is None:
            return row
        zeroed = self.increase(zero_head(head_set))
        averaged = self.increase(mean_ablate_head(head_set, self.means))
        return replace(
            row,
            zero_increase=self.estimate(zeroed, self.ablation_generator),
            mean_increase=self.estimate(averaged, self.ablation_generator),
            remove_minus_mean=self.estimate(removed - averaged, self.ablation_generator),
        )
