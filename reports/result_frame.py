"""The DataFrame every ``to_dataframe()`` returns: a plain pandas DataFrame whose notebook
display shows every column and every row (up to ``MAX_SHOWN_ROWS``) in a box that scrolls,
instead of pandas' default display, which silently drops the middle rows past 60 and the
middle columns past 20 (a 30-layer model's table would lose layers 5 to 24).

Frames derived from it (``groupby``, ``concat``, selections) keep the class, so they display
the same way. Imported only when a DataFrame is made: pandas never loads with sinkscope.
"""

from __future__ import annotations

import html

import pandas

MAX_SHOWN_ROWS = 5000  # beyond this a notebook would stall; the display says what it left out
BOX_STYLE = (
    "max-height: 420px; max-width: 100%; overflow: auto; border: 1px solid #d9dde5; scrollbar-color: #9aa3b2 #eef1f6;"
)


class ResultFrame(pandas.DataFrame):
    """A DataFrame shown whole in a notebook (see the module docstring)."""

    @property
    def _constructor(self) -> type[ResultFrame]:
        return ResultFrame

    def _repr_html_(self) -> str:
        shown = self if len(self) <= MAX_SHOWN_ROWS else self.head(MAX_SHOWN_ROWS)
        with pandas.option_context("display.max_colwidth", None):
            table = shown.to_html(max_rows=None, max_cols=None, show_dimensions=False, notebook=True)
        left_out = (
            f"; the first {MAX_SHOWN_ROWS:,} rows are shown, the other {len(self) - MAX_SHOWN_ROWS:,} are not "
            "(use .iloc or .to_csv to see them)"
            if len(self) > MAX_SHOWN_ROWS
            else ""
        )
        size = html.escape(f"{len(self):,} rows x {len(self.columns)} columns{left_out}")
        return f'<div style="{BOX_STYLE}">{table}</div><p style="font-size: 12px; color: #5b6473;">{size}</p>'
