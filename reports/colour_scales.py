"""Colour scales of maps: a signed quantity (an activation-patching effect, which may be
negative) on a diverging scale centred on 0, so that white means no effect and the two
signs are told apart by hue; and the text colour that stays legible on a map cell."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

DIVERGING = "RdBu_r"  # blue below 0, white at 0, red above


def signed_limits(values: Iterable[float]) -> tuple[float, float]:
    """(-m, +m) with m the largest |value| measured (1 when none is, or all are 0): the
    scale is symmetric, so 0 sits at its centre whatever the signs of the values."""
    m = max((abs(float(v)) for v in values if math.isfinite(float(v))), default=0.0)
    return (-m, m) if m > 0 else (-1.0, 1.0)


def text_colour(rgba: Sequence[float] | np.ndarray) -> str:
    """White on a dark cell, black on a light one (by the cell colour's luminance): the
    ends of a diverging scale are both dark, its middle light."""
    red, green, blue = rgba[:3]
    return "white" if 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.5 else "black"


# HTML heat grids (a notebook's inline display): the same scales at five stops, mixed linearly
VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
RDBU_R = ((33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43))


def _mix(stops: tuple[tuple[int, int, int], ...], t: float) -> tuple[str, str]:
    """(background, text) CSS colours at ``t`` in [0, 1] along ``stops``."""
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    low = min(int(t), len(stops) - 2)
    rgb = [round(a + (b - a) * (t - low)) for a, b in zip(stops[low], stops[low + 1])]
    text = "#ffffff" if text_colour(tuple(c / 255 for c in rgb)) == "white" else "#1d2330"
    return "#{:02x}{:02x}{:02x}".format(*rgb), text


def colour(value: float, vmin: float = 0.0, vmax: float = 1.0) -> tuple[str, str]:
    """(background, text) CSS colours of ``value`` on viridis between vmin and vmax;
    grey for NaN."""
    if math.isnan(value):
        return "#e9ecef", "#5b6473"
    return _mix(VIRIDIS, (value - vmin) / (vmax - vmin) if vmax > vmin else 0.0)


def signed_colour(value: float, m: float) -> tuple[str, str]:
    """(background, text) CSS colours of a signed ``value`` on the diverging scale from
    -m (blue) through 0 (white) to +m (red); grey for NaN."""
    if math.isnan(value):
        return "#e9ecef", "#5b6473"
    return _mix(RDBU_R, 0.5 + value / (2 * m) if m > 0 else 0.5)
