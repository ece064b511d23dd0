"""Key geometry of a probe or audit, sink heads apart from the others: ``key_geometry(result)``
returns a ``KeyGeometry`` (per-head rows, a summary with intervals over heads,
``to_dataframe()``, inline display). The numbers are ``HeadProbe`` fields, measured by
``sinkscope.probes.key_geometry`` in the probe's own pass; the tables are defined here
once for every medium."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sinkscope.infra.errors import InputError
from sinkscope.infra.intervals import MIN_INTERVAL_UNITS, interval_possible
from sinkscope.probes.mechanism_distance import Spread, spread
from sinkscope.reports.document import Column, TableDefinition
from sinkscope.reports.frames import dataframe
from sinkscope.reports.scatter import ScatterPanel, marked_scatter

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

    from sinkscope.probes.probe import HeadProbe, ProbeResult

# (HeadProbe field, what a reader calls it)
GEOMETRY_FIELDS: tuple[tuple[str, str], ...] = (
    ("anchor_key_cos", "cos(q, k_anchor)"),
    ("other_key_cos", "cos(q, k_other)"),
    ("anchor_key_cos_rotated", "cos(q, k_anchor) after RoPE"),
    ("other_key_cos_rotated", "cos(q, k_other) after RoPE"),
    ("anchor_key_norm_ratio", "\u2016k_anchor\u2016 / median \u2016k\u2016"),
    ("anchor_value_norm_ratio", "\u2016v_anchor\u2016 / median \u2016v\u2016"),
)
GEOMETRY_NOTE = (
    "cos(q, k_anchor): mean over every query that sees the anchor (all prompts pooled) of the cosine between "
    "the head's query and the anchor's key; cos(q, k_other): the same query's mean cosine with the other real "
    "keys it sees; 'after RoPE': on the rotated queries and keys, where the model hooks them (Llama, Mistral, "
    "Qwen, Gemma, OLMo families; GPT-NeoX/Pythia rotates inside its attention without such hooks, so its cosines "
    "are before RoPE only); norm "
    "ratios: per prompt, the anchor's norm over the median of the prompt's other real tokens, then averaged over "
    "prompts (a rotation keeps norms, so one ratio serves both). GQA: each query head reads its kv head."
)


@dataclass(frozen=True)
class GeometrySummary:
    """One metric's mean over one group of heads (sink heads, or the others), with its interval."""

    metric: str
    group: str
    spread: Spread


def summary_rows(heads: tuple[HeadProbe, ...]) -> list[GeometrySummary]:
    """Two rows (sink heads, other heads) per geometry metric measured in some head (the
    rotated ones for rotary models only)."""
    rows = []
    for name, label in GEOMETRY_FIELDS:
        values = [(head.is_sink_head, float(getattr(head, name))) for head in heads]
        if all(math.isnan(value) for _, value in values):
            continue
        for group, wanted in (("sink heads", True), ("other heads", False)):
            rows.append(GeometrySummary(label, group, spread([v for s, v in values if s == wanted], "head")))
    return rows


def _summary_cells(row: GeometrySummary) -> tuple[Any, ...]:
    spread_ = row.spread
    interval = interval_possible(spread_.n) and not math.isnan(spread_.low)
    return (
        row.metric,
        row.group,
        spread_.mean,
        spread_.low if interval else None,
        spread_.high if interval else None,
        spread_.n,
    )


GEOMETRY_SUMMARY_TABLE: TableDefinition[GeometrySummary] = TableDefinition(
    "Key geometry: sink heads against the others",
    (
        Column("metric"),
        Column("heads"),
        Column("mean", ".3f", numeric=True),  # cosines and norm ratios: three decimals, trailing zeros kept
        Column("95% CI low", ".3f", numeric=True),
        Column("95% CI high", ".3f", numeric=True),
        Column("n heads", numeric=True),
    ),
    _summary_cells,
    "Means over heads, each head's value a mean as in the per-head table; intervals: percentile bootstrap over "
    f"heads (none from fewer than {MIN_INTERVAL_UNITS} heads). " + GEOMETRY_NOTE,
    marked=lambda row: row.group == "sink heads",
    marked_label="sink heads",
)


