"""The plain-text media and their one escaper each: CSV (formula injection) and the
terminal (control characters, table shape)."""

from __future__ import annotations

import csv
import io

from sinkscope.cli.args import say
from sinkscope.reports.document import Column, Table
from sinkscope.reports.text import csv_cell, table_csv, table_terminal, terminal_text

HOSTILE = Table(
    "hostile",
    (Column("name"), Column("value", ".2f", numeric=True)),
    (("a|b\nc\x1b[2J", 1.0), ('=HYPERLINK("x")', -0.5), ("-0.25", float("nan"))),
)


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted_and_numbers_are_not():
    assert [csv_cell(v) for v in ("=1+1", "+cmd", "-cmd", "@x", "\tx", "-0.5", "+2", "plain", -3.0)] == [
        "'=1+1", "'+cmd", "'-cmd", "'@x", "'\tx", "-0.5", "+2", "plain", -3.0,
    ]  # fmt: skip
    rows = list(csv.reader(io.StringIO(table_csv(HOSTILE))))
    assert rows[0] == ["name", "value"]
    assert rows[1] == ["a|b\nc\x1b[2J", "1.0"] and rows[2] == ['\'=HYPERLINK("x")', "-0.5"] and rows[3][0] == "-0.25"


def test_the_terminal_sees_no_control_character_and_tables_keep_their_shape(capsys):
    assert terminal_text("a\x1b[2Jb\x07\nc\té") == "a\\x1b[2Jb\\x07\nc\té"
    lines = table_terminal(HOSTILE).splitlines()
    assert len(lines) == 5 and all(line.count(" | ") == 1 for line in lines[2:])  # one separator per row
    assert lines[2] == "| a\\|b c\\x1b[2J | 1.00 |"
    say("model", "dir\x1b[2J")
    assert capsys.readouterr().out == "model dir\\x1b[2J\n"
