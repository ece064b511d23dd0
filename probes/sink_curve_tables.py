"""The sink experiments' tables, figures and findings, each defined once for every medium
(report page, Markdown, terminal, notebook): the input-type table in Gu et al.'s Table 1
layout (input types side by side), the sink rate against eps and against T."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sinkscope.infra.intervals import interval_possible
from sinkscope.probes.sink_curves import EpsPoint, LengthPoint, SampleMean, SinkCurves
from sinkscope.reports.curves import CurveSeries, interval_curves
from sinkscope.reports.document import Block, Cell, Column, Figure, Paragraph, Section, Table, TableDefinition
from sinkscope.reports.formatting import interval_text, plural
from sinkscope.reports.html import bullets_html, fragment, inline_table

EPS_FIGURE = "sink_rate_eps.png"
ONE = "a point without a bar rests on one prompt (n per point in the table)"
LENGTH_FIGURE = "sink_rate_length.png"
AVERAGED = (
    "per prompt: a prompt's sink rate is the percent of its (layer, head) pairs with alpha > ε, its anchor mass "
    "the mean over its (layer, head) pairs of the mean attention on the anchor over its queries; then the mean "
    "over prompts, with a 95% percentile-bootstrap interval over prompts"
)


def sink_rate_name(curves: SinkCurves) -> str:
    """Gu et al.'s sink rate at the table's eps, written as the audit writes it: Sink₁(ε = 0.3)
    (they count the first token as 1)."""
    subscript = str(curves.k + 1).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))
    return f"Sink{subscript}(ε = {curves.eps:g})"


def estimate_cell(value: SampleMean, digits: int = 1, unit: str = "") -> str:
    """``"77.0% [95% CI 70.3 to 80.1, n = 64]"``; ``"n = 1, no interval"`` from one prompt."""
    if value.n == 0:
        return "not measured"
    return f"{value.mean:.{digits}f}{unit} [{interval_text(value.ci_low, value.ci_high, value.n, 3)}]"


# how each input protocol (``SinkCurves.input_protocol``) builds the input types, in words
PROTOCOL_WORDS = {
    "sinkscope": "input protocol sinkscope: every input type has the prompts' own lengths, seed and anchor (a BOS "
    "the convention puts first stays; only the tokens after it change)",
    "gu": "input protocol gu (Gu et al.'s): 64 tokens per input, no BOS prepended (only a BOS the tokenizer adds "
    "itself stays first), the prompts cut into 64-token windows",
    "given": "input protocol given: the inputs as passed, each type on the same masks",
}


def _sentence(text: str) -> str:
    """``text`` with its first letter capitalised, the rest as written (BOS stays BOS)."""
    return text[:1].upper() + text[1:]


def protocol_words(curves: SinkCurves) -> str:
    """How ``curves``' inputs were built, in words."""
    return PROTOCOL_WORDS.get(curves.input_protocol, f"input protocol {curves.input_protocol}")


def input_type_table(curves: SinkCurves) -> Table:
    """Gu et al.'s Table 1 layout: one row per metric, the input types side by side, under
    the input protocol that built them."""
    rows: list[tuple[Cell, ...]] = [
        (f"{sink_rate_name(curves)} (%)", *[estimate_cell(row.sink_rate) for row in curves.input_types]),
        ("anchor mass", *[estimate_cell(row.anchor_mass, 3) for row in curves.input_types]),
    ]
    columns = (Column("metric"), *[Column(row.input_type) for row in curves.input_types])
    return Table(
        f"Sink rate and anchor mass per input type (Gu et al., Table 1; input protocol {curves.input_protocol})",
        columns,
        tuple(rows),
        f"{_sentence(protocol_words(curves))}; averaged {AVERAGED}.",
    )


def _value_columns(name: str, fmt: str) -> tuple[Column, ...]:
    return (Column(name, fmt, numeric=True), Column("CI low", fmt, numeric=True), Column("CI high", fmt, numeric=True))


def _values(value: SampleMean) -> tuple[Cell, ...]:
    return (value.mean, value.ci_low, value.ci_high)


EPS_TABLE: TableDefinition[EpsPoint] = TableDefinition(
    "Sink rate against ε",
    (
        Column("input type"),
        Column("ε", ".2f", numeric=True),
        *_value_columns("sink rate", ".1f"),
        Column("n", numeric=True),
    ),
    lambda point: (point.input_type, point.eps, *_values(point.sink_rate), point.sink_rate.n),
    f"All ε from one forward pass (each prompt's alpha per head is kept); sink rate in percent, averaged {AVERAGED}.",
)

LENGTH_TABLE: TableDefinition[LengthPoint] = TableDefinition(
    "Sink rate and anchor mass against T",
    (
        Column("input type"),
        Column("T", numeric=True),
        *_value_columns("sink rate", ".1f"),
        *_value_columns("anchor mass", ".3f"),
        Column("n", numeric=True),
    ),
    lambda point: (
        point.input_type,
        point.length,
        *_values(point.sink_rate),
        *_values(point.anchor_mass),
        point.sink_rate.n,
    ),
    f"T: tokens from the anchor, anchor included; prompts shorter than T are left out (n per row); averaged {AVERAGED}.",
)


def _series(name: str, xs: Sequence[float], values: Sequence[SampleMean]) -> CurveSeries:
    return CurveSeries(
        name,
        tuple(xs),
        tuple(v.mean for v in values),
        tuple(v.ci_low for v in values),
        tuple(v.ci_high for v in values),
    )


def _types(points: Sequence[EpsPoint] | Sequence[LengthPoint]) -> list[str]:
    return list(dict.fromkeys(point.input_type for point in points))


