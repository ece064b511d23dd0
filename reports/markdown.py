"""Markdown, the one stack: ``render_markdown`` draws a ``ReportDocument`` (for a
notebook, a pull request or an issue) and ``table_markdown`` one table (also for the
Markdown files a command writes beside its JSON, e.g. ``comparison.md``).

Same findings, tables and figures as the HTML page; figures are linked by relative
path instead of embedded. Every string is escaped by the one Markdown escaper,
``md_escape``: ``&``, ``<`` and ``>`` become entities (so a prompt such as ``<script>``
stays text in renderers that allow HTML) and Markdown's punctuation is backslash-escaped
(so a file name cannot open a link or break a table).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sinkscope.reports.document import (
    Block,
    Bullets,
    Details,
    Figure,
    KeyValues,
    Paragraph,
    ReportDocument,
    Table,
    format_cell,
)

MARKDOWN_SPECIAL = "\\`*_[]{}()#+!|~"


def md_escape(text: str) -> str:
    """Text safe inside a Markdown paragraph or table cell (one line)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = "".join("\\" + ch if ch in MARKDOWN_SPECIAL else ch for ch in text)
    return " ".join(text.splitlines())


def _link_target(link: str) -> str:
    """A relative link usable in ``![...](...)`` even with spaces or parentheses."""
    return "<" + link.replace("<", "%3C").replace(">", "%3E") + ">"


def table_markdown(table: Table) -> str:
    """The table under its bold caption, its note below."""
    lines = [f"**{md_escape(table.caption)}**", ""] if table.caption else []
    lines.append("| " + " | ".join(md_escape(column.header) for column in table.columns) + " |")
    lines.append("|" + "".join("---:|" if column.numeric else "---|" for column in table.columns))
    for row in table.rows:
        cells = (md_escape(format_cell(value, column.fmt)) for column, value in zip(table.columns, row))
        lines.append("| " + " | ".join(cells) + " |")
    if table.note:
        lines += ["", md_escape(table.note)]
    return "\n".join(lines)


def _block(block: Block, link: Callable[[Path], str]) -> str:
    if isinstance(block, Paragraph):
        return md_escape(block.text)
    if isinstance(block, Bullets):
        return "\n".join(f"- {md_escape(item)}" for item in block.items)
    if isinstance(block, Details):  # Markdown has no folding everywhere: the whole list
        return f"**{md_escape(block.summary)}:** " + md_escape(", ".join(block.items))
    if isinstance(block, Table):
        return table_markdown(block)
    if isinstance(block, Figure):
        return f"![{md_escape(block.caption)}]({_link_target(link(block.real_path()))})"
    if isinstance(block, KeyValues):
        rows = [f"**{md_escape(block.caption)}**", "", "| | |", "|---|---|"]
        rows += [f"| {md_escape(key)} | {md_escape(value)} |" for key, value in block.items]
        return "\n".join(rows)
    raise TypeError(f"unknown report block {type(block).__name__}")


def render_markdown(document: ReportDocument, link: Callable[[Path], str], footer: str = "") -> str:
    """The document as Markdown; ``link(figure_path)`` gives each figure's relative link."""
    parts = [f"# {md_escape(document.title)}", md_escape(document.subtitle), "## Summary of findings"]
    parts.append("\n".join(f"- {md_escape(item)}" for item in document.findings))
    for section in document.sections:
        parts.append(f"## {md_escape(section.title)}")
        parts += [_block(block, link) for block in section.blocks]
    if footer:
        parts.append(f"_{md_escape(footer)}_")
    return "\n\n".join(parts) + "\n"
