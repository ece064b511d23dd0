"""Reports at page width (1280 px): a wide table keeps its identifying columns in view
while the rest scrolls sideways, on the report page and in the notebook display; snake_case
headers may break after an underscore in HTML only."""

from __future__ import annotations

import pytest

from browser import Chromium, find_chromium
from sinkscope.probes.tables import HEAD_TABLE
from sinkscope.reports.document import Column, ReportDocument, Section, Table
from sinkscope.reports.html import fragment, inline_table, render_html, table_html
from sinkscope.reports.markdown import table_markdown
from sinkscope.toy.tables import MODEL_HEAD_TABLE

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")

WIDE = Table(
    "Per head",
    (
        Column("layer", numeric=True),
        Column("head", numeric=True),
        Column("anchor_mass", ".4f", numeric=True),
        *(Column(f"value_weighted_metric_{k}", ".3g", numeric=True) for k in range(20)),
    ),
    tuple(
        (layer, head, 0.5 + layer / 100, *(1234.5 + k for k in range(20))) for layer in range(30) for head in range(4)
    ),
    marked=frozenset({0, 5}),
    marked_label="sink heads",
    frozen=3,
)


def test_the_head_table_keeps_layer_head_and_anchor_mass_in_view():
    assert HEAD_TABLE.frozen == 3
    assert MODEL_HEAD_TABLE.frozen == 4  # the model column too
    first = tuple(column.name for column in HEAD_TABLE.columns[:3])
    assert first == ("layer", "head", "anchor_mass")


def test_dropping_an_empty_column_recounts_the_frozen_ones():
    table = Table("t", (Column("a"), Column("b"), Column("c"), Column("d")), (("x", None, 1, 2),), frozen=3)
    assert table.without_empty_columns().frozen == 2


def test_only_the_frozen_columns_are_sticky_and_markdown_is_unchanged():
    markup = table_html(WIDE)
    header = markup.split("<thead>")[1].split("</thead>")[0]
    assert header.count('class="fz ') == 3 and header.count("fz-last") == 1
    assert "value_<wbr>weighted_<wbr>metric_<wbr>0" in header
    markdown = table_markdown(WIDE)
    assert "value_weighted_metric_0" in markdown and "<wbr>" not in markdown and "fz" not in markdown


FROZEN_IN_VIEW = """(() => {
  const table = Array.from(document.querySelectorAll('table')).find(t => t.caption && t.caption.textContent === 'Per head');
  const box = table.closest('.table-wrap');
  box.scrollLeft = box.scrollWidth;
  const inside = box.getBoundingClientRect();
  const rects = Array.from(table.rows[1].cells).slice(0, 4).map(c => c.getBoundingClientRect());
  const heads = Array.from(table.tHead.rows[0].cells).slice(0, 3).map(c => c.getBoundingClientRect().left);
  return {scrolled: box.scrollLeft, box: [inside.left, inside.right],
          cells: rects.map(r => [r.left, r.right]), heads,
          texts: Array.from(table.rows[1].cells).slice(0, 3).map(c => [c.scrollWidth, c.clientWidth])};
})()"""


@needs_chromium
@pytest.mark.parametrize("medium", ["page", "notebook"])
def test_frozen_columns_stay_in_view_when_the_table_scrolls_to_its_end(medium, tmp_path):
    path = tmp_path / f"{medium}.html"
    if medium == "page":
        path.write_text(render_html(ReportDocument("t", "", (), (Section("Heads", (WIDE,)),))), encoding="utf-8")
    else:
        path.write_text(f"<!DOCTYPE html><html><body>{fragment('t', '', [inline_table(WIDE)])}</body></html>")
    with Chromium() as browser:
        state = browser.open(path, width=1280).evaluate(FROZEN_IN_VIEW)
    assert state["scrolled"] > 0  # the table is wider than the page
    left, right = state["box"]
    frozen, first_scrolled = state["cells"][:3], state["cells"][3]
    assert abs(frozen[0][0] - left) <= 2  # layer at the box's left edge
    for (_, a_right), (b_left, _) in zip(frozen, frozen[1:]):
        assert abs(a_right - b_left) <= 1  # side by side, neither under the other
    assert frozen[2][1] <= right and first_scrolled[0] < frozen[2][1]  # the scrolled column slid beneath
    assert [abs(h - c[0]) <= 1 for h, c in zip(state["heads"], frozen)] == [True] * 3  # headers above their cells
    assert all(scroll <= client for scroll, client in state["texts"])  # every number fits its fixed width
