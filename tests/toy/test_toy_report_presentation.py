"""How toy reports read: the paper cited in every medium, counts in the number they take,
unset settings shown as their defaults, ranges whose ends agree shown once, Markdown
escaped only where Markdown needs it, and a trade-off figure whose series and labels
cannot be confused."""

from __future__ import annotations

import math

import pytest
from matplotlib.colors import to_hex

from sinkscope.reporting import report
from sinkscope.reports.document import config_value
from sinkscope.reports.formatting import plural, value_range
from sinkscope.reports.markdown import md_escape
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.display import citation_html
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.paper_reference import PAPER_CITATION
from sinkscope.toy.report_blocks import citation_section, model_block, training_block
from sinkscope.toy.run_dir import TrainConfig
from sinkscope.toy.sweep_cells import SweepRow
from sinkscope.toy.tables import sweep_tables
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tradeoff import (
    CONSTRUCTION_SERIES,
    RELU_SERIES,
    RUN_SERIES_SUFFIX,
    construction_curve,
    measure_tradeoff,
    plot_tradeoff,
    query_scale_curve,
    tradeoff_figure,
    write_tradeoff,
)

TASK = TaskConfig(d_model=8, seq_len=8, eval_trigger_position=7)


def test_the_citation_names_author_year_title_arxiv_id_and_link():
    for part in (
        "Ran-Milo (2026)",
        "Attention Sinks Are Provably Necessary in Softmax Transformers: Evidence from Trigger-Conditional Tasks",
        "arXiv 2603.11487",
        "https://arxiv.org/abs/2603.11487",
    ):
        assert part in PAPER_CITATION
    assert PAPER_CITATION in citation_section().blocks[0].text  # type: ignore[union-attr]
    assert "arxiv.org/abs/2603.11487" in citation_html()


@pytest.fixture(scope="module")
def tradeoff_report(tmp_path_factory):
    """A trade-off directory (the two constructions only: no training) and its report."""
    out = tmp_path_factory.mktemp("tradeoff")
    write_tradeoff(out / "run", task=TASK, n_sequences=16)
    return report(out / "run", out=out / "report")


def test_a_toy_report_cites_the_paper_in_html_and_markdown(tradeoff_report):
    html = tradeoff_report.html.read_text(encoding="utf-8")
    markdown = tradeoff_report.markdown.read_text(encoding="utf-8")
    assert "Ran-Milo (2026)" in html and "https://arxiv.org/abs/2603.11487" in html
    assert "Ran-Milo (2026)" in markdown and "https://arxiv.org/abs/2603.11487" in markdown
    assert "## Reference" in markdown


def test_report_markdown_is_not_overescaped(tradeoff_report):
    markdown = tradeoff_report.markdown.read_text(encoding="utf-8")
    for needless in ("\\(", "\\)", "\\_", "\\+", "\\.", "\\!", "\\#"):
        assert needless not in markdown, needless
    assert "anchor_mass_default" in markdown


def test_md_escape_still_guards_what_markdown_reads_as_markup():
    assert md_escape("a|b") == "a\\|b"
    assert md_escape("[x](y)") == "\\[x\\](y)"
    assert md_escape("<script>") == "&lt;script>"  # no tag can open without its "<"
    assert md_escape("> quote, x >= 0.9 & y, &lt;") == "\\> quote, x >= 0.9 & y, &amp;lt;"
    assert md_escape("*bold* `code`") == "\\*bold\\* \\`code\\`"
    assert md_escape("# not a heading") == "\\# not a heading"
    assert md_escape("- not a list") == "\\- not a list"
    assert md_escape("1. not a list") == "1\\. not a list"
    assert md_escape("_em_ but anchor_mass") == "\\_em\\_ but anchor_mass"
    assert md_escape("-0.5 and 2.5e-04 (n = 3)") == "-0.5 and 2.5e-04 (n = 3)"


def test_counts_take_the_number_of_their_noun():
    assert plural(1, "seed") == "1 seed"
    assert plural(2, "seed") == "2 seeds"
    assert plural(0, "model") == "0 models"
    assert plural(1_000, "step") == "1,000 steps"
    assert plural(2, "query", "queries") == "2 queries"


def test_a_range_whose_ends_agree_is_one_value():
    assert value_range(2.5e-4, 2.5e-4, ".1e") == "2.5e-04"
    assert value_range(2.5e-4, 2.51e-4, ".1e") == "2.5e-04"  # equal as printed
    assert value_range(1.0, 3.0, ".0f") == "1\u20133"
    row = SweepRow("relu", 1, 1, 8, 8, 1, 1, 900.0, 1.0, 0.0, 0.0, 0, steps_range=(900, 900))
    (table,) = sweep_tables([row])
    steps = table.rows[0][[column.header for column in table.columns].index("steps over seeds")]
    assert steps == "900"


def test_unset_settings_show_their_default_not_none():
    assert config_value(None) == "\u2013"
    assert config_value((8, 16)) == "8, 16"
    assert config_value((False, True)) == "off, on"
    model = ToyModelConfig(n_layers=2, d_model=8, seq_len=8)
    shown = dict(model_block("Model", model).items)
    assert shown["d_head"] == "default (d_model = 8)"
    assert shown["d_mlp"] == "default (4 x d_model = 32)"
    assert shown["residual"].startswith("default (on")
    assert dict(training_block("Training", TrainConfig(), model).items)["lr"] == "default (0.0001 for this depth)"
    assert not any("None" in value for _, value in model_block("Model", model).items)


@pytest.fixture(scope="module")
def drawn_tradeoff(tmp_path_factory):
    series = {
        CONSTRUCTION_SERIES: construction_curve(TASK, (0.0, 1.0, 2.0, 8.0), 16),
        RELU_SERIES: [measure_tradeoff(relu_exact_model(TASK), TASK, 16, label="relu construction")],
        "softmax-1x1-seed0" + RUN_SERIES_SUFFIX: query_scale_curve(
            softmax_scaled_model(TASK, 8.0), TASK, (0.0, 0.5, 1.0, 2.0), 16
        ),
    }
    plot_tradeoff(series, tmp_path_factory.mktemp("plot") / "tradeoff.png")  # writes what it draws
    return series, tradeoff_figure(series)


def test_tradeoff_series_have_distinct_colours_and_their_labels_share_them(drawn_tradeoff):
    series, figure = drawn_tradeoff
    axes = figure.axes[0]
    lines = [line for line in axes.get_lines() if line.get_label() and not line.get_label().startswith("_")]
    colours = [to_hex(line.get_color()) for line in lines]
    assert len(lines) == len(series) and len(set(colours)) == len(colours)
    annotations = [text for text in axes.texts if text.get_text()]
    assert {to_hex(text.get_color()) for text in annotations} <= set(colours)
    assert all(to_hex(text.get_color()) != "#000000" for text in annotations)


def test_every_tradeoff_point_is_labelled_once_and_no_label_has_two_meanings(drawn_tradeoff):
    series, figure = drawn_tradeoff
    labels = [text.get_text() for text in figure.axes[0].texts if text.get_visible() and text.get_text()]
    assert len(labels) == sum(len(points) for points in series.values())  # every point, none hidden
    assert len(set(labels)) == len(labels)  # scale 1 and W_Q x 1 read differently
    assert "s=1" in labels and "\u00d71" in labels
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert len(set(legend)) == len(legend) == len(series)


def test_tradeoff_labels_do_not_overlap(drawn_tradeoff):
    _, figure = drawn_tradeoff
    renderer = figure.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in figure.axes[0].texts if text.get_visible()]
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert not overlapping
    assert not any(math.isnan(box.x0) for box in boxes)
