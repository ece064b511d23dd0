"""Tables as plain text: CSV for files and spreadsheets, and the terminal summary a
command prints, each with its one escaper. ``csv_cell``: the csv module quotes, and a text
cell that a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``, tab, CR) gets a
leading ``'``. ``terminal_text``: control characters (an escape sequence in a model's
directory name would drive the terminal) are shown as their escapes (``\\x1b``), and in a table
cell ``|`` and line breaks are escaped so the table keeps its shape."""

from __future__ import annotations

import csv
import io

from sinkscope.reports.document import Table, format_cell

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A CSV cell: numbers as they are; text that a spreadsheet would read as a formula
    behind a ``'`` (numbers written as text, like ``-0.5``, are left alone)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _is_number(value):
        return "'" + value
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def terminal_text(text: object) -> str:
    """``text`` safe to print: every control character but newline and tab as ``\\x..``."""
    return "".join(
        char if char in "\n\t" or (char.isprintable() and char != "\x7f") else char.encode("unicode_escape").decode()
        for char in str(text)
    )


def _terminal_cell(text: str) -> str:
    return terminal_text(text).replace("|", "\\|").replace("\n", " ").replace("\t", " ")


def table_csv(table: Table, formatted: bool = False) -> str:
    """The table as CSV: a header of column names, then one line per row. Cells are the
    values themselves (full precision, empty where missing), or the displayed text when
    ``formatted``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(csv_cell(column.header) for column in table.columns)
    for row in table.rows:
        writer.writerow(
            csv_cell(format_cell(value, column.fmt) if formatted else ("" if value is None else value))
            for column, value in zip(table.columns, row)
        )
    return buffer.getvalue()


def table_terminal(table: Table) -> str:
    """The table as a terminal prints it: a pipe table (which also reads as Markdown) of
    the displayed cells, numbers right-aligned."""
    lines = ["| " + " | ".join(_terminal_cell(column.header) for column in table.columns) + " |"]
    lines.append("|" + "".join("---:|" if column.numeric else "---|" for column in table.columns))
    for row in table.rows:
        lines.append(
            "| "
            + " | ".join(_terminal_cell(format_cell(value, column.fmt)) for column, value in zip(table.columns, row))
            + " |"
        )
    return "\n".join(lines) + "\n"
