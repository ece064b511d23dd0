"""The report document: what a report says, independent of how it is rendered.

Content builders (``sinkscope.toy.report``, ``sinkscope.pretrained_analysis.report``) turn a result
directory into a ``ReportDocument``; ``sinkscope.reports.html`` and ``sinkscope.reports.markdown``
render it. Every string in a document is plain text: renderers escape it, so text that
came from a prompt, a tokenizer or a file name can never become markup.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from sinkscope.reports.embedded import check_embedded_png, read_embedded_png

# re-exported: reports, tables, findings and inline displays format numbers one way
from sinkscope.reports.formatting import Cell as Cell
from sinkscope.reports.formatting import format_cell as format_cell
from sinkscope.reports.formatting import percent as percent
from sinkscope.reports.formatting import sig as sig

Item = TypeVar("Item")


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Column:
    """A table column: ``name`` heads it (with ``unit`` in brackets when given); ``fmt``
    is a format spec for numbers (``".3f"``, ``".2e"``); numeric columns are
    right-aligned and sort numerically in the HTML table."""

    name: str
    fmt: str = ""
    numeric: bool = False
    unit: str = ""

    @property
    def header(self) -> str:
        return f"{self.name} ({self.unit})" if self.unit else self.name


@dataclass(frozen=True)
class Details:
    """A list given whole, never cut: ``summary`` says what and how many (e.g. "27 sink
    heads, strongest first"); HTML folds ``items`` into a ``<details>`` block, Markdown and
    text list them all."""

    summary: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table, ready to render; ``note`` explains the columns under the caption;
    ``marked``: the indices of rows that stand out (e.g. sink heads), which
    ``marked_label`` names; the HTML page can show those rows alone; ``frozen``: how many
    leading columns (those that say which row it is) stay in view while a wide table
    scrolls sideways in HTML (other media ignore it)."""

    caption: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    note: str = ""
    marked: frozenset[int] = frozenset()
    marked_label: str = ""
    frozen: int = 1

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.caption!r}: a row has {len(row)} cells for {len(self.columns)} columns")

    def without_empty_columns(self) -> Table:
        """The table less every column in which nothing was measured (all cells NaN or None)."""
        keep = [
            index
            for index in range(len(self.columns))
            if not self.rows or not all(_missing(row[index]) for row in self.rows)
        ]
        return Table(
            self.caption,
            tuple(self.columns[k] for k in keep),
            tuple(tuple(row[k] for k in keep) for row in self.rows),
            self.note,
            self.marked,
            self.marked_label,
            sum(1 for k in keep if k < self.frozen),
        )


def _missing(value: Cell) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class TableDefinition(Generic[Item]):
    """What one table shows, defined once for every medium: its columns (labels, units,
    number formats), the cells of one item, its default order, caption and note.
    ``table(items)`` makes the ``Table`` that every renderer draws (report page,
    Markdown, inline notebook HTML, CSV, terminal)."""

    caption: str
    columns: tuple[Column, ...]
    cells: Callable[[Item], tuple[Cell, ...]]
    note: str = ""
    order: Callable[[Item], Any] | None = None  # the default sort key; None keeps the given order
    marked: Callable[[Item], bool] | None = None  # the rows that stand out (e.g. sink heads)
    marked_label: str = ""  # what a marked row is, e.g. "sink heads"
    frozen: int = 1  # leading columns kept in view while the HTML table scrolls sideways

    def ordered(self, items: Iterable[Item]) -> list[Item]:
        return sorted(items, key=self.order) if self.order is not None else list(items)

    def rows(self, items: Iterable[Item]) -> tuple[tuple[Cell, ...], ...]:
        return tuple(self.cells(item) for item in self.ordered(items))

    def table(
        self, items: Iterable[Item], caption: str | None = None, note: str | None = None, limit: int | None = None
    ) -> Table:
        """The items as a table (the first ``limit`` rows in the default order, when given)."""
        ordered = self.ordered(items)
        if limit is not None:
            ordered = ordered[:limit]
        marked = self.marked
        return Table(
            self.caption if caption is None else caption,
            self.columns,
            tuple(self.cells(item) for item in ordered),
            self.note if note is None else note,
            frozenset(k for k, item in enumerate(ordered) if marked is not None and marked(item)),
            self.marked_label if marked is not None else "",
            self.frozen,
        )

    def labelled(self, label: Column) -> TableDefinition[tuple[Cell, Item]]:
        """The same table over ``(label, item)`` pairs, with ``label`` as its first column
        (e.g. the model each head belongs to), in the order given (the labels' order is the
        caller's: sorting by the item alone would interleave the labels)."""
        marked = self.marked
        return TableDefinition(
            self.caption,
            (label, *self.columns),
            lambda pair: (pair[0], *self.cells(pair[1])),
            self.note,
            None,
            None if marked is None else (lambda pair: marked(pair[1])),
            self.marked_label,
            self.frozen + 1,
        )


