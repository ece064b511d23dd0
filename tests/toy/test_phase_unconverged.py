"""A sweep keeps configurations that stopped at the step cap apart from converged ones: on
the phase diagram (a hatched, labelled cell, named in the figure's alt text), in its
tables (a table of their own whose columns say "at cap"), in its bar charts (a series of
their own) and in its findings (never stated as a result)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from browser import Chromium, find_chromium
from sinkscope.infra.codec import write_result
from sinkscope.reporting import report
from sinkscope.toy.experiment import SUMMARY_FILE
from sinkscope.toy.sweep import SweepConfig, sweep
from sinkscope.toy.sweep_cells import Cell, SweepRow
from sinkscope.toy.sweep_findings import sweep_findings
from sinkscope.toy.sweep_plots import CAPPED_LABEL, draw_phase_diagram, figure_captions, sweep_plots
from sinkscope.toy.tables import CAPPED_SWEEP_TABLE, SWEEP_TABLE, sweep_tables

CONFIG = SweepConfig(
    seq_lens=(6,), d_models=(6,), layers=(1, 2), heads=(1,), attentions=("softmax",), seeds=2, max_steps=10, workers=1
)
CAPPED = "softmax 2x1 d6 L6"
PHASE = "phase_softmax_d6_L6.png"


@pytest.fixture(scope="module")
def capped_sweep(tmp_path_factory):
    """Four models of 10 steps: none converges. The 1x1 row is then marked converged (as
    a longer run would leave it) so the report has one finished and one capped cell; its
    figures and summary are written again from the rows, as the sweep writes them."""
    out = tmp_path_factory.mktemp("sweep") / "phase"
    result = sweep(CONFIG, out, progress=False)
    assert all(not row.finished for row in result.rows)  # 10 steps: every seed at the cap
    rows = [replace(row, converged=row.seeds) if row.n_layers == 1 else row for row in result.rows]
    result = replace(result, rows=rows, figures=sweep_plots(CONFIG, rows, out))
    write_result(out / SUMMARY_FILE, result)
    return out, result


def _row(result, layers: int) -> SweepRow:
    return next(row for row in result.rows if row.n_layers == layers)


def test_a_row_is_finished_only_when_every_seed_converged(capped_sweep):
    _, result = capped_sweep
    assert _row(result, 1).finished and _row(result, 1).status == "converged"
    capped = _row(result, 2)
    assert not capped.finished and capped.status == "at step cap (0/2 converged)"
    assert replace(capped, converged=1).status == "at step cap (1/2 converged)"


def test_capped_rows_get_a_table_of_their_own(capped_sweep):
    _, result = capped_sweep
    finished, capped = sweep_tables(result.rows)
    assert finished.caption == SWEEP_TABLE.caption and capped.caption == CAPPED_SWEEP_TABLE.caption
    assert [row[0] for row in finished.rows] == ["softmax 1x1 d6 L6"]
    assert [row[0] for row in capped.rows] == [CAPPED]
    assert capped.rows[0][1] == "at step cap (0/2 converged)"
    measured = [column.header for column in capped.columns[4:]]
    assert measured and all("at cap" in header for header in measured)
    assert "not results" in capped.caption and "step cap" in capped.note


def test_the_phase_diagram_hatches_and_labels_a_capped_cell(capped_sweep, tmp_path):
    _, result = capped_sweep
    fig = draw_phase_diagram(CONFIG, result.rows, Cell("softmax", 0, 0, 6, 6), tmp_path / "phase.png")
    texts = [text.get_text() for text in fig.axes[0].texts]
    assert "at step cap\n0/2 conv." in texts  # the capped 2x1 cell, instead of a value
    assert "nan" not in texts and sum(text.startswith("at step cap") for text in texts) == 1
    hatched = [patch for patch in fig.axes[0].patches if patch.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_xy() == (-0.5, 0.5)  # column 0 (1 head), row 1 (2 layers)


def test_captions_and_bars_say_which_configuration_is_at_the_cap(capped_sweep):
    out, result = capped_sweep
    captions = figure_captions(result.rows, result.figures)
    assert "at the step cap, not a result: 2x1 at step cap (0/2 converged)" in captions[PHASE]
    assert "1x1" not in captions[PHASE]
    assert CAPPED_LABEL in captions["steps_to_converge.png"]
    assert "steps to converge where it converged" in captions["steps_to_converge.png"]


def test_findings_never_state_a_capped_number_as_a_result(capped_sweep):
    _, result = capped_sweep
    findings = sweep_findings(result)
    softmax = next(finding for finding in findings if finding.startswith("softmax:"))
    assert "in 1 converged configuration," in softmax
    assert "At the step cap, not converged (numbers not a result): 2x1 d6 L6 (0/2 converged" in softmax
    assert "2 seeds (4 models)" in findings[0]
    everything_capped = replace(result, rows=[replace(row, converged=0) for row in result.rows])
    assert "no configuration converged, so there is no result" in sweep_findings(everything_capped)[1]


def test_unnormalised_kinds_are_explained_with_their_row_mass(capped_sweep):
    _, result = capped_sweep
    sigmoid = [replace(row, attention="sigmoid", mean_row_mass=0.5, sink_fraction=1.0) for row in result.rows]
    config = replace(result.config, attentions=("sigmoid",))
    findings = sweep_findings(replace(result, config=config, rows=sigmoid))
    assert "(a sink although this kind needs none)" in findings[1]
    assert "sink fraction 1.00 at the cap" in findings[1]
    assert "sigmoid rows are not normalised" in findings[2] and "mean row mass at default queries: 0.5" in findings[2]


needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")

MARKS = """(() => {
  const alt = Array.from(document.images).map(i => i.alt).find(a => a.startsWith('phase softmax')) || '';
  const tables = Array.from(document.querySelectorAll('table')).map(t => ({
    caption: t.caption ? t.caption.textContent : (t.previousElementSibling || {}).textContent || '',
    rows: Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells).map(c => c.textContent.trim())),
  }));
  return {alt, tables};
})()"""


@needs_chromium
def test_the_page_marks_the_capped_cell_on_its_map_and_in_its_table(capped_sweep, tmp_path):
    out, _ = capped_sweep
    report(out, out=tmp_path / "report")
    with Chromium() as browser:
        page = browser.open(tmp_path / "report" / "report.html")
        marks = page.evaluate(MARKS)
        assert not page.events.errors()
    assert "hatched grey cells, at the step cap, not a result: 2x1 at step cap (0/2 converged)" in marks["alt"]
    rows_by_caption = {
        table["caption"]: table["rows"] for table in marks["tables"] if table["rows"] and len(table["rows"][0]) > 2
    }
    capped = next(rows for caption, rows in rows_by_caption.items() if caption.startswith("At the step cap"))
    finished = next(rows for caption, rows in rows_by_caption.items() if caption.startswith("Converged"))
    assert [row[:2] for row in capped] == [[CAPPED, "at step cap (0/2 converged)"]]
    assert all(row[0] != CAPPED for row in finished)


def test_the_notebook_display_keeps_capped_rows_apart_and_cites_the_paper(capped_sweep):
    _, result = capped_sweep
    html = result._repr_html_()
    assert "At the step cap: configurations with a seed that did not converge" in html
    assert html.index("Converged configurations") < html.index(CAPPED) and "Ran-Milo (2026)" in html
