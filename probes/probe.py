"""What a probe is asked and what it measures: ``ProbeConfig``, the per-head and per-layer
rows (``HeadProbe``, ``LayerProbe``), Gu et al.'s sink rates (``SinkRate``) and the whole
``ProbeResult`` (persisted as ``probe.json``, schema version 2). ``sinkscope.probes.runner``
computes them; docs/metrics.md defines every metric."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.atomic_io import atomic_write_text
from sinkscope.infra.bounds import (
    COUNT,
    FRACTION,
    NONNEGATIVE,
    PERCENT,
    POSITIVE,
    UNBOUNDED,
    Bound,
    Problem,
    at_most,
    head_grid_problems,
    index_problems,
    outside,
)
from sinkscope.infra.codec import Upgrade
from sinkscope.infra.errors import InputError
from sinkscope.interp.attention_kinds import NORMALISED_KINDS
from sinkscope.interp.model_spec import ModelSpec
from sinkscope.probes.head_classes import HEAD_CLASSES
from sinkscope.probes.layer_selection import (  # re-exported: callers import them from here
    check_layers,
    layer_selection,
    layers_text,
    probed_layers,
)
from sinkscope.probes.layer_selection import (
    layers_note as layers_note,
)
from sinkscope.probes.layer_selection import (
    layers_setting as layers_setting,
)
from sinkscope.probes.probe_upgrades import upgrade_probe_v1 as upgrade_probe_v1  # audit.py reads it here
from sinkscope.probes.secondary_result import SecondarySinks
from sinkscope.probes.sink_metrics import (
    SINK_EPS,
    SINK_RATE_EPSILONS,
)
from sinkscope.reports.document import Column, Table, records_table
from sinkscope.reports.frames import dataframe, row_of, without_unmeasured
from sinkscope.reports.text import table_csv

if TYPE_CHECKING:
    import pandas

COSINE = Bound(-1.0, 1.0, 1e-6)
SECONDARY_MIN_MASS = 0.3  # a key's mean attention from later queries that makes it a secondary sink
SECONDARY_MIN_QUERIES = 4  # ... over at least this many later queries (fixed: fewer say little)
HEADS_CSV = "heads.csv"  # ProbeResult.heads_csv() in a result directory


@dataclass(frozen=True)
class ProbeConfig:
    """What to measure and with which thresholds.

    sink_eps: a head is a sink head when its anchor mass over selected queries is
    >= 1 - sink_eps. alpha_k: Gu et al.'s k, counted from each row's first real token.
    dormant: row_entropy <= dormant_entropy_max and anchor_mass >= dormant_anchor_min.
    with_values / with_residual: also read hook_v + hook_z / hook_resid_post.
    layers: the layers probed, ascending (None: every layer); the result has rows for
    these layers only, and its sink rates and layer-output norms are over them.
    with_key_geometry / with_secondary_sinks: also read hook_q + hook_k (+ hook_rot_q/k) /
    gather secondary sinks (``sinkscope.probes.key_geometry``, ``secondary_sinks``).
    random_key_seed: seeds the random key of each prompt (``sinkscope.probes.head_classes``).
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "sink_eps": FRACTION,
        "alpha_k": COUNT,
        "sink_rate_eps": FRACTION,
        "dormant_entropy_max": UNBOUNDED,
        "dormant_anchor_min": UNBOUNDED,
        "massive_abs": NONNEGATIVE,
        "massive_ratio": NONNEGATIVE,
        "batch_size": POSITIVE,
        "layers": COUNT,
        "secondary_min_mass": FRACTION,
        "random_key_seed": COUNT,
    }

    sink_eps: float = SINK_EPS
    alpha_k: int = 0
    sink_rate_eps: tuple[float, ...] = SINK_RATE_EPSILONS
    dormant_entropy_max: float = 0.3
    dormant_anchor_min: float = 0.5
    massive_abs: float = 100.0
    massive_ratio: float = 1000.0
    batch_size: int = 32
    with_values: bool = True
    with_residual: bool = True
    layers: tuple[int, ...] | None = None
    with_key_geometry: bool = False
    with_secondary_sinks: bool = False
    secondary_min_mass: float = SECONDARY_MIN_MASS
    random_key_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", layer_selection(self.layers))
        for name in ("with_key_geometry", "with_secondary_sinks"):  # "yes" is truthy, and no switch
            check_argument(getattr(self, name), bool, name, "True or False")
        if not 0.0 <= self.sink_eps < 1.0:
            raise InputError(f"sink_eps must lie in [0, 1), got {self.sink_eps}", field="sink_eps")
        if self.alpha_k < 0:
            raise InputError(f"alpha_k must be >= 0, got {self.alpha_k}", field="alpha_k")
        if self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}", field="batch_size")
        if not self.sink_rate_eps:
            raise InputError("sink_rate_eps must name at least one eps, e.g. (0.3, 0.8)", field="sink_rate_eps")

    def check_layers(self, n_layers: int, model: str = "the model") -> None:
        """An ``InputError`` naming the model's layer count when ``layers`` are not all its."""
        check_layers(self.layers, n_layers, model)

    def probed_layers(self, n_layers: int, no_pattern: Collection[int] = ()) -> tuple[int, ...]:
        """The layers probed in an ``n_layers``-layer model whose layers ``no_pattern`` have no
        attention pattern, ascending."""
        return probed_layers(self.layers, n_layers, no_pattern)


