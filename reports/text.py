"""Tables as plain text: CSV for files and spreadsheets, and the terminal summary a
command prints. Neither is markup, so neither escapes: CSV quotes by the csv module's
rules, and the terminal shows text as it is."""

from __future__ import annotations

import csv
import io

from sinkscope.reports.document import Table, format_cell


def table_csv(table: Table, formatted: bool = False) -> str:
    """The table as CSV: a header of column names, then one line per row. Cells are the
    values themselves (full precision, empty where missing), or the displayed text when
    ``formatted``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(column.header for column in table.columns)
    for row in table.rows:
        writer.writerow(
            format_cell(value, column.fmt) if formatted else ("" if value is None else value)
            for column, value in zip(table.columns, row)
        )
    return buffer.getvalue()


def table_terminal(table: Table) -> str:
    """The table as a terminal prints it: a pipe table (which also reads as Markdown) of
    the displayed cells, numbers right-aligned."""
    lines = ["| " + " | ".join(column.header for column in table.columns) + " |"]
    lines.append("|" + "".join("---:|" if column.numeric else "---|" for column in table.columns))
    for row in table.rows:
        lines.append(
            "| " + " | ".join(format_cell(value, column.fmt) for column, value in zip(table.columns, row)) + " |"
        )
    return "\n".join(lines) + "\n"
