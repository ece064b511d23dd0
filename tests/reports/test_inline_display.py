"""Results show themselves in a notebook (``_repr_html_``): escaped, with the numbers of
the result they show, and rendered by a real browser without scripts or errors."""

from __future__ import annotations

import html
import re

import pytest

from browser import Chromium, find_chromium
from sinkscope.infra.codec import read_result
from sinkscope.pretrained_analysis.audit import AuditConfig, audit
from sinkscope.pretrained_analysis.compare import compare_audits
from sinkscope.pretrained_analysis.findings import audit_findings
from sinkscope.pretrained_analysis.loading import LoadSpec
from sinkscope.toy.constructions import softmax_scaled_model
from sinkscope.toy.evaluate import evaluate_run
from sinkscope.toy.patching import trigger_patching
from sinkscope.toy.reproduce import ReproduceConfig, ReproduceSummary, reproduce
from sinkscope.toy.task import TaskConfig
from tiny_models import build_tiny_gpt2

MARKUP = '<script>alert("sink")</script> & <b>bold</b>'
PROMPTS = [
    f"{MARKUP} is a prompt that tries to become markup.",
    "The first token collects <em>attention</em> that has nowhere else to go.",
    "Sinks appear in softmax attention because every <tr> row must sum to one.",
]


@pytest.fixture(scope="module")
def audits(tmp_path_factory):
    """Two audits of a tiny GPT-2 with a planted sink, one in a directory whose name is markup."""
    root = tmp_path_factory.mktemp("models")
    first = build_tiny_gpt2(root / "tiny-<i>gpt2", bos_sink_head=(0, 0))
    second = build_tiny_gpt2(root / "tiny-gpt2-b", bos_sink_head=(1, 1), seed=1)
    config = AuditConfig(n_examples=1, batch_size=2, ablate=True)
    return [audit(LoadSpec(str(path)), PROMPTS, config, progress=False) for path in (first, second)]


@pytest.fixture(scope="module")
def reproduction_dir(tmp_path_factory):
    config = ReproduceConfig(seeds=1, architectures=((1, 1), (2, 2)), max_steps=25, n_sequences=40, workers=1)
    out = tmp_path_factory.mktemp("repro") / "out"
    reproduce(config, out, progress=False)
    return out


@pytest.fixture(scope="module")
def reproduction(reproduction_dir):
    return read_result(reproduction_dir / "summary.json", ReproduceSummary)


def grid_cells(markup: str, caption_start: str) -> list[list[str]]:
    """The text of each body row's cells in the heat grid whose caption starts so."""
    grids = re.findall(r'<table class="grid"><caption>(.*?)</caption>.*?<tbody>(.*?)</tbody>', markup, re.S)
    body = next(body for caption, body in grids if html.unescape(caption).startswith(caption_start))
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_an_audit_shows_its_numbers_and_escapes_what_users_wrote(audits):
    result = audits[0]
    markup = result._repr_html_()
    assert "<script" not in markup.split("</style>", 1)[1] and "<b>bold" not in markup and "<i>gpt2" not in markup
    assert html.escape("tiny-<i>gpt2") in markup  # the model's name, in the title
    example = result.examples[0]  # every prompt holds markup, so its tokens do
    assert any("<" in token for token in example.tokens)
    code = re.search(r"<code>(.*?)</code>", markup).group(1)
    assert "<" not in code and html.unescape(code) == " | ".join(example.labels)  # the readable tokens
    cells = grid_cells(markup, "Anchor mass per head")
    assert len(cells) == result.model.n_layers
    for head in result.probe.heads:
        assert cells[head.layer][head.head] == f"{head.anchor_mass:.2f}"
    assert result.sink_heads() == [(0, 0)]
    grid = re.search(r'<table class="grid">.*?</table>', markup, re.S).group(0)
    rows = re.findall(r"<tr>(.*?)</tr>", grid.split("<tbody>")[1])
    outlined = [
        (layer, head)
        for layer, row in enumerate(rows)
        for head, cell in enumerate(re.findall(r"<td[^>]*>", row))
        if 'class="sink"' in cell
    ]
    assert outlined == result.sink_heads()
    assert f"{result.ablation.base_loss:.4f}" in markup
    for finding in audit_findings(result):
        assert html.escape(finding) in markup


def test_the_probe_and_the_comparison_show_their_own_numbers(audits):
    probe = audits[1].probe
    markup = probe._repr_html_()
    cells = grid_cells(markup, "Anchor mass per head")
    assert [[float(cell) for cell in row] for row in cells] == [
        [round(float(v), 2) for v in row] for row in probe.anchor_mass_matrix().tolist()
    ]
    comparison = compare_audits(audits)
    markup = comparison._repr_html_()
    layers = grid_cells(markup, "Anchor mass per layer")
    assert [[float(cell) for cell in row] for row in layers] == [
        [round(mass, 2) for mass in row.layer_anchor_mass] for row in comparison.rows
    ]
    assert "<i>" not in markup and html.escape("tiny-<i>gpt2") in markup


