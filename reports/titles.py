"""Figure titles that fit their figure: a long title is broken into lines by its drawn
width, so it never runs over a colour bar or past the figure's edge."""

from __future__ import annotations

import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def wrap_titles(fig: Figure) -> None:
    """Break every title (the figure's and each panel's) into lines that fit its width,
    measured as drawn (wide letters and CJK glyphs take more room than a count of
    characters says): a long one would otherwise run over a colour bar or past the
    figure's edge, where ``bbox_inches="tight"`` makes the figure wider than the page."""
    suptitle = getattr(fig, "_suptitle", None)  # matplotlib keeps it private; None until set
    titled = [(suptitle, fig.get_figwidth())] if suptitle is not None else []
    for ax in fig.axes:
        # a panel of several keeps to its own width; a figure's one plot may use most of the figure's
        share = ax.get_position().width
        titled += [(ax.title, fig.get_figwidth() * (share if share < 0.45 else 0.9))]
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)  # a bare Figure has none
    renderer = canvas.get_renderer()
    for text, width_in in titled:
        words = text.get_text()
        if not words:
            continue
        chars = max(len(line) for line in words.split("\n"))
        while chars > 8 and text.get_window_extent(renderer).width > width_in * fig.dpi:
            chars = int(chars * 0.85)
            text.set_text(
                "\n".join(
                    textwrap.fill(line, chars, break_on_hyphens=False, break_long_words=True)
                    for line in words.split("\n")
                )
            )
