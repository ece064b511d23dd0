"""Results as HTML fragments for a notebook's inline display (``_repr_html_``).

A fragment is one ``<div>`` with its own scoped style sheet and no script, so Jupyter,
VS Code and a plain browser show it the same way. Every string goes through
``html.escape``: prompts, tokens and model names are user input. Heat maps are HTML
tables with coloured cells, not images, so their numbers stay readable at any zoom and
the fragment needs no plotting backend.
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Iterable, Sequence

from sinkscope.reports.formatting import Cell, format_cell

STYLE = """
.sinkscope-inline { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; color: #1d2330; max-width: 1100px; }
.sinkscope-inline h3 { font-size: 16px; margin: 6px 0 2px; }
.sinkscope-inline h4 { font-size: 14px; margin: 14px 0 4px; }
.sinkscope-inline p.sub { color: #5b6473; margin: 0 0 8px; overflow-wrap: anywhere; }
.sinkscope-inline ul { margin: 4px 0 8px; padding-left: 20px; }
.sinkscope-inline table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 4px 0 8px; }
.sinkscope-inline th, .sinkscope-inline td { border-bottom: 1px solid #d9dde5; padding: 2px 8px; text-align: left; }
.sinkscope-inline td.num { text-align: right; white-space: nowrap; }
.sinkscope-inline thead th { background: #eef1f6; position: sticky; top: 0; }
.sinkscope-inline .scroll { max-height: 360px; overflow: auto; display: inline-block; }
.sinkscope-inline table.grid td { width: 44px; min-width: 44px; text-align: center; padding: 3px 2px; border: 1px solid #fff; }
.sinkscope-inline table.grid td.sink { outline: 2px solid #d9480f; outline-offset: -2px; font-weight: 600; }
.sinkscope-inline table.grid th { text-align: center; background: none; font-weight: 600; color: #5b6473; }
.sinkscope-inline caption { text-align: left; font-weight: 600; padding: 2px 0; }
"""

# viridis at five stops: dark (low) to yellow (high); text turns dark on the light end
_STOPS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def colour(value: float, vmin: float = 0.0, vmax: float = 1.0) -> tuple[str, str]:
    """(background, text) CSS colours of ``value`` on viridis between vmin and vmax;
    grey for NaN."""
    if math.isnan(value):
        return "#e9ecef", "#5b6473"
    t = min(max((value - vmin) / (vmax - vmin) if vmax > vmin else 0.0, 0.0), 1.0) * (len(_STOPS) - 1)
    low = min(int(t), len(_STOPS) - 2)
    frac = t - low
    rgb = [round(a + (b - a) * frac) for a, b in zip(_STOPS[low], _STOPS[low + 1])]
    text = "#1d2330" if t > 2.2 else "#ffffff"
    return "#{:02x}{:02x}{:02x}".format(*rgb), text


def table(
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[Cell]],
    caption: str = "",
    scroll: bool = False,
) -> str:
    """A table; ``columns`` are (header, format spec) pairs, numbers right-aligned."""
    head = "".join(f"<th>{escape(name)}</th>" for name, _ in columns)
    body = []
    for row in rows:
        cells = []
        for (_, fmt), value in zip(columns, row):
            numeric = isinstance(value, numbers.Real) and not isinstance(value, bool)
            css = ' class="num"' if numeric else ""
            cells.append(f"<td{css}>{escape(format_cell(value, fmt))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    caption_html = f"<caption>{escape(caption)}</caption>" if caption else ""
    markup = f"<table>{caption_html}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{markup}</div>' if scroll else markup


def heat_grid(
    values: Sequence[Sequence[float]],
    caption: str,
    row_name: str = "layer",
    column_name: str = "head",
    marked: frozenset[tuple[int, int]] = frozenset(),
    vmin: float = 0.0,
    vmax: float = 1.0,
    row_labels: Sequence[str] = (),
) -> str:
    """``values[row][column]`` as coloured cells with their numbers; ``marked`` cells are
    outlined (e.g. sink heads); rows are numbered unless ``row_labels`` name them."""
    n_columns = max((len(row) for row in values), default=0)
    head = f"<th>{escape(row_name)} \\ {escape(column_name)}</th>" + "".join(
        f"<th>{column}</th>" for column in range(n_columns)
    )
    body = []
    for r, row in enumerate(values):
        cells = []
        for c, value in enumerate(row):
            background, text = colour(float(value), vmin, vmax)
            css = ' class="sink"' if (r, c) in marked else ""
            title = escape(f"{row_name} {r}, {column_name} {c}: {format_cell(float(value), '.4f')}")
            cells.append(
                f'<td{css} style="background:{background};color:{text}" title="{title}">'
                f"{escape(format_cell(float(value), '.2f'))}</td>"
            )
        label = row_labels[r] if r < len(row_labels) else str(r)
        body.append(f"<tr><th>{escape(label)}</th>{''.join(cells)}</tr>")
    return (
        f'<table class="grid"><caption>{escape(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def bullets(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in items) + "</ul>"


def heading(text: str) -> str:
    return f"<h4>{escape(text)}</h4>"


def fragment(title: str, subtitle: str, parts: Iterable[str]) -> str:
    """One self-contained ``<div>``: a title, a subtitle, then ``parts`` (already HTML)."""
    sub = f'<p class="sub">{escape(subtitle)}</p>' if subtitle else ""
    return f'<div class="sinkscope-inline"><style>{STYLE}</style><h3>{escape(title)}</h3>{sub}{"".join(parts)}</div>'
