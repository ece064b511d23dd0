"""A long prompt's attention panel (an audit's example at ~700 tokens) always shows its
first key, where a sink puts its mass: the panel is drawn as maxima over blocks of keys,
the first key a block of its own, never resampled so that its column fades."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from sinkscope.reports.panels import block_starts, max_pooled
from sinkscope.reports.plots import attention_grid

N = 700


def sink_pattern(n: int) -> np.ndarray:
    """Every query puts all its weight on key 0 (a perfect sink), none elsewhere."""
    pattern = np.zeros((1, 1, n, n))
    pattern[0, 0, :, 0] = 1.0
    return pattern


def test_the_first_key_column_is_drawn_at_full_weight(tmp_path):
    labels = ["<bos>", *(f"t{k}" for k in range(1, N))]
    fig = attention_grid(sink_pattern(N), tmp_path / "example.png", "long prompt", tick_labels=labels, vmax=1.0)
    ax = fig.axes[0]
    drawn = np.asarray(ax.images[0].get_array())
    assert drawn.shape[1] < N  # more keys than the panel has room for
    assert np.all(drawn[:, 0] == 1.0) and np.all(drawn[:, 1:] == 0.0)  # key 0 alone, at full weight
    assert ax.get_xticklabels()[0].get_text() == "<bos>"
    # in the PNG itself: the panel's first pixel columns inside the axes are the top colour
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    pixels = np.asarray(Image.open(buffer).convert("RGB")).astype(int)
    box = ax.images[0].get_window_extent()  # as laid out by that draw
    height = pixels.shape[0]
    top = np.array(ax.images[0].cmap(1.0)[:3]) * 255
    column = pixels[int(height - box.y1) + 3 : int(height - box.y0) - 3, int(box.x0) + 2]
    assert np.abs(column - top).max(axis=1).mean() < 40


def test_blocks_keep_the_first_token_alone_and_cover_every_token():
    starts = block_starts(N, 120)
    assert starts[:2] == [0, 1] and len(starts) <= 120
    pooled = max_pooled(np.arange(N * N, dtype=float).reshape(N, N), starts, starts)
    assert pooled[0, 0] == 0.0 and pooled[-1, -1] == N * N - 1  # the last token is in the last block
    assert block_starts(16, 120) == list(range(16))  # a short prompt: one column per token, as before