def draw_curve_figures(curves: SinkCurves, directory: Path, label: str) -> list[Figure]:
    """The eps curve and the length curves (sink rate; anchor mass), where measured."""
    figures = []
    if curves.eps_curve:
        series = [
            _series(kind, [p.eps for p in points], [p.sink_rate for p in points])
            for kind in _types(curves.eps_curve)
            for points in [[p for p in curves.eps_curve if p.input_type == kind]]
        ]
        interval_curves(
            series, directory / EPS_FIGURE, f"{label}: sink rate against ε", "ε", "sink rate (%)", (-2, 102)
        )
        caption = f"{sink_rate_name(curves).split('(')[0]}(ε) against ε, mean over prompts with 95% intervals; {ONE}"
        figures.append(Figure(directory / EPS_FIGURE, caption, directory))
    if curves.length_curve:
        for metric, name, ylim in (
            ("sink_rate", "sink rate (%)", (-2.0, 102.0)),
            ("anchor_mass", "anchor mass", (0.0, 1.02)),
        ):
            series = [
                _series(kind, [p.length for p in points], [getattr(p, metric) for p in points])
                for kind in _types(curves.length_curve)
                for points in [[p for p in curves.length_curve if p.input_type == kind]]
            ]
            path = directory / LENGTH_FIGURE.replace("sink_rate", metric)
            interval_curves(series, path, f"{label}: {name} against T", "T (tokens, anchor included)", name, ylim, True)
            caption = f"{name} against T (ε = {curves.eps:g} for the sink rate), mean over prompts with 95% intervals"
            figures.append(Figure(path, f"{caption}; {ONE}", directory))
    return figures


def _first_last(points: list, kind: str, x: str) -> tuple | None:
    """The first and last point of ``kind`` along ``x`` measured on enough prompts for an
    interval (``MIN_INTERVAL_UNITS``), None with fewer than two such points."""
    kept = sorted(
        (p for p in points if p.input_type == kind and interval_possible(p.sink_rate.n)), key=lambda p: getattr(p, x)
    )
    return (kept[0], kept[-1]) if len(kept) > 1 else None


def curve_findings(curves: SinkCurves) -> list[str]:
    """The experiments in sentences: the input-type contrast, the eps range, the T range."""
    found = []
    rows = {row.input_type: row for row in curves.input_types}
    if len(rows) > 1:
        parts = [f"{estimate_cell(row.sink_rate, unit='%')} on {row.input_type}" for row in rows.values()]
        found.append(
            f"{sink_rate_name(curves)} per input type (input protocol {curves.input_protocol}), mean over prompts: "
            f"{'; '.join(parts)}."
        )
        first, repeated = next(iter(rows.values())), rows.get("repeated")
        if repeated is not None and first.input_type != "repeated" and first.sink_rate.mean > 0:
            kept = repeated.sink_rate.mean / first.sink_rate.mean
            verb = (
                "removes most of the sink" if kept < 0.5 else "keeps most of the sink" if kept < 1 else "keeps the sink"
            )
            n = repeated.sink_rate.n
            found.append(
                f"One token repeated {verb}: its sink rate is {kept:.0%} of the {first.input_type}' (the ratio of the "
                f"two means above, over {plural(n, 'prompt')}{'; one prompt shows no more than itself' if n < 2 else ''})."
            )
    ends = [(kind, _first_last(list(curves.eps_curve), kind, "eps")) for kind in _types(curves.eps_curve)]
    parts = [
        f"{kind} {a.sink_rate.mean:.1f}% to {b.sink_rate.mean:.1f}%" for kind, pair in ends if pair for a, b in [pair]
    ]
    if parts:
        a, b = next(pair for _, pair in ends if pair)
        found.append(f"Sink rate from ε = {a.eps:g} to ε = {b.eps:g}: {'; '.join(parts)}.")
    ends = [(kind, _first_last(list(curves.length_curve), kind, "length")) for kind in _types(curves.length_curve)]
    parts = [
        f"{kind} {a.sink_rate.mean:.1f}% to {b.sink_rate.mean:.1f}% (anchor mass {a.anchor_mass.mean:.3f} to "
        f"{b.anchor_mass.mean:.3f})"
        for kind, pair in ends
        if pair
        for a, b in [pair]
    ]
    if parts:
        a, b = next(pair for _, pair in ends if pair)
        found.append(
            f"Sink rate from T = {a.length} to T = {b.length} tokens ({plural(b.sink_rate.n, 'prompt')} reach "
            f"T = {b.length}): {'; '.join(parts)}."
        )
    return found


def curve_tables(curves: SinkCurves) -> list[Table]:
    """Every table of the experiments, in report order."""
    tables = [input_type_table(curves)] if curves.input_types else []
    if curves.eps_curve:
        tables.append(EPS_TABLE.table(curves.eps_curve))
    if curves.length_curve:
        tables.append(LENGTH_TABLE.table(curves.length_curve))
    return tables


def curves_html(curves: SinkCurves) -> str:
    """Inline notebook display: the findings and every table."""
    parts = [bullets_html(curve_findings(curves)), *[inline_table(table) for table in curve_tables(curves)]]
    return fragment("Sink experiments", f"{plural(curves.n_forwards, 'forward pass', 'forward passes')} added", parts)


def curve_section(curves: SinkCurves, figure_dir: Path, label: str) -> Section:
    """The report's section: the tables, then the curves (drawn into ``figure_dir``)."""
    blocks: list[Block] = [*curve_tables(curves), *draw_curve_figures(curves, figure_dir, label)]
    blocks.append(
        Paragraph(
            f"The experiments added {plural(curves.n_forwards, 'forward pass', 'forward passes')} to the probe's own."
        )
    )
    blocks.extend(Paragraph(_sentence(note) + ".") for note in curves.notes)
    return Section("Sink experiments", tuple(blocks))