@dataclass
class ProbeBatch:
    """One batch of user inputs. inputs: toy tokens ``[batch, pos, d_model]``, token ids
    ``[batch, pos]`` or strings; attention_mask / query_mask: ``[batch, pos]`` bool."""

    inputs: torch.Tensor | Sequence[str]
    attention_mask: torch.Tensor | None = None
    query_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class HeadProbe:
    """One (layer, head) row of the tidy table, the one per-head table of toy models and
    pretrained models alike; NaN where nothing was measured.

    anchor_mass / anchor_mass_other: mean attention on the anchor over the selected /
    the other real queries after it (for the toy task: non-trigger / trigger queries);
    row_mass: mean total weight of the selected queries' rows (1 under softmax; under
    ReLU-family kinds, whether the head attends at all there); null_mass: mean of
    1 - row sum over the same queries, the mass that goes to no token (a learned sink
    logit, a bias slot, off-by-one softmax, softpick; NaN for kinds without a null);
    gate_default / gate_trigger: the mean gate value at the selected / the other queries
    (gated kinds and a doubled q_proj's gate, Qwen3-Next; NaN otherwise); gated_anchor_norm:
    mean of A[i, a] ||g_i * v_a|| over the queries anchor_mass counts, the anchor's term in
    the head's output after its elementwise query gate g_i (Qwen3-Next; NaN otherwise);
    default_source: where the head's default state lives (``default_source``); sink_class
    (sink heads only): no-op, broadcast or other, from anchor_projected_value_norm_ratio and
    update_stable_rank (NaN for the other heads); random_key_mass: anchor_mass's statistic at
    a random key; above_random_key_p99: anchor_mass > ``ProbeResult.random_key_p99`` (None:
    not measured); docs/metrics.md defines every metric."""

    # learned_sink_mass was this name until the null was measured for every kind that has one
    RENAMED: ClassVar[dict[str, str]] = {"learned_sink_mass": "null_mass"}

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "layer": COUNT,
        "head": COUNT,
        "anchor_mass": NONNEGATIVE,
        "anchor_mass_other": NONNEGATIVE,
        "alpha": NONNEGATIVE,
        "value_weighted_anchor_share": FRACTION,
        "anchor_value_norm": NONNEGATIVE,
        "row_entropy": FRACTION,
        "head_out_norm": NONNEGATIVE,
        "row_mass": NONNEGATIVE,
        "null_mass": FRACTION,
        "gate_default": FRACTION,
        "gate_trigger": FRACTION,
        "gated_anchor_norm": NONNEGATIVE,
        "anchor_mass_all_queries": NONNEGATIVE,
        "alpha_all_queries": NONNEGATIVE,
        **dict.fromkeys(("anchor_key_cos", "other_key_cos", "anchor_key_cos_rotated", "other_key_cos_rotated"), COSINE),
        "anchor_key_norm_ratio": NONNEGATIVE,
        "anchor_value_norm_ratio": NONNEGATIVE,
        "anchor_projected_value_norm_ratio": NONNEGATIVE,
        "update_stable_rank": NONNEGATIVE,
        "random_key_mass": NONNEGATIVE,
    }

    layer: int
    head: int
    anchor_mass: float
    anchor_mass_other: float
    alpha: float
    is_sink_head: bool
    value_weighted_anchor_share: float
    anchor_value_norm: float
    row_entropy: float
    dormant: bool
    head_out_norm: float
    row_mass: float = math.nan
    null_mass: float = math.nan
    anchor_mass_all_queries: float = math.nan
    alpha_all_queries: float = math.nan
    # key geometry (sinkscope.probes.key_geometry; NaN unless measured)
    anchor_key_cos: float = math.nan
    other_key_cos: float = math.nan
    anchor_key_cos_rotated: float = math.nan
    other_key_cos_rotated: float = math.nan
    anchor_key_norm_ratio: float = math.nan
    anchor_value_norm_ratio: float = math.nan
    # the mitigation kinds (docs/metrics.md, "Where the default state lives")
    gate_default: float = math.nan
    gate_trigger: float = math.nan
    gated_anchor_norm: float = math.nan
    default_source: str | None = None
    # sink-head classes and the random-key null (sinkscope.probes.head_classes)
    sink_class: str | None = None
    anchor_projected_value_norm_ratio: float = math.nan
    update_stable_rank: float = math.nan
    random_key_mass: float = math.nan
    above_random_key_p99: bool | None = None


