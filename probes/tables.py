"""The probes' tables and sink map, each defined once (columns, labels, formats, order, caption, note)
for every medium: the report page and its Markdown, the inline notebook display, CSV and
the terminal. Per head, per layer, the default-state test, activation patching, and the
side-by-side comparison of toy and pretrained sink heads and models."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.infra.intervals import interval_possible
from sinkscope.reports.document import Column, HeadMaps, TableDefinition

if TYPE_CHECKING:
    from sinkscope.probes.default_state import DefaultStateRow
    from sinkscope.probes.mechanism import MechanismHead, MechanismModel
    from sinkscope.probes.patching import PatchingRow
    from sinkscope.probes.probe import HeadProbe, ProbeResult

LAYER = Column("layer", numeric=True)
HEAD = Column("head", numeric=True)
ANCHOR_MASS = Column("anchor_mass", ".4f", numeric=True)
VALUE_SHARE = Column("value_weighted_anchor_share", ".3f", numeric=True)
ANCHOR_VALUE_NORM = Column("anchor_value_norm", ".3g", numeric=True)
HEAD_OUT_NORM = Column("head_out_norm", ".3g", numeric=True)
DORMANT = Column("dormant")
CANCELLATION = Column("cancellation", ".3f", numeric=True)

# key geometry (sinkscope.probes.key_geometry): the HeadProbe fields, as the per-head table shows them
GEOMETRY_COLUMN_FIELDS = (
    "anchor_key_cos",
    "other_key_cos",
    "anchor_key_cos_rotated",
    "other_key_cos_rotated",
    "anchor_key_norm_ratio",
    "anchor_value_norm_ratio",
)
GEOMETRY_COLUMNS = tuple(
    Column(name, ".3f" if "cos" in name else ".3g", numeric=True) for name in GEOMETRY_COLUMN_FIELDS
)

# sink-head classes and the random-key null (sinkscope.probes.head_classes), as the per-head table shows them
HEAD_CLASS_COLUMNS = (
    Column("sink_class"),
    Column("anchor_projected_value_norm_ratio", ".3g", numeric=True),
    Column("update_stable_rank", ".3g", numeric=True),
    Column("random_key_mass", ".4f", numeric=True),
    Column("above_random_key_p99"),
)
HEAD_CLASS_NOTE = (
    "sink_class (sink heads only): no-op when anchor_projected_value_norm_ratio (||v_a W_O|| over the median of "
    "the prompt's other tokens') < 0.2, else broadcast when update_stable_rank (||M||_F^2 / ||M||_2^2 of the "
    "head's outputs z W_O at the selected queries) < 1.5, else other; random_key_mass: the anchor mass's "
    "statistic at one random real key per prompt; above_random_key_p99: anchor_mass above the 99th percentile "
    "of the random-key mass over every (head, prompt)."
)

HEAD_TABLE: TableDefinition[HeadProbe] = TableDefinition(
    "Per head",
    (
        LAYER,
        HEAD,
        ANCHOR_MASS,
        Column("null_mass", ".4f", numeric=True),
        Column("gate_default", ".3f", numeric=True),
        Column("gate_trigger", ".3f", numeric=True),
        Column("gated_anchor_norm", ".3g", numeric=True),
        Column("anchor_mass_all_queries", ".4f", numeric=True),
        Column("anchor_mass_other", ".4f", numeric=True),
        Column("alpha", ".3f", numeric=True),
        Column("alpha_all_queries", ".3f", numeric=True),
        Column("sink head"),
        Column("default_source"),
        *HEAD_CLASS_COLUMNS,
        VALUE_SHARE,
        ANCHOR_VALUE_NORM,
        Column("row_entropy", ".3f", numeric=True),
        Column("row_mass", ".4f", numeric=True),
        DORMANT,
        HEAD_OUT_NORM,
        *GEOMETRY_COLUMNS,
    ),
    lambda h: (
        h.layer,
        h.head,
        h.anchor_mass,
        h.null_mass,
        h.gate_default,
        h.gate_trigger,
        h.gated_anchor_norm,
        h.anchor_mass_all_queries,
        h.anchor_mass_other,
        h.alpha,
        h.alpha_all_queries,
        h.is_sink_head,
        h.default_source,
        h.sink_class,
        h.anchor_projected_value_norm_ratio,
        h.update_stable_rank,
        h.random_key_mass,
        h.above_random_key_p99,
        h.value_weighted_anchor_share,
        h.anchor_value_norm,
        h.row_entropy,
        h.row_mass,
        h.dormant,
        h.head_out_norm,
        *(getattr(h, name) for name in GEOMETRY_COLUMN_FIELDS),
    ),
    "anchor_mass: mean attention on the anchor over the selected queries that can see it; null_mass: "
    "mean of 1 - row sum over the same queries, the mass that goes to no token (a learned sink logit, a bias "
    "slot, softmax1, softpick); gate_default / gate_trigger: the mean gate at the selected / the other queries; "
    "gated_anchor_norm: mean of A[i, a] ||g_i * v_a||, the anchor's term in the head's output after its "
    "elementwise query gate (Qwen3-Next); "
    "default_source: where the head's default state lives (gate, anchor, null, anchor and null, quiet rows or "
    "none; docs/metrics.md); anchor_mass_other: "
    "over the other queries; alpha: Gu et al.'s alpha_0 (mean over the queries that see the anchor); "
    "*_all_queries: the same over every query, zeros of those a sliding window or chunk hides the anchor from "
    "included (shown for layers where some query cannot see it); value_weighted_anchor_share: share "
    "of the head's output norm coming from the anchor; row_entropy: normalised by log(#visible keys); "
    "row_mass: total weight of the selected queries' rows (1 under softmax); dormant: low entropy with mass "
    "on the anchor; anchor_key_cos / other_key_cos (*_rotated: after RoPE): mean cosine of the head's queries "
    "with the anchor's key / with the other keys they see; *_norm_ratio: the anchor's key or value norm over "
    "the median of the prompt's other tokens. "
    + HEAD_CLASS_NOTE
    + " A metric measured for no head is left out. Sink heads come first, largest anchor mass "
    "first; then the other heads, also largest anchor mass first, any without a measured anchor mass last.",
    order=lambda h: (
        not h.is_sink_head,
        math.isnan(h.anchor_mass),
        -h.anchor_mass if not math.isnan(h.anchor_mass) else 0.0,
        h.layer,
        h.head,
    ),
    marked=lambda h: h.is_sink_head,
    marked_label="sink heads",
    frozen=3,  # layer, head and anchor mass stay in view beside every other metric
)


def default_state_definition(
    what: str, n_inputs: int | None = None, level: str = "95%"
) -> TableDefinition[DefaultStateRow]:
    """The default-state test: ``what`` (e.g. "next-token loss") before and after each
    removal, beside its matched control, one row per tested head set. With ``n_inputs``
    too few for an interval (sinkscope.infra.intervals) its cells stay empty and the note says so."""
    bounds = n_inputs is None or interval_possible(n_inputs)

    def interval(low: float, high: float) -> tuple[float, float]:
        return (low, high) if bounds else (math.nan, math.nan)

    return TableDefinition(
        "Per sink head and for all sink heads together",
        (
            Column("heads"),
            Column(f"{what} before", ".3g", numeric=True),
            Column("after sink removal", ".3g", numeric=True),
            Column("after control", ".3g", numeric=True),
            *[
                Column(f"{change}: {estimate}", ".3g", numeric=True)
                for change in ("remove", "control")
                for estimate in ("increase", f"{level} CI low", f"{level} CI high")
            ],
            Column("Cohen's d", ".2f", numeric=True),
        ),
        lambda row: (
            row.label,
            row.error_before,
            row.error_after_remove,
            row.error_after_control,
            row.remove_increase.mean,
            *interval(row.remove_increase.ci_low, row.remove_increase.ci_high),
            row.control_increase.mean,
            *interval(row.control_increase.ci_low, row.control_increase.ci_high),
            row.cohens_d,
        ),
        "Sink removal (remove_sink) zeroes each head's attention to the anchor and renormalises the row; the "
        "matched control masks one random visible non-anchor key per query instead. Intervals are bootstrap "
        "intervals over inputs"
        + ("" if bounds else f" (n = {n_inputs}, no interval)")
        + "; Cohen's d is of the paired difference (removal increase minus control increase).",
    )


# Gu et al.'s sink rate Sink_1^eps as every medium shows it: a subscript digit and the
# threshold in parentheses render as text in HTML, Markdown, a terminal and a figure alike
SINK_RATE_NAME = "Sink\u2081(\u03b5)"

# Reports count a position from 1 (position 1 is BOS), as the paper's figures and the toy
# task's settings in reports do; layers and heads from 0, as in head names (L0H1)
POSITION_COLUMN = "position (1 = BOS)"


def shown_position(position: int) -> int:
    """A 0-indexed position as reports show it: counted from 1, BOS at 1."""
    return position + 1


def patch_site(row: PatchingRow) -> str:
    """e.g. ``L1H0``, ``L0 pos 8`` (layer and head from 0, position from 1)."""
    head = "" if row.head is None else f"H{row.head}"
    return f"L{row.layer}{head}" + ("" if row.position is None else f" pos {shown_position(row.position)}")


def _strength(row: PatchingRow) -> float:
    """Largest normalised effect first; sites without one last."""
    return math.inf if math.isnan(row.normalised_effect) else -abs(row.normalised_effect)


def _axis_value(row: PatchingRow, axis: str) -> int | None:
    if axis == "position":
        return None if row.position is None else shown_position(row.position)
    return {"layer": row.layer, "head": row.head}[axis]


def patching_definition(per: Sequence[str]) -> TableDefinition[PatchingRow]:
    """One row per patched site (a column for each axis ``per`` iterates), the largest
    normalised effect first."""
    axes = [Column(POSITION_COLUMN if axis == "position" else axis, numeric=True) for axis in per]
    return TableDefinition(
        "Patched sites",
        (
            Column("site"),
            *axes,
            Column("patched", ".4g", numeric=True),
            Column("effect", ".4g", numeric=True),
            Column("effect 95% CI low", ".4g", numeric=True),
            Column("effect 95% CI high", ".4g", numeric=True),
            Column("normalised_effect", ".3f", numeric=True),
            Column("normalised 95% CI low", ".3f", numeric=True),
            Column("normalised 95% CI high", ".3f", numeric=True),
        ),
        lambda row: (
            patch_site(row),
            *[_axis_value(row, axis) for axis in per],
            row.patched,
            row.effect,
            row.effect_ci_low,
            row.effect_ci_high,
            row.normalised_effect,
            row.normalised_effect_ci_low,
            row.normalised_effect_ci_high,
        ),
        "effect: the patched metric minus the target's; normalised_effect: effect / (source - target): 1 means "
        "the site alone carries the whole difference, 0 none of it. Intervals: 95% percentile bootstrap over "
        "input pairs, resampled together for every site (empty: none, from fewer than two pairs, a metric "
        "returning batch means, a normalised effect whose denominator vanishes in some draw, or a file written "
        "before intervals were stored).",
        order=_strength,
    )


# toy and pretrained side by side -------------------------------------------------------

MECHANISM_HEAD_TABLE: TableDefinition[tuple[MechanismHead, MechanismModel]] = TableDefinition(
    "Sink heads, toy and pretrained",
    (
        Column("source"),
        Column("kind"),
        Column("model"),
        LAYER,
        HEAD,
        ANCHOR_MASS,
        VALUE_SHARE,
        ANCHOR_VALUE_NORM,
        HEAD_OUT_NORM,
        DORMANT,
        Column("layer attn_out_norm", ".3g", numeric=True),
        Column("layer head_out_norm_sum", ".3g", numeric=True),
        Column("model attn_out_norm_of_sum", ".3g", numeric=True),
        Column("model attn_out_sum_of_norms", ".3g", numeric=True),
        CANCELLATION,
    ),
    lambda pair: (
        pair[0].source,
        pair[0].kind,
        pair[1].model,
        pair[0].layer,
        pair[0].head,
        pair[0].anchor_mass,
        pair[0].value_weighted_anchor_share,
        pair[0].anchor_value_norm,
        pair[0].head_out_norm,
        pair[0].dormant,
        pair[0].layer_attn_out_norm,
        pair[0].layer_head_out_norm_sum,
        pair[1].attn_out_norm_of_sum,
        pair[1].attn_out_sum_of_norms,
        pair[1].cancellation,
    ),
    "One row per sink head. value_weighted_anchor_share: ||A[i,a] v_a W_O|| / sum_j ||A[i,j] v_j W_O||; "
    "anchor_value_norm: ||v_a|| of the head's value (before W_O); layer attn_out_norm vs layer "
    "head_out_norm_sum: the head's layer (far apart: its heads cancel); model attn_out_norm_of_sum vs "
    "attn_out_sum_of_norms: all layers (cancellation = their ratio; far below 1: the layers cancel). "
    "Means over the probe's selected queries (toy: non-trigger positions).",
)

MECHANISM_MODEL_TABLE: TableDefinition[MechanismModel] = TableDefinition(
    "Models compared",
    (
        Column("source"),
        Column("kind"),
        Column("model"),
        Column("attention"),
        Column("layers", numeric=True),
        Column("heads", numeric=True),
        Column("inputs", numeric=True),
        Column("sink heads", numeric=True),
        Column("dormant sink heads", numeric=True),
        Column("mean value_weighted_anchor_share", ".3f", numeric=True),
        Column("mean anchor_value_norm", ".3g", numeric=True),
        Column("attn_out_norm_of_sum", ".3g", numeric=True),
        Column("attn_out_sum_of_norms", ".3g", numeric=True),
        CANCELLATION,
        Column("writes the anchor's value"),
        Column("layers cancel"),
        Column("probe"),
        Column("directory"),
    ),
    lambda m: (
        m.source,
        m.kind,
        m.model,
        m.attention,
        m.n_layers,
        m.n_heads,
        m.n_inputs,
        m.n_sink_heads,
        m.n_dormant_sink_heads,
        m.sink_value_weighted_anchor_share,
        m.sink_anchor_value_norm,
        m.attn_out_norm_of_sum,
        m.attn_out_sum_of_norms,
        m.cancellation,
        m.writes_anchor,
        m.layers_cancel,
        m.origin,
        m.directory,
    ),
    "Means over each model's sink heads; models without sink heads are listed here only.",
)


# figures ------------------------------------------------------------------------------


def anchor_mass_map(probe: ProbeResult, title: str, colorbar_label: str = "anchor mass") -> HeadMaps:
    """The sink map: a probe's anchor mass per (layer, head), sink heads outlined; the
    report's PNG and the notebook's grid both draw it. A model with a null (learned sink
    logits as gpt-oss's, a bias slot, softmax1, softpick) gets a second panel on the same
    scale: each head's null mass."""
    sink_heads = frozenset(probe.sink_heads())
    anchor = tuple(tuple(row) for row in probe.anchor_mass_matrix().tolist())
    null = probe.matrix("null_mass")
    panels: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = (("", anchor),)
    if bool((~null.isnan()).any()):
        title = f"{title}, beside the null mass (1 \u2212 row sum, same queries: the mass on no token)"
        panels = (("anchor mass", anchor), ("null mass", tuple(tuple(row) for row in null.tolist())))
        colorbar_label = "attention mass"
    return HeadMaps(
        title,
        colorbar_label,
        panels,
        (sink_heads,) * len(panels),
        f"sink heads, anchor mass \u2265 {1.0 - probe.config.sink_eps:g}",
    )
