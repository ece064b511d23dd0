"""Markdown, the one stack: ``render_markdown`` draws a ``ReportDocument`` (for a
notebook, a pull request or an issue) and ``table_markdown`` one table (also for the
Markdown files a command writes beside its JSON, e.g. ``comparison.md``).

Same findings, tables and figures as the HTML page; figures are linked by relative
path instead of embedded. Every string is escaped by the one Markdown escaper,
``md_escape``: ``<`` becomes an entity (so a prompt such as ``<script>`` stays text in
renderers that allow HTML) and what Markdown would read as markup is
backslash-escaped (so a file name cannot open a link or break a table), and nothing more,
so the file stays readable as text.
"""

from __future__ import annotations

import re
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
from sinkscope.reports.text import terminal_text

# always special: an escape, code, emphasis, a link's brackets, a table's cell border,
# strikethrough. ``(``/``)`` are safe once ``[``/``]`` are escaped, and ``_`` inside a word
# (``anchor_mass``) opens no emphasis, so neither is escaped
MARKDOWN_SPECIAL = "\\`*[]|~"
# what makes a line a heading, list item, rule or setext underline when it starts one
LINE_START = re.compile(r"^(\s*)(#|=|>|\+(?=\s|$)|-(?=[\s-]|$))")
NUMBERED = re.compile(r"^(\s*\d+)([.)])(?=\s|$)")
# an ampersand that would start a character reference (``&lt;``, ``&#60;``): only it changes
ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
LONE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def md_escape(text: str) -> str:
    """Text safe inside a Markdown paragraph or table cell (one line): ``<`` becomes
    ``&lt;`` (a prompt such as ``<script>`` stays text where HTML is allowed; without it no
    tag can open, so ``>`` stays as written) and an ``&`` that would start an entity
    ``&amp;``; only what Markdown reads as markup is backslash-escaped: ``MARKDOWN_SPECIAL``,
    an underscore at a word's edge, and a leading ``#``, ``=``, ``>``, list marker
    ``+ ``/``- `` or ``1.``."""
    text = " ".join(ENTITY.sub("&amp;", text).replace("<", "&lt;").splitlines())
    text = terminal_text(text)  # a terminal escape in a prompt would act in `cat report.md`: shown as \x1b
    text = "".join("\\" + ch if ch in MARKDOWN_SPECIAL else ch for ch in text)
    text = LONE_UNDERSCORE.sub(r"\\_", text)
    text = LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)
    return NUMBERED.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


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