@dataclass(frozen=True)
class LayerProbe:
    """One layer. Norms are means over selected queries: ``attn_out_norm`` is
    ||sum_h z_h W_O[h] + b_O||, ``head_out_norm_sum`` is sum_h ||z_h W_O[h]|| (a large gap
    means heads cancel); residual statistics are on ``hook_resid_post``:
    ``median_abs_resid`` is the mean over prompts of each prompt's median |x| (its real
    tokens, all of d_model), and an entry is massive when |x| > ``massive_abs`` and >
    ``massive_ratio`` x its prompt's median."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "layer": COUNT,
        "anchor_mass": NONNEGATIVE,
        "n_sink_heads": COUNT,
        "attn_out_norm": NONNEGATIVE,
        "head_out_norm_sum": NONNEGATIVE,
        "anchor_resid_norm": NONNEGATIVE,
        "massive_count": COUNT,
        "massive_at_anchor": COUNT,
        "max_abs_resid": NONNEGATIVE,
        "median_abs_resid": NONNEGATIVE,
        "anchor_hidden_share": FRACTION,
        "anchor_mass_all_queries": NONNEGATIVE,
    }

    layer: int
    anchor_mass: float
    n_sink_heads: int
    attn_out_norm: float
    head_out_norm_sum: float
    anchor_resid_norm: float
    massive_count: int
    massive_at_anchor: int
    max_abs_resid: float
    median_abs_resid: float
    anchor_hidden_share: float = 0.0
    anchor_mass_all_queries: float = math.nan


@dataclass(frozen=True)
class SinkRate:
    """Gu et al.'s Sink_k^eps in percent of (sample, layer, head) entries."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "k": COUNT,
        "eps": FRACTION,
        "percent": PERCENT,
        "percent_all_queries": PERCENT,
    }

    k: int
    eps: float
    percent: float
    percent_all_queries: float = math.nan

    def __repr__(self) -> str:
        # k is the 0-indexed key position; the papers write Sink_{k+1}. A NaN field (no
        # narrowed query selection) is left out rather than shown as nan.
        over_all = (
            "" if math.isnan(self.percent_all_queries) else f", percent_all_queries={self.percent_all_queries:.4g}"
        )
        return f"SinkRate(Sink_{self.k + 1}: k={self.k}, eps={self.eps:g}, percent={self.percent:.4g}{over_all})"