def test_toy_results_show_the_papers_checks_and_every_head(reproduction):
    markup = reproduction._repr_html_()
    passed = sum(check.passed for check in reproduction.checks)
    assert f"{passed} of {len(reproduction.checks)} checks" in markup
    rows = grid_cells(markup, "BOS mass over non-trigger queries")
    assert len(rows) == sum(m.n_layers for m in reproduction.models)
    shown = [float(cell) for row in rows for cell in row if cell != "\u2013"]
    assert shown == [round(h.anchor_mass, 2) for m in reproduction.models for h in m.heads]
    first = reproduction.models[0]
    rows = grid_cells(first._repr_html_(), "BOS mass over non-trigger queries")
    assert [float(cell) for row in rows for cell in row] == [round(h.anchor_mass, 2) for h in first.heads]


def test_an_evaluated_run_shows_its_heads(reproduction, reproduction_dir):
    evaluation = evaluate_run(reproduction_dir / reproduction.models[0].name, n_sequences=200, write_figures=False)
    markup = evaluation._repr_html_()
    rows = grid_cells(markup, "BOS mass over non-trigger queries")
    assert [float(cell) for row in rows for cell in row] == [round(h.anchor_mass, 2) for h in evaluation.heads]
    assert f"{evaluation.heldout_mse:.2e}" in markup
    assert evaluation.to_dataframe()["anchor_mass"].tolist() == [h.anchor_mass for h in evaluation.heads]


def test_patching_shows_its_effect_map():
    task = TaskConfig()
    result = trigger_patching(softmax_scaled_model(task, 10.0), task, n_inputs=16)
    markup = result.per_position._repr_html_()
    rows = grid_cells(markup, "Normalised effect")
    assert [float(cell) for cell in rows[0]] == [round(v, 2) + 0.0 for v in result.per_position.matrix()[0].tolist()]
    assert f"{result.per_position.rows[0].layer}" in markup and "resid_pre" in markup


@pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_the_displays_render_in_a_browser_without_scripts(audits, reproduction, tmp_path):
    fragments = {
        "audit": audits[0]._repr_html_(),
        "probe": audits[0].probe._repr_html_(),
        "comparison": compare_audits(audits)._repr_html_(),
        "reproduction": reproduction._repr_html_(),
        "default state": audits[0].ablation.default_state._repr_html_(),
        "patching": trigger_patching(softmax_scaled_model(TaskConfig(), 10.0), TaskConfig(), 16).per_head._repr_html_(),
    }
    page_path = tmp_path / "notebook.html"
    page_path.write_text(
        "<!doctype html><meta charset='utf-8'><body>"
        + "".join(f"<section data-kind='{kind}'>{markup}</section>" for kind, markup in fragments.items()),
        encoding="utf-8",
    )
    with Chromium() as browser:
        page = browser.open(page_path)
        page.settle()
        assert page.events.errors() == [] and page.events.dialogs == []
        assert page.evaluate("document.scripts.length") == 0
        assert (
            page.evaluate("document.querySelector('h3').innerText") == f"Attention-sink audit: {audits[0].model.label}"
        )
        assert "<i>" in audits[0].model.label  # shown as text, not as markup
        tokens = " | ".join(audits[0].examples[0].labels)
        assert page.evaluate("document.querySelector('code').innerText") == tokens
        # every grid cell is drawn at a readable size: at least 11 px text, 30 px wide
        sizes = page.evaluate(
            "Array.from(document.querySelectorAll('table.grid td')).map(td => "
            "[parseFloat(getComputedStyle(td).fontSize), td.getBoundingClientRect().width])"
        )
        assert sizes and all(font >= 11 and width >= 30 for font, width in sizes), sizes[:5]
        for kind in fragments:
            height = page.evaluate(f"document.querySelector(\"section[data-kind='{kind}']\").offsetHeight")
            assert height > 60, kind


def test_cells_format_numpy_and_torch_scalars_as_numbers():
    import numpy as np
    import torch

    from sinkscope.reports.document import Column, Table
    from sinkscope.reports.formatting import format_cell
    from sinkscope.reports.html import inline_table

    assert [format_cell(v, ".3f") for v in (np.float32("nan"), np.float32(0.5), torch.tensor(2.0))] == [
        "\u2013",
        "0.500",
        "2.000",
    ]
    assert format_cell(np.bool_(True)) == "yes"
    assert '<td class="num">0.25</td>' in inline_table(
        Table("", (Column("a", ".2f", numeric=True),), ((np.float64(0.25),),))
    )
