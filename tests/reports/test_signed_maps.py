"""Signed maps (activation patching's normalised effect, which may be negative) are drawn on
a diverging scale centred on 0: symmetric limits -m..+m with m the largest |effect|, white
at 0, in the report's PNG and in the notebook's heat grid."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from sinkscope.infra.codec import read_result
from sinkscope.probes.display import patching_html
from sinkscope.reports.colour_scales import signed_limits
from sinkscope.reports.html import heat_grid
from sinkscope.toy.patching import PATCHING_FILE, TriggerPatching, patching_figures

STORED = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06" / "toy-patch"


def stored_patching(tmp_path: Path) -> TriggerPatching:
    shutil.copytree(STORED, tmp_path / "toy-patch")
    return read_result(tmp_path / "toy-patch" / PATCHING_FILE, TriggerPatching, "")


def test_patching_maps_use_a_diverging_scale_symmetric_about_zero(tmp_path):
    result = stored_patching(tmp_path)
    figures = patching_figures(result, "toy", tmp_path / "out")
    assert len(figures) == 2
    for figure, patched in zip(figures, (result.per_head, result.per_position)):
        image = figure.axes[0].images[0]
        m = float(np.nanmax(np.abs(np.nan_to_num(patched.matrix().numpy()))))
        assert image.norm.vmin == -image.norm.vmax == -m > -np.inf
        assert image.get_cmap().name.startswith("RdBu_r")
        centre, low, high = (np.array(image.get_cmap()(t)[:3]) for t in (0.5, 0.0, 1.0))
        assert centre.min() > 0.9  # white at 0
        assert low[2] > low[0] and high[0] > high[2]  # blue below 0, red above


def test_the_notebook_grid_of_a_signed_map_is_white_at_zero_and_blue_below():
    grid = heat_grid([[-0.5, 0.0, 0.25]], "effect", signed=True)
    cells = grid.split("<td")[1:]
    assert "background:#2166ac" in cells[0]  # -m: the blue end
    assert "background:#f7f7f7" in cells[1]  # 0: the white centre
    assert "background:#f7f7f7" not in cells[2] and "background:#2166ac" not in cells[2]


def test_the_inline_patching_display_is_signed(tmp_path):
    patched = stored_patching(tmp_path).per_head
    values = [v for row in patched.matrix().tolist() for v in row if np.isfinite(v)]
    extreme = max(values, key=abs)
    markup = patching_html(patched)
    assert f"background:{'#2166ac' if extreme < 0 else '#b2182b'}" in markup  # the largest |effect| at an end
    assert "background:#440154" not in markup  # not viridis


def test_signed_limits_are_symmetric():
    assert signed_limits([-0.2, 0.7, float("nan")]) == (-0.7, 0.7)
    assert signed_limits([0.0]) == (-1.0, 1.0)
