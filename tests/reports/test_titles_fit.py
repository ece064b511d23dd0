"""A long title is broken into lines that fit its figure: it never runs over the colour
bar or widens the figure past its size (which would shrink the figure on the page)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from sinkscope.reports.bars import IntervalSeries, interval_bar_chart
from sinkscope.reports.plots import DPI, heatmap

LONG = "softmax-1x1-d8-L32-seed0: anchor mass per head at non-trigger queries, over 2,000 test sequences of 32 tokens"


def png_width(path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


def test_a_long_heatmap_title_wraps_within_the_figure(tmp_path):
    fig = heatmap(np.full((1, 1), 0.5), tmp_path / "map.png", LONG, "anchor mass", "head", "layer")
    assert (
        png_width(tmp_path / "map.png") <= (fig.get_figwidth() + 0.2) * DPI + 2
    )  # bbox_inches="tight" pads 0.1 in a side
    title = fig.axes[0].get_title()
    assert "\n" in title and title.replace("\n", " ") == LONG


def test_a_long_bar_chart_title_wraps_within_the_figure(tmp_path):
    series = IntervalSeries("effect", [0.5, 0.2], [0.4, 0.1], [0.6, 0.3])
    fig = interval_bar_chart(["a", "b"], [series], tmp_path / "bars.png", LONG + LONG, "effect")
    assert (
        png_width(tmp_path / "bars.png") <= (fig.get_figwidth() + 0.2) * DPI + 2
    )  # bbox_inches="tight" pads 0.1 in a side


@pytest.mark.parametrize("title", ["W" * 200, "注意力汇聚" * 30], ids=["wide-letters", "cjk"])
def test_titles_are_wrapped_by_their_drawn_width_not_their_length(tmp_path, title, recwarn):
    """Wide letters and CJK glyphs take more room than an average character: the lines are
    measured as drawn. Glyphs the fonts lack draw as boxes without a warning per glyph."""
    fig = heatmap(np.full((1, 1), 0.5), tmp_path / "map.png", title, "anchor mass", "head", "layer")
    assert png_width(tmp_path / "map.png") <= (fig.get_figwidth() + 0.2) * DPI + 2
    assert not [w for w in recwarn if "missing from font" in str(w.message)]
