"""The comparison of a 6-layer and a 30-layer model in a browser: its report says each model
was drawn at its own measured layers (6 and 30 markers, counted on the figure that was
embedded), and no table is wider than the page without its own scroll, in the report and in
the notebook display (the per-layer grid of 30 layers and the DataFrame keep every column
and row, scrolling inside their box)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from browser import Chromium, find_chromium
from sinkscope.cli import main
from sinkscope.pretrained_analysis.compare import read_comparison
from sinkscope.pretrained_analysis.compare_figures import layer_figure
from sinkscope.reporting import report
from tiny_models import build_tiny_gpt2

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")
PROMPTS = [
    "The first token collects attention that has nowhere else to go.",
    "Sinks appear in softmax attention because every row must sum to one.",
]
NARROW = 760  # px: narrower than the widest tables, so they must scroll in their own box

# every table whose content is wider than its box sits in a box that scrolls sideways, and
# the page itself never scrolls sideways
TABLES_SCROLL = """(() => {
  const bad = [];
  for (const table of document.querySelectorAll('table')) {
    let box = table;
    while (box && box !== document.body) {
      const style = getComputedStyle(box);
      if (['auto', 'scroll'].includes(style.overflowX) && box.scrollWidth > box.clientWidth - 1) break;
      box = box.parentElement;
    }
    const fits = table.getBoundingClientRect().right <= document.documentElement.clientWidth + 1;
    if (!fits && (!box || box === document.body)) bad.push(table.querySelector('caption')?.textContent || table.className);
  }
  return {bad, page: document.documentElement.scrollWidth - document.documentElement.clientWidth};
})()"""


@pytest.fixture(scope="module")
def comparison_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    audits = []
    for depth in (6, 30):
        model = build_tiny_gpt2(root / f"gpt2-{depth}", n_layer=depth, n_embd=16)
        argv = ["audit", str(model), "--out", str(root / f"audit-{depth}"), "--prompts", str(root / "prompts.txt")]
        assert main([*argv, "--examples", "0", "--no-progress", "--json"]) == 0
        audits.append(str(root / f"audit-{depth}"))
    assert main(["compare", *audits, "--out", str(root / "cmp"), "--json"]) == 0
    return root / "cmp"


def test_the_report_says_each_model_is_drawn_at_its_measured_layers(comparison_dir, tmp_path):
    comparison = read_comparison(comparison_dir)
    ax = layer_figure(comparison, tmp_path / "layers.png").axes[0]
    assert sorted(int(np.isfinite(np.asarray(line.get_ydata(), float)).sum()) for line in ax.lines) == [6, 30]
    written = report(comparison_dir, tmp_path / "report")
    page = written.html.read_text(encoding="utf-8")
    assert "one marker per measured layer at relative depth" in page
    assert "gpt2-6 6, gpt2-30 30 layers" in page


@needs_chromium
def test_no_table_is_wider_than_the_page_without_its_own_scroll(comparison_dir, tmp_path):
    written = report(comparison_dir, tmp_path / "report")
    comparison = read_comparison(comparison_dir)
    notebook = tmp_path / "notebook.html"  # the inline display, as a notebook's output area holds it
    notebook.write_text(f"<!DOCTYPE html><html><body>{comparison._repr_html_()}</body></html>", encoding="utf-8")
    with Chromium() as browser:
        for path in (written.html, notebook):
            page = browser.open(path, width=NARROW)
            state = page.evaluate(TABLES_SCROLL)
            assert state["bad"] == [] and state["page"] <= 0, (path.name, state)
            page.screenshot(tmp_path / f"{path.stem}.png", height=1400)
        grid_columns = page.evaluate("document.querySelector('table.grid thead tr').cells.length")
        assert grid_columns == 1 + 30  # the label column and every layer of the 30-layer model: none cut
        assert page.evaluate("getComputedStyle(document.querySelector('table.grid')).overflowX") == "auto"
