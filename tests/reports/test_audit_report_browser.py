"""The audit report as a reader sees it, in Debian's headless chromium: every sink head
outlined on a 30 x 9 map, heatmaps of the strongest sink heads, an ablation chart with
whiskers and a control that can be seen, no interval from a single prompt, and a long
per-head table that opens with the sink heads, filters, sorts and scrolls in its box."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from browser import Chromium, find_chromium, pixels
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, write_audit
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.reporting import report
from sinkscope.reports.document import Column, Figure, HeadMaps, ReportDocument, Section, Table
from sinkscope.reports.html import render_html
from sinkscope.reports.plots import draw_head_maps
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)


def boxes(points: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """Connected groups of pixels (8-neighbours) as (x0, y0, x1, y1)."""
    left, found = set(points), []
    while left:
        stack = [left.pop()]
        xs, ys = [], []
        while stack:
            x, y = stack.pop()
            xs.append(x)
            ys.append(y)
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    if (x + dx, y + dy) in left:
                        left.remove((x + dx, y + dy))
                        stack.append((x + dx, y + dy))
        found.append((min(xs), min(ys), max(xs), max(ys)))
    return found


@pytest.fixture(scope="module")
def browser():
    with Chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Reports of two tiny audits with ablations: six prompts (enough for intervals), and a single prompt."""
    root = tmp_path_factory.mktemp("audits")
    loaded = load_model(LoadSpec(str(build_tiny_gpt2(root / "tiny-gpt2", bos_sink_head=(0, 0)))), progress=False)
    config = AuditConfig(ablate=True, n_examples=1, batch_size=4, n_bootstrap=200)
    pages = {}
    six = [*TINY_GPT2_PROMPTS, *(prompt.lower() for prompt in TINY_GPT2_PROMPTS)]
    for name, prompts in (("six", six), ("one", TINY_GPT2_PROMPTS[:1])):
        write_audit(audit(loaded, prompts, config, progress=False), root / name)
        pages[name] = report(root / name).html
    return pages


def test_every_sink_head_is_outlined_on_a_30x9_map(browser, tmp_path):
    rng = np.random.default_rng(0)
    values = rng.uniform(0.0, 0.85, (30, 9))
    sinks = frozenset((layer, (2 * layer) % 9) for layer in range(27))  # none side by side
    for layer, head in sinks:
        values[layer, head] = rng.uniform(0.9, 1.0)
    maps = HeadMaps(
        "SmolLM2-sized map", "anchor mass", (("", tuple(map(tuple, values.tolist()))),), (sinks,), "sink heads"
    )
    draw_head_maps(maps, tmp_path / "map.png")
    page_path = tmp_path / "map.html"
    figure = Figure(tmp_path / "map.png", "anchor mass per layer and head", tmp_path)
    page_path.write_text(render_html(ReportDocument("map", "", (), (Section("Sink map", (figure,)),))))
    page = browser.open(page_path)
    _, _, outline = pixels(page, "anchor mass per layer and head", "#0a6cff", tol=30)
    found = [box for box in boxes(outline) if box[2] - box[0] > 30]  # cells, not the legend's swatch
    assert len(found) == 27
    widths = {box[2] - box[0] for box in found}
    assert max(widths) - min(widths) <= 3  # one cell each


def test_heatmaps_include_the_top_sink_heads_by_anchor_mass(browser, reports):
    page = browser.open(reports["six"])
    top = page.evaluate(
        "(() => { const t = Array.from(document.querySelectorAll('table')).find(t => t.caption"
        " && t.caption.textContent === 'Per head'); const r = t.tBodies[0].rows[0];"
        " return [r.className, 'L' + r.cells[0].textContent + 'H' + r.cells[1].textContent]; })()"
    )
    assert top == ["marked", "L0H0"]
    captions = page.evaluate(
        "Array.from(document.querySelectorAll('figcaption')).map(f => f.textContent).filter(t => t.includes('attention on prompt'))"
    )
    assert captions and all(f"({top[1]})" in text and "for contrast, " in text for text in captions)


def test_the_ablation_chart_has_whiskers_and_a_visible_control(browser, reports):
    page = browser.open(reports["six"])
    alt = "removing sinks vs the matched control"
    width, height, control = pixels(page, alt, "#5c7cfa", tol=12)
    assert sum(1 for x, _ in control if x > width * 0.55) >= 40  # the control's bars, on their own panel
    _, _, whiskers = pixels(page, alt, "#1d2330", tol=40, bluish=True)
    whiskers = [(x, y) for x, y in whiskers if y < height * 0.85]
    assert sum(1 for x, _ in whiskers if x < width * 0.5) >= 6 and sum(1 for x, _ in whiskers if x > width * 0.55) >= 6
    text = page.evaluate("document.body.innerText")
    assert "matched control (right, on its own scale)" in text and "95% bootstrap intervals over 6 inputs" in text


def test_no_report_shows_an_interval_from_one_prompt(browser, reports):
    page = browser.open(reports["one"])
    text = page.evaluate("document.body.innerText")
    assert "n = 1, no interval" in text
    # the one interval allowed is the key-geometry table's, over heads (its units), which it says
    over_prompts = text.replace("95% CI low\t95% CI high\tn heads", "")
    assert "95% CI" not in over_prompts and not re.search(r"\b1 prompts\b", text)
    markdown = Path(reports["one"]).with_suffix(".md").read_text(encoding="utf-8")
    assert "bootstrap over heads" in markdown
    assert "95% CI" not in markdown.replace("| 95% CI low | 95% CI high | n heads |", "")
    assert "n = 1, no interval" in markdown


def test_a_long_table_opens_with_sink_heads_filters_sorts_and_scrolls(browser, tmp_path):
    rows = tuple((layer, head, 0.95 if (layer + head) % 10 == 0 else 0.1) for layer in range(30) for head in range(9))
    marked = frozenset(k for k, row in enumerate(rows) if row[2] > 0.9)
    table = Table(
        "Per head",
        (Column("layer", numeric=True), Column("head", numeric=True), Column("anchor_mass", ".2f", numeric=True)),
        rows,
        marked=marked,
        marked_label="sink heads",
    )
    path = tmp_path / "table.html"
    path.write_text(render_html(ReportDocument("t", "", (), (Section("Heads", (table,)),))))
    page = browser.open(path)
    box = page.evaluate(
        "(() => { const w = document.querySelector('.table-wrap.scroll'); return [w.clientHeight, w.scrollHeight]; })()"
    )
    assert box[0] <= 520 < box[1]
    visible = "Array.from(document.querySelectorAll('#heads-table-0 tbody tr')).filter(r => !r.hidden).length"
    page.click(".table-tools input[type=checkbox]")
    assert page.evaluate(visible) == len(marked)
    page.click(".table-tools input[type=checkbox]")
    assert page.evaluate(visible) == 270
    page.click("#heads-table-0 thead th:nth-child(3)")
    page.click("#heads-table-0 thead th:nth-child(3)")
    first = page.evaluate("document.querySelector('#heads-table-0 tbody tr').className")
    assert first == "marked"  # sorted by anchor mass, descending: a sink head on top
    assert page.events.errors() == []
