"""The trade-off figure's point labels, as the renderer lays them out on the stored toy
trade-off (crowded points near BOS mass 1): no label overlaps another label or any point's
marker, and every label lies inside the axes (none across the frame at BOS mass 1)."""

from __future__ import annotations

import shutil
from pathlib import Path

from matplotlib.transforms import Bbox

from sinkscope.infra.codec import read_result
from sinkscope.toy.tradeoff import TRADEOFF_FILE, TradeoffResult, label_box, tradeoff_figure

STORED = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06" / "toy-tradeoff"


def test_labels_clear_each_other_the_markers_and_the_frame(tmp_path):
    shutil.copytree(STORED, tmp_path / "tt")
    result = read_result(tmp_path / "tt" / TRADEOFF_FILE, TradeoffResult, "")
    figure = tradeoff_figure({name: list(points) for name, points in result.series.items()})
    renderer = figure.canvas.get_renderer()
    ax = figure.axes[0]
    labels = [text for text in ax.texts if text.get_visible() and text.get_text()]
    assert len(labels) == sum(len(points) for points in result.series.values())
    boxes = [label_box(text, renderer) for text in labels]  # the text, not its line back to the point
    frame = ax.get_window_extent(renderer)
    radius = 3.0 * figure.dpi / 72  # a marker's radius (6 pt across), less a little antialiasing
    markers = [
        Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)
        for x, y in (ax.transData.transform(text.xy) for text in labels)
    ]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert not [(box, m) for box in boxes for m in markers if box.overlaps(m)]
    assert all(frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1 for box in boxes)