@dataclass(frozen=True)
class KeyGeometry:
    """The key geometry of every probed head; ``summary`` sets sink heads apart."""

    heads: tuple[HeadProbe, ...]

    @property
    def summary(self) -> list[GeometrySummary]:
        return summary_rows(self.heads)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (layer, head): is_sink_head, anchor_mass and each geometry metric measured."""
        names = [name for name, _ in GEOMETRY_FIELDS]
        frame = dataframe(
            {"layer": h.layer, "head": h.head, "is_sink_head": h.is_sink_head, "anchor_mass": h.anchor_mass}
            | {name: getattr(h, name) for name in names}
            for h in self.heads
        )
        return frame.dropna(axis=1, how="all")

    def _repr_html_(self) -> str:
        from sinkscope.reports.html import fragment, inline_table

        n_sinks = sum(head.is_sink_head for head in self.heads)
        subtitle = f"{len(self.heads)} heads, {n_sinks} sink heads"
        return fragment("Key geometry", subtitle, [inline_table(GEOMETRY_SUMMARY_TABLE.table(self.summary))])


def key_geometry(result: Any) -> KeyGeometry:
    """The ``KeyGeometry`` of a ``ProbeResult`` or of any result holding one as ``.probe``
    (an ``AuditResult``); an ``InputError`` when the probe did not measure it."""
    probe: ProbeResult = getattr(result, "probe", result)
    heads = getattr(probe, "heads", None)
    if not heads or all(math.isnan(head.anchor_key_norm_ratio) for head in heads):
        raise InputError(
            "this result has no key geometry; probe with ProbeConfig(with_key_geometry=True) "
            "or audit with AuditConfig(key_geometry=True)"
        )
    return KeyGeometry(tuple(heads))


def _cosine_panel(heads: tuple[HeadProbe, ...], rotated: bool, rotates: bool) -> ScatterPanel:
    """``rotates``: whether the model has a rotary stage at all (no "before RoPE" on a model without one)."""
    suffix, stage = ("_rotated", ", after RoPE") if rotated else ("", ", before RoPE" if rotates else "")
    return ScatterPanel(
        f"query-key cosine{stage}",
        "mean cos(q, k_other)",
        "mean cos(q, k_anchor)",
        [head.other_key_cos if not rotated else head.other_key_cos_rotated for head in heads],
        [getattr(head, "anchor_key_cos" + suffix) for head in heads],
        [head.is_sink_head for head in heads],
        diagonal=True,
    )


def draw_key_geometry(heads: tuple[HeadProbe, ...], path: str | os.PathLike, title: str) -> Figure:
    """The one key-geometry figure: per head, the queries' cosine with the anchor's key against
    their cosine with the other keys (before RoPE, and after it for rotary models), and the
    anchor's key and value norm ratios (query heads that share a kv head share these, so
    their points coincide); sink heads in red."""
    rotates = any(not math.isnan(head.anchor_key_cos_rotated) for head in heads)
    panels = [_cosine_panel(heads, False, rotates), *([_cosine_panel(heads, True, rotates)] if rotates else [])]
    panels.append(
        ScatterPanel(
            "anchor norms over the median token (per kv head)",
            "\u2016k_anchor\u2016 / median \u2016k\u2016",
            "\u2016v_anchor\u2016 / median \u2016v\u2016",
            [head.anchor_key_norm_ratio for head in heads],
            [head.anchor_value_norm_ratio for head in heads],
            [head.is_sink_head for head in heads],
            log=True,
            reference=1.0,
        )
    )
    return marked_scatter(panels, path, title, ("sink heads", "other heads"))
