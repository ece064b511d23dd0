"""HTML, the one stack: the table, heat-grid and bullet renderers, the report page's
shell and the notebook fragment's shell.

``render_html`` draws a ``ReportDocument`` as ONE self-contained file: figures are
embedded as base64 ``data:`` URIs; the style sheet and the table-sorting script are
inline; nothing is fetched from the network. A Content-Security-Policy allows only the
page's own style and script (by hash) and ``data:`` images, so even a string that escaped
escaping could not run.

``fragment`` wraps the same tables, grids and bullets as one ``<div>`` with its own
scoped style sheet and no script, for a notebook's inline display (``_repr_html_``): so
Jupyter, VS Code and a plain browser show it the same way. Heat maps there are HTML
tables with coloured cells, not images, so their numbers stay readable at any zoom and
the fragment needs no plotting backend.

Every string goes through ``escape`` (``html.escape``): prompts, tokens and model names
are user input.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable, Sequence

from sinkscope.reports.colour_scales import colour, signed_colour, signed_limits
from sinkscope.reports.document import (
    Block,
    Bullets,
    Details,
    Figure,
    HeadMaps,
    KeyValues,
    Paragraph,
    ReportDocument,
    Section,
    Table,
    format_cell,
    slug,
    sort_key,
)
from sinkscope.reports.frozen import frozen_classes, frozen_css, frozen_widths
from sinkscope.reports.text import terminal_text

STYLE = """
:root { color-scheme: light; --ink: #1d2330; --muted: #5b6473; --line: #d9dde5; --accent: #3b5bdb; --sink: #fff4e0; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink); background: #fff; }
header, main, nav { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 28px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-top: 8px; border-top: 1px solid var(--line); }
.subtitle { color: var(--muted); margin: 0 0 12px; overflow-wrap: anywhere; }
nav ol { display: flex; flex-wrap: wrap; gap: 4px 18px; padding: 0; margin: 0 0 8px; list-style: none; font-size: 14px; }
nav a, a { color: var(--accent); text-decoration: none; }
#findings ul { background: #f4f6fb; border-left: 4px solid var(--accent); padding: 12px 16px 12px 34px; margin: 0; }
#findings li { margin: 4px 0; }
p.note { color: var(--muted); font-size: 13px; margin: 4px 0 8px; }
/* every table scrolls inside its own box: never wider than the page, and a long table's
   horizontal scroll bar and sticky header stay on screen */
.table-wrap { overflow: auto; max-width: 100%; max-height: 85vh; margin: 8px 0 18px; scrollbar-color: #9aa3b2 #eef1f6; }
.table-wrap.scroll { max-height: 520px; overflow: auto; border: 1px solid var(--line); }
.table-tools { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; font-size: 13px; margin: 8px 0 4px; }
.table-tools input[type="search"] { font: inherit; padding: 2px 6px; min-width: 16em; }
.table-tools .shown { color: var(--muted); }
tr.marked td { background: var(--sink); }
tr.marked td:first-child { box-shadow: inset 3px 0 0 #0a6cff; }
details.list { margin: 6px 0 14px; }
details.list summary { cursor: pointer; font-weight: 600; }
details.list p { margin: 4px 0 0 18px; overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px; text-align: left; vertical-align: top; }
td.num { text-align: right; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
thead th { background: #eef1f6; position: sticky; top: 0; vertical-align: bottom; max-width: 10em; }
td:first-child { white-space: nowrap; }
table.sortable thead th { cursor: pointer; user-select: none; }
table.sortable thead th button { background: none; border: 0; padding: 0; font: inherit; color: inherit; cursor: pointer; }
table.sortable thead th::after { content: " \\2195"; color: #9aa3b2; font-size: 11px; }
table.sortable thead th[aria-sort="ascending"]::after { content: " \\25B2"; color: var(--accent); }
table.sortable thead th[aria-sort="descending"]::after { content: " \\25BC"; color: var(--accent); }
table.kv th { background: none; position: static; font-weight: 600; color: var(--muted); }
figure { margin: 12px 0 22px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.figures { display: flex; flex-wrap: wrap; gap: 0 24px; align-items: flex-start; }
.figures figure { flex: 1 1 460px; min-width: 0; max-width: max-content; }
footer { max-width: 1180px; margin: 40px auto 30px; padding: 0 24px; color: var(--muted); font-size: 12px; }
""" + frozen_css()

SCRIPT = """
"use strict";
(function () {
  function cellKey(row, index, numeric) {
    var cell = row.cells[index];
    var raw = cell.getAttribute("data-sort");
    if (raw === null) { raw = cell.textContent; }
    if (raw === "") { return null; }
    return numeric ? parseFloat(raw) : raw;
  }
  function sortTable(table, header, index) {
    var numeric = header.hasAttribute("data-numeric");
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellKey(a, index, numeric), y = cellKey(b, index, numeric);
      if (x === null || y === null) { return x === y ? 0 : (x === null ? 1 : -1); }
      var order = numeric ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (cell) { cell.setAttribute("aria-sort", "none"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }
  function filterTable(tools) {
    var table = document.getElementById(tools.getAttribute("data-table"));
    var query = tools.querySelector("input[type=search]").value.trim().toLowerCase();
    var only = tools.querySelector("input[type=checkbox]");
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var keep = (!only || !only.checked || row.classList.contains("marked")) &&
        (query === "" || row.textContent.toLowerCase().indexOf(query) !== -1);
      row.hidden = !keep;
      if (keep) { shown += 1; }
    });
    tools.querySelector(".shown").textContent = shown + " of " + table.tBodies[0].rows.length + " rows shown";
  }
  Array.prototype.forEach.call(document.querySelectorAll(".table-tools"), function (tools) {
    Array.prototype.forEach.call(tools.querySelectorAll("input"), function (input) {
      input.addEventListener("input", function () { filterTable(tools); });
      input.addEventListener("change", function () { filterTable(tools); });
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (header, index) {
      header.addEventListener("click", function () { sortTable(table, header, index); });
    });
  });
})();
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; img-src data:; style-src {_csp_hash(STYLE)}; script-src {_csp_hash(SCRIPT)}; "
    "base-uri 'none'; form-action 'none'"
)


# Unicode's bidirectional controls (embeddings, overrides, isolates): inside a prompt or a
# model name they would reverse the report's own words after them, so they are shown as codes
BIDI_CONTROLS = {ord(ch): f"<U+{ord(ch):04X}>" for ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"}


def escape(text: object) -> str:
    """The one HTML escaper: text (and attribute values) can never become markup, and no
    bidirectional control in it can reorder the text around it."""
    return html.escape(terminal_text(str(text).translate(BIDI_CONTROLS)), quote=True)


_e = escape


SCROLL_ROWS = 20  # a longer table scrolls inside a box of fixed height; more than 12 rows get a filter box


def table_tools(table: Table, table_id: str) -> str:
    """The filter box above a page's table (and a toggle for its marked rows alone), which
    the page script wires up."""
    toggle = (
        f'<label><input type="checkbox"> {_e(table.marked_label)} only ({len(table.marked)})</label>'
        if table.marked_label and table.marked
        else ""
    )
    return (
        f'<div class="table-tools" data-table="{table_id}"><input type="search" placeholder="filter rows" '
        f'aria-label="filter the rows of {_e(table.caption or "the table")}">{toggle}'
        f'<span class="shown">{len(table.rows)} rows</span></div>'
    )


def table_html(table: Table, sortable: bool = True, scroll: bool = False, table_id: str = "") -> str:
    """A table: numbers right-aligned, marked rows (e.g. sink heads) highlighted; ``sortable``
    adds the page script's sort buttons and each number's sort key (a notebook fragment has
    no script); ``scroll`` caps its height; ``table_id`` (on the page) adds the filter box."""
    fz = frozen_classes(frozen_widths(table, sortable))  # the leading columns that stay in view
    head = []
    for k, column in enumerate(table.columns):
        name = _e(column.header).replace("_", "_<wbr>")  # long metric names may break after an underscore
        css = f' class="{fz[k]}"' if k < len(fz) else ""
        if sortable:
            numeric = " data-numeric" if column.numeric else ""
            head.append(f'<th scope="col"{css} aria-sort="none"{numeric}><button type="button">{name}</button></th>')
        else:
            head.append(f'<th scope="col"{css}>{name}</th>')
    body: list[str] = []
    for row in table.rows:
        cells = []
        for k, (column, value) in enumerate(zip(table.columns, row)):
            text = _e(format_cell(value, column.fmt))
            css = " ".join((["num"] if column.numeric else []) + ([fz[k]] if k < len(fz) else []))
            sort = f' data-sort="{_e(sort_key(value))}"' if sortable and column.numeric else ""
            cells.append(f'<td class="{css}"{sort}>{text}</td>' if css else f"<td>{text}</td>")
        marked = ' class="marked"' if len(body) in table.marked else ""
        body.append(f"<tr{marked}>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{_e(table.note)}</p>' if table.note else ""
    caption = f"<caption>{_e(table.caption)}</caption>" if table.caption else ""
    css = ' class="sortable"' if sortable else ""
    ident = f' id="{table_id}"' if table_id else ""
    wrap = "table-wrap scroll" if scroll else "table-wrap"
    tools = table_tools(table, table_id) if table_id else ""
    return (
        f'{tools}<div class="{wrap}"><table{ident}{css}>{caption}'
        f"<thead><tr>{''.join(head)}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{note}"
    )


def details_html(block: Details) -> str:
    """A complete list, folded: its summary (what and how many) opens it."""
    return f'<details class="list"><summary>{_e(block.summary)}</summary><p>{_e(", ".join(block.items))}</p></details>'


def bullets_html(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{_e(item)}</li>" for item in items) + "</ul>"


def heat_grid(
    values: Sequence[Sequence[float]],
    caption: str,
    row_name: str = "layer",
    column_name: str = "head",
    marked: frozenset[tuple[int, int]] = frozenset(),
    vmin: float = 0.0,
    vmax: float = 1.0,
    row_labels: Sequence[str] = (),
    column_labels: Sequence[str] = (),
    signed: bool = False,
) -> str:
    """``values[row][column]`` as coloured cells with their numbers; ``marked`` cells are
    outlined (e.g. sink heads); rows and columns are numbered from 0 unless ``row_labels``
    / ``column_labels`` name them (e.g. positions counted from 1); ``signed``: a diverging
    scale, white at 0, from -m to +m (m the largest |value|; vmin and vmax unused)."""
    m = signed_limits(v for row in values for v in row)[1]
    n_columns = max((len(row) for row in values), default=0)
    names = [column_labels[c] if c < len(column_labels) else str(c) for c in range(n_columns)]
    head = f"<th>{_e(row_name)} \\ {_e(column_name)}</th>" + "".join(f"<th>{_e(name)}</th>" for name in names)
    body = []
    for r, row in enumerate(values):
        cells = []
        for c, value in enumerate(row):
            background, text = signed_colour(float(value), m) if signed else colour(float(value), vmin, vmax)
            css = ' class="sink"' if (r, c) in marked else ""
            title = _e(f"{row_name} {r}, {column_name} {names[c]}: {format_cell(float(value), '.4f')}")
            cells.append(
                f'<td{css} style="background:{background};color:{text}" title="{title}">'
                f"{_e(format_cell(float(value), '.2f'))}</td>"
            )
        label = row_labels[r] if r < len(row_labels) else str(r)
        body.append(f"<tr><th>{_e(label)}</th>{''.join(cells)}</tr>")
    return (
        f'<table class="grid"><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def head_maps_html(maps: HeadMaps) -> str:
    """Every panel's rows stacked in one grid (rows named "panel L<layer>" when there are
    several panels), marked cells outlined."""
    values: list[tuple[float, ...]] = []
    labels: list[str] = []
    marked: set[tuple[int, int]] = set()
    for index, (name, rows) in enumerate(maps.panels):
        outlined = maps.marked[index] if index < len(maps.marked) else frozenset()
        marked.update((len(values) + layer, head) for layer, head in outlined)
        labels += [f"{name} L{layer}" if len(maps.panels) > 1 else str(layer) for layer in range(len(rows))]
        values += rows
    caption = f"{maps.title}; outlined: {maps.marked_label}" if maps.marked_label else maps.title
    row_name = "model, layer" if len(maps.panels) > 1 else "layer"
    return heat_grid(values, caption, row_name, "head", frozenset(marked), maps.vmin, maps.vmax, labels)


INLINE_STYLE = """
.sinkscope-inline { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; color: #1d2330; max-width: 1100px; }
.sinkscope-inline h3 { font-size: 16px; margin: 6px 0 2px; }
.sinkscope-inline h4 { font-size: 14px; margin: 14px 0 4px; }
.sinkscope-inline p.sub { color: #5b6473; margin: 0 0 8px; overflow-wrap: anywhere; }
.sinkscope-inline p.note { color: #5b6473; font-size: 12px; margin: 0 0 8px; max-width: 1000px; }
.sinkscope-inline ul { margin: 4px 0 8px; padding-left: 20px; }
.sinkscope-inline table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 4px 0 8px; }
.sinkscope-inline th, .sinkscope-inline td { border-bottom: 1px solid #d9dde5; padding: 2px 8px; text-align: left; }
.sinkscope-inline td.num { text-align: right; white-space: nowrap; }
.sinkscope-inline tr.marked td { background: #fff4e0; }
.sinkscope-inline thead th { background: #eef1f6; position: sticky; top: 0; }
.sinkscope-inline .table-wrap, .sinkscope-inline table.grid { scrollbar-color: #9aa3b2 #eef1f6; }
.sinkscope-inline .table-wrap { max-width: 100%; overflow-x: auto; }
.sinkscope-inline .scroll { max-height: 360px; overflow: auto; }
.sinkscope-inline table.grid { display: block; max-width: 100%; overflow-x: auto; }
.sinkscope-inline table.grid td { width: 44px; min-width: 44px; text-align: center; padding: 3px 2px; border: 1px solid #fff; }
.sinkscope-inline table.grid td.sink { outline: 2px solid #d9480f; outline-offset: -2px; font-weight: 600; }
.sinkscope-inline table.grid th { text-align: center; background: none; font-weight: 600; color: #5b6473; }
.sinkscope-inline caption { text-align: left; font-weight: 600; padding: 2px 0; }
""" + frozen_css(".sinkscope-inline")


def fragment(title: str, subtitle: str, parts: Iterable[str]) -> str:
    """The notebook shell: one self-contained ``<div>``, a title, a subtitle, then ``parts``
    (already HTML: ``table_html(..., sortable=False)``, ``heat_grid``, ``bullets_html``)."""
    sub = f'<p class="sub">{_e(subtitle)}</p>' if subtitle else ""
    return f'<div class="sinkscope-inline"><style>{INLINE_STYLE}</style><h3>{_e(title)}</h3>{sub}{"".join(parts)}</div>'


def inline_table(table: Table) -> str:
    """A table in a notebook fragment: no sort script; long tables scroll."""
    return table_html(table, sortable=False, scroll=len(table.rows) > 12)


# A figure wider than half the column (1180 px less 2 x 24 px padding, 24 px gap, 1 px
# borders) would be shrunk beside another, so it gets a row of its own.
HALF_COLUMN_PX = (1180 - 2 * 24 - 24) // 2 - 2


def _figure(figure: Figure) -> str:
    width, height = figure.size()
    data = base64.b64encode(figure.png_bytes()).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'alt="{_e(figure.caption)}"><figcaption>{_e(figure.caption)}</figcaption></figure>'
    )


def _key_values(block: KeyValues) -> str:
    rows = "".join(f'<tr><th scope="row">{_e(key)}</th><td>{_e(value)}</td></tr>' for key, value in block.items)
    caption = f"<caption>{_e(block.caption)}</caption>"
    return f'<div class="table-wrap"><table class="kv">{caption}<tbody>{rows}</tbody></table></div>'


def _block(block: Block, anchor: str = "table") -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_e(block.text)}</p>"
    if isinstance(block, Bullets):
        return bullets_html(block.items)
    if isinstance(block, Details):
        return details_html(block)
    if isinstance(block, Table):
        long = len(block.rows) > SCROLL_ROWS
        return table_html(block, scroll=long, table_id=anchor if len(block.rows) > 12 else "")
    if isinstance(block, Figure):
        return _figure(block)
    if isinstance(block, KeyValues):
        return _key_values(block)
    raise TypeError(f"unknown report block {type(block).__name__}")


def _section(section: Section, anchor: str) -> str:
    parts: list[str] = []
    figures: list[str] = []
    for index, block in enumerate(section.blocks):  # consecutive figures share a row, unless one is wide
        if isinstance(block, Figure):
            if block.size()[0] > HALF_COLUMN_PX:
                if figures:
                    parts.append('<div class="figures">' + "".join(figures) + "</div>")
                parts.append('<div class="figures">' + _block(block) + "</div>")
                figures = []
            else:
                figures.append(_block(block))
            continue
        if figures:
            parts.append('<div class="figures">' + "".join(figures) + "</div>")
            figures = []
        parts.append(_block(block, f"{anchor}-table-{index}"))
    if figures:
        parts.append('<div class="figures">' + "".join(figures) + "</div>")
    return f'<section id="{anchor}"><h2>{_e(section.title)}</h2>{"".join(parts)}</section>'


def render_html(document: ReportDocument, footer: str = "") -> str:
    """The whole page as one string."""
    taken = {"findings"}
    anchors = [slug(section.title, taken) for section in document.sections]
    toc = '<li><a href="#findings">Summary of findings</a></li>' + "".join(
        f'<li><a href="#{anchor}">{_e(section.title)}</a></li>' for section, anchor in zip(document.sections, anchors)
    )
    findings = bullets_html(document.findings)
    body = "".join(_section(section, anchor) for section, anchor in zip(document.sections, anchors))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">'
        f"<title>{_e(document.title)}</title><style>{STYLE}</style></head><body>"
        f'<header><h1>{_e(document.title)}</h1><p class="subtitle">{_e(document.subtitle)}</p></header>'
        f'<nav aria-label="sections"><ol>{toc}</ol></nav>'
        f'<main><section id="findings"><h2>Summary of findings</h2>{findings}</section>{body}</main>'
        f"<footer>{_e(footer)}</footer>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
