"""Every sink map outlines every sink head, writes values wherever its cells hold them,
and says in a legend what the outline marks (``sinkscope.reports.plots.draw_head_maps``,
the one sink-map figure of every report)."""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle

from sinkscope.reports.document import HeadMaps
from sinkscope.reports.plots import OUTLINE_COLOUR, draw_head_maps

SINK_LABEL = "sink heads, anchor mass ≥ 0.9"


def smollm2_like(n_layers: int = 30, n_heads: int = 9, n_sinks: int = 27, seed: int = 0):
    """A synthetic 30 x 9 anchor-mass map (SmolLM2's shape) with ``n_sinks`` sink heads,
    no two of them side by side (so each outline is a box of its own on the image)."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.0, 0.85, (n_layers, n_heads))
    sinks = frozenset((layer, (2 * layer) % n_heads) for layer in range(n_sinks))
    for layer, head in sinks:
        values[layer, head] = rng.uniform(0.9, 1.0)
    return values, sinks


def head_maps(panels, marked, label: str = SINK_LABEL) -> HeadMaps:
    return HeadMaps(
        "anchor mass",
        "anchor mass",
        tuple((name, tuple(tuple(float(v) for v in row) for row in values)) for name, values in panels),
        tuple(marked),
        label,
    )


def outlined(fig) -> set[tuple[int, int]]:
    """The (row, column) cells outlined on any axes of ``fig``."""
    boxes = [patch for ax in fig.axes for patch in ax.patches if isinstance(patch, Rectangle) and not patch.fill]
    return {(round(box.get_y() + 0.5), round(box.get_x() + 0.5)) for box in boxes}


def cell_values(fig) -> list[str]:
    return [text.get_text() for ax in fig.axes for text in ax.texts]


def legend_texts(fig) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def test_every_sink_head_is_outlined_on_a_30x9_map_with_its_values(tmp_path):
    values, sinks = smollm2_like()
    fig = draw_head_maps(head_maps([("", values)], [sinks]), tmp_path / "map.png")
    assert outlined(fig) == set(sinks) and len(sinks) == 27
    texts = cell_values(fig)
    assert len(texts) == 30 * 9  # a value in every cell: 270 cells fit at this size
    assert f"{values[18, 0]:.2f}" in texts
    assert legend_texts(fig) == [f"outlined: {SINK_LABEL} (27)"]
    boxes = [patch for ax in fig.axes for patch in ax.patches if isinstance(patch, Rectangle) and not patch.fill]
    assert all(np.allclose(box.get_edgecolor()[:3], np.array([10, 108, 255]) / 255) for box in boxes)
    assert OUTLINE_COLOUR == "#0a6cff"


def test_cells_too_small_for_values_still_outline_and_explain(tmp_path):
    values = np.random.default_rng(1).uniform(0.0, 0.5, (4, 64))  # 64 heads: cells too narrow for a value
    sinks = frozenset({(0, 3), (2, 40), (3, 63)})
    values[[0, 2, 3], [3, 40, 63]] = 0.95
    fig = draw_head_maps(head_maps([("", values)], [sinks]), tmp_path / "wide.png")
    assert cell_values(fig) == []
    assert outlined(fig) == set(sinks)
    assert legend_texts(fig) == [f"outlined: {SINK_LABEL} (3)"]


def test_several_panels_outline_each_panel_s_own_sink_heads(tmp_path):
    big, big_sinks = smollm2_like()
    small = np.full((6, 12), 0.2)
    small[0, 0] = small[5, 11] = 0.99
    fig = draw_head_maps(
        head_maps([("MiniLM", small), ("SmolLM2", big)], [frozenset({(0, 0), (5, 11)}), big_sinks]),
        tmp_path / "two.png",
    )
    per_panel = [
        {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches if isinstance(p, Rectangle)}
        for ax in fig.axes
        if ax.get_title() in ("MiniLM", "SmolLM2")
    ]
    assert per_panel == [{(0, 0), (5, 11)}, set(big_sinks)]
    assert legend_texts(fig) == [f"outlined: {SINK_LABEL} (29)"]


def test_a_map_without_sink_heads_says_so_and_outlines_nothing(tmp_path):
    values = np.full((3, 4), 0.1)
    fig = draw_head_maps(head_maps([("", values)], [frozenset()]), tmp_path / "none.png")
    assert outlined(fig) == set()
    assert legend_texts(fig) == [f"outlined: {SINK_LABEL} (0)"]
    assert len(cell_values(fig)) == 12