@dataclass(frozen=True)
class Figure:
    """A PNG file written by the run into its result directory ``root``, or by the report
    builder into its figure folder (then ``root`` is that folder); it is read only when it
    lies inside ``root`` (``sinkscope.reports.embedded``)."""

    path: Path
    caption: str
    root: Path

    def png_bytes(self) -> bytes:
        return read_embedded_png(self.path, self.root)

    def real_path(self) -> Path:
        """The file itself, symlinks resolved, once checked: what a Markdown link points to."""
        return check_embedded_png(self.path, self.root)

    def size(self) -> tuple[int, int]:
        """(width, height) in pixels, from the PNG header."""
        width, height = struct.unpack(">II", self.png_bytes()[16:24])
        return width, height


@dataclass(frozen=True)
class HeadMaps:
    """A layer x head figure defined once for every medium: the report draws it as a PNG
    (``sinkscope.reports.plots.draw_head_maps``), a notebook as coloured HTML cells with
    their numbers (``sinkscope.reports.html.head_maps_html``). One panel per ``(name,
    values[layer][head])`` (e.g. one per model), on one colour scale from vmin to vmax;
    ``marked[panel]``: the (layer, head) cells to outline, which ``marked_label`` names
    (e.g. sink heads)."""

    title: str
    colorbar_label: str
    panels: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...]
    marked: tuple[frozenset[tuple[int, int]], ...] = ()
    marked_label: str = ""
    vmin: float = 0.0
    vmax: float = 1.0


@dataclass(frozen=True)
class KeyValues:
    """Label/value pairs (configuration, provenance)."""

    caption: str
    items: tuple[tuple[str, str], ...]


Block = Paragraph | Bullets | Details | Table | Figure | KeyValues


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class ReportDocument:
    """title; subtitle: one line under it (kind and source); findings: the summary in
    words, first thing a reader sees; sections: the body, in order."""

    title: str
    subtitle: str
    findings: tuple[str, ...]
    sections: tuple[Section, ...]


def records_table(caption: str, records: Iterable[Any], record_type: type) -> Table:
    """Dataclass records as a table of their raw fields, one column per field named as
    the field (e.g. ``heads.csv``: every ``HeadProbe`` metric at full precision)."""
    names = [item.name for item in fields(record_type)]
    return Table(
        caption,
        tuple(Column(name) for name in names),
        tuple(tuple(getattr(record, name) for name in names) for record in records),
    )


def sort_key(value: Cell) -> str:
    """Machine-readable sort value of a cell ("" for missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        number = float(value)
        return ("Infinity" if number > 0 else "-Infinity") if math.isinf(number) else repr(number)
    return value


def slug(text: str, taken: set[str]) -> str:
    """An HTML id from a heading, unique within ``taken`` (which it extends)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-") or "section"
    base = "-".join(part for part in base.split("-") if part)
    candidate, index = base, 2
    while candidate in taken:
        candidate, index = f"{base}-{index}", index + 1
    taken.add(candidate)
    return candidate


def config_block(caption: str, config: object, shown: Mapping[str, tuple[str, str]] | None = None) -> KeyValues:
    """A dataclass config's fields as label/value pairs (fields hidden from ``repr`` are
    left out too); ``shown`` gives some fields a reader's label and value instead (e.g. a
    0-indexed position shown 1-indexed, as the figures count)."""
    if not is_dataclass(config):
        raise TypeError(f"config_block needs a dataclass, got {type(config).__name__}")
    shown = shown or {}
    return KeyValues(
        caption,
        tuple(
            shown.get(item.name, (item.name, config_value(getattr(config, item.name))))
            for item in fields(config)
            if item.repr
        ),
    )


def config_value(value: object) -> str:
    """A setting as a reader writes it: unset as an en dash, a tuple as its items joined
    by commas (``8, 16``, not ``(8, 16)``), booleans as on/off."""
    if value is None:
        return "\u2013"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ", ".join(config_value(item) for item in value)
    return str(value)


def result_figures(root: Path, names_and_captions: Iterable[tuple[str, str]], missing: str) -> list[Block]:
    """A ``Figure`` for each name (a path relative to the result directory ``root``) that is
    there, once checked to be a PNG inside ``root``; a line for each missing one (a report
    never fails on a deleted PNG) that ends with ``missing``, how to draw it again."""
    blocks: list[Block] = []
    for name, caption in names_and_captions:
        path = root / name
        if os.path.lexists(path):  # a dangling symlink is there too, and refused
            check_embedded_png(path, root)
            blocks.append(Figure(path, caption, root))
        else:
            blocks.append(Paragraph(f"Figure {name} is missing from {root}; {missing}."))
    return blocks
