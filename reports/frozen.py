"""A wide HTML table's leading columns (``Table.frozen``: those that say which row it is,
e.g. layer, head and anchor mass) stay in view while the rest scrolls sideways.

Each frozen column is ``position: sticky`` at a fixed width, ``left`` the sum of the
widths before it. The page's Content-Security-Policy admits no ``style`` attribute, so
widths and offsets are classes of one fixed style sheet (``frozen_css``), quantised to
``STEP`` px; the widths are estimated from the text (generously: a column that came out
wider than its estimate would slide under the next one).
"""

from __future__ import annotations

import math

from sinkscope.reports.document import Table, format_cell

STEP = 8  # px: widths and offsets are multiples of this
MIN_PX, MAX_PX = 32, 480  # one frozen column, and all of them together, at most MAX_PX
CELL_CHAR_PX = 8.0  # a character of a 13 px cell, with room for wide system fonts
HEAD_CHAR_PX = 8.5  # a bold header character
PADDING_PX = 20  # a cell's padding either side, and its border
SORT_MARK_PX = 14  # the sort arrow after a sortable header


def _up(px: float) -> int:
    return min(MAX_PX, max(MIN_PX, STEP * math.ceil(px / STEP)))


def column_width(table: Table, index: int, sortable: bool) -> int:
    """Px a frozen column needs: its widest cell, or its header's longest part between
    underscores (the header may break after each)."""
    column = table.columns[index]
    parts = column.header.replace(" ", "_").split("_")
    header = max((len(part) + (k < len(parts) - 1) for k, part in enumerate(parts)), default=0)  # "anchor_"
    head = header * HEAD_CHAR_PX + (SORT_MARK_PX if sortable else 0)
    cells = max((len(format_cell(row[index], column.fmt)) for row in table.rows), default=0)
    return _up(max(head, cells * CELL_CHAR_PX) + PADDING_PX)


def frozen_widths(table: Table, sortable: bool) -> list[int]:
    """The widths of the columns kept in view: the leading ``table.frozen`` ones, fewer when
    together they would pass ``MAX_PX`` (the first one is kept, at most ``MAX_PX`` wide)."""
    if len(table.columns) < 2:
        return []  # nothing beside it could scroll
    widths: list[int] = []
    for index in range(min(table.frozen, len(table.columns) - 1)):
        width = column_width(table, index, sortable)
        if widths and sum(widths) + width > MAX_PX:
            break
        widths.append(width)
    return widths


def frozen_classes(widths: list[int]) -> list[str]:
    """Each frozen cell's class attribute text, column by column."""
    classes, left = [], 0
    for index, width in enumerate(widths):
        last = " fz-last" if index == len(widths) - 1 else ""
        classes.append(f"fz fw{width} fl{left}{last}")
        left += width
    return classes


def frozen_css(scope: str = "") -> str:
    """The style sheet of frozen columns, each rule under ``scope`` (e.g. the notebook
    fragment's ``.sinkscope-inline``)."""
    s = f"{scope} " if scope else ""
    rules = [
        f"{s}td.fz, {s}th.fz {{ position: sticky; z-index: 1; box-sizing: border-box; background: #fff; "
        "overflow: hidden; white-space: normal; overflow-wrap: anywhere; }",
        f"{s}td.fz.num {{ white-space: nowrap; }}",
        f"{s}thead th.fz {{ z-index: 3; background: #eef1f6; }}",
        f"{s}thead th {{ z-index: 2; }}",
        *([] if scope else ["tbody tr:nth-child(even) td.fz { background: #fafbfc; }"]),  # the page's stripes
        f"{s}tbody tr.marked td.fz {{ background: #fff4e0; }}",
        # a line where the scrolling columns slide under the frozen ones
        f"{s}.fz-last {{ box-shadow: inset -2px 0 0 #c3c9d4; }}",
        f"{s}tr.marked td.fz-last:first-child {{ box-shadow: inset 3px 0 0 #0a6cff, inset -2px 0 0 #c3c9d4; }}",
    ]
    rules += [
        f"{s}.fw{w} {{ width: {w}px; min-width: {w}px; max-width: {w}px; }}" for w in range(MIN_PX, MAX_PX + 1, STEP)
    ]
    rules += [f"{s}.fl{x} {{ left: {x}px; }}" for x in range(0, MAX_PX + 1, STEP)]
    return "\n".join(rules) + "\n"