@dataclass(frozen=True)
class ProbeResult:
    """All probe measurements. ``attn_out_norm_of_sum`` vs ``attn_out_sum_of_norms``:
    mean over selected queries of ||sum_l attn_out_l|| and sum_l ||attn_out_l||; the
    first far below the second means the layers cancel each other. Persisted as
    ``probe.json`` (``sinkscope.infra.codec``)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_inputs": COUNT,
        "n_queries": COUNT,
        "attn_out_norm_of_sum": NONNEGATIVE,
        "attn_out_sum_of_norms": NONNEGATIVE,
        "random_key_p99": NONNEGATIVE,
    }

    SCHEMA: ClassVar[str] = "probe"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: ModelSpec.attention, LayerProbe.n_sink_heads
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_probe_v1}

    model: ModelSpec
    config: ProbeConfig
    n_inputs: int
    n_queries: int
    heads: tuple[HeadProbe, ...]
    layers: tuple[LayerProbe, ...]
    sink_rates: tuple[SinkRate, ...]
    attn_out_norm_of_sum: float
    attn_out_sum_of_norms: float
    notes: tuple[str, ...] = field(default=())
    secondary_sinks: SecondarySinks | None = None
    random_key_p99: float = math.nan  # the random-key null's threshold (docs/metrics.md)

    def inconsistencies(self) -> Iterator[Problem]:
        """Rows that do not fit the model: every (layer, head) of the probed layers once, one
        row per probed layer, counts within their totals; under softmax (rows sum to one),
        attention masses of at most 1."""
        n_layers, n_heads = self.model.n_layers, self.model.n_heads
        yield from index_problems(
            [
                (f"config.layers[{index}]", layer, n_layers, "n_layers")
                for index, layer in enumerate(self.config.layers or ())
            ]
        )
        probed = self.config.probed_layers(n_layers, [row.layer for row in self.model.no_pattern_layers])
        grid = probed if self.model.no_pattern_layers else self.config.layers
        yield from head_grid_problems(self.heads, n_layers, n_heads, layers=grid)
        if tuple(layer.layer for layer in self.layers) != probed:
            yield "layers", f"{len(self.layers)} rows", f"one row per layer, in order (layers {layers_text(probed)})"
        for index, layer in enumerate(self.layers):
            where = f"layers[{index}]"
            yield from index_problems([(f"{where}.layer", layer.layer, n_layers, "n_layers")])
            yield from at_most(f"{where}.n_sink_heads", layer.n_sink_heads, n_heads, "n_heads")
            yield from at_most(
                f"{where}.massive_at_anchor", layer.massive_at_anchor, layer.massive_count, "massive_count"
            )
        threshold = 1.0 - self.config.sink_eps
        for index, row in enumerate(self.heads):
            # a head is a sink head exactly when its anchor mass reaches the threshold (up to
            # the float32 rounding of the mass it was decided on)
            in_range = 0.0 <= row.anchor_mass <= 1.0 + 1e-6  # a mass out of range is named as such below
            if in_range and abs(row.anchor_mass - threshold) > 1e-6:
                if row.is_sink_head != (row.anchor_mass >= threshold):
                    expected = (
                        f"{not row.is_sink_head} for anchor mass {row.anchor_mass:.3g} (sink heads: >= {threshold:g})"
                    )
                    yield f"heads[{index}].is_sink_head", str(row.is_sink_head), expected
            if row.sink_class is not None and (not row.is_sink_head or row.sink_class not in HEAD_CLASSES):
                yield f"heads[{index}].sink_class", row.sink_class, f"None or one of {HEAD_CLASSES} for a sink head"
        if self.model.attention in NORMALISED_KINDS:
            for index, row in enumerate(self.heads):
                for name in ("anchor_mass", "anchor_mass_other", "alpha", "row_mass"):
                    yield from outside(getattr(row, name), FRACTION, f"heads[{index}].{name}")
            for index, layer in enumerate(self.layers):
                yield from outside(layer.anchor_mass, FRACTION, f"layers[{index}].anchor_mass")

    def anchor_mass_matrix(self) -> torch.Tensor:
        """``[layer, head]`` anchor mass."""
        return self.matrix("anchor_mass")

    def matrix(self, name: str) -> torch.Tensor:
        """``[layer, head]`` matrix of one ``HeadProbe`` field, e.g. ``"alpha"``."""
        if name not in {f.name for f in fields(HeadProbe)} - {"layer", "head"}:
            raise InputError(f"unknown head metric {name!r}; choose a HeadProbe field such as 'anchor_mass'")
        matrix = torch.full((self.model.n_layers, self.model.n_heads), float("nan"), dtype=torch.float64)
        for row in self.heads:
            matrix[row.layer, row.head] = float(getattr(row, name))
        return matrix

    def sink_heads(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of every sink head (the form interventions take)."""
        return [(row.layer, row.head) for row in self.heads if row.is_sink_head]

    def head_table(self) -> list[dict[str, Any]]:
        """One dict per (layer, head)."""
        return [asdict(row) for row in self.heads]

    def layer_table(self) -> list[dict[str, Any]]:
        return [asdict(row) for row in self.layers]

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (layer, head), every ``HeadProbe`` metric measured a column (the
        columns of ``heads.csv``)."""
        return without_unmeasured(dataframe(row_of(row) for row in self.heads))

    def heads_csv(self, model: str = "", revision: str | None = None) -> str:
        """``heads.csv``: one line per (layer, head) probed, led by the ``model`` and its
        ``revision`` (empty for local files), then every ``HeadProbe`` field at full
        precision, less a metric measured nowhere (``anchor_mass_other`` without a split
        of the queries, as in audits)."""
        metrics = records_table("", self.heads, HeadProbe).without_empty_columns()
        columns = (Column("model"), Column("revision"), *metrics.columns)
        rows = tuple((model, revision or "", *row) for row in metrics.rows)
        return table_csv(Table("", columns, rows))

    def write_heads_csv(self, path: str, model: str = "", revision: str | None = None) -> None:
        atomic_write_text(path, self.heads_csv(model, revision))

    def _repr_html_(self) -> str:
        """Inline display in a notebook: key numbers, the sink map, the per-head table."""
        from sinkscope.probes.display import probe_html  # the display imports this module's types for typing only

        return probe_html(self)
