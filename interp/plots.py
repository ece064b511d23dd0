"""Figures shared by toy and pretrained reports. Every figure is written atomically as PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from interp.atomic_io import atomic_path  # noqa: E402


def save_figure(fig: "plt.Figure", path: str | os.PathLike, dpi: int = 110) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)


def attention_grid(
    patterns: np.ndarray,
    path: str | os.PathLike,
    title: str,
    tick_labels: Sequence[str] | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
) -> None:
    """Heatmaps of attention for every layer and head, like the paper's figures.

    patterns: ``[layer, head, query, key]`` (e.g. the mean or std over test sequences).
    Rows are layers, columns heads; each cell shows query (y) against key (x).
    """
    if patterns.ndim != 4:
        raise ValueError(f"expected patterns [layer, head, query, key], got shape {patterns.shape}")
    n_layers, n_heads, n_query, n_key = patterns.shape
    size = 2.6
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(size * n_heads + 1.2, size * n_layers + 0.6), squeeze=False
    )
    top = float(np.nanmax(patterns)) if vmax is None else vmax
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            image = ax.imshow(patterns[layer, head], vmin=0.0, vmax=max(top, 1e-9), cmap=cmap)
            ax.set_title(f"L{layer} H{head}", fontsize=9)
            if tick_labels is not None:
                step = max(1, len(tick_labels) // 8)
                ticks = list(range(0, n_key, step))
                ax.set_xticks(ticks, [tick_labels[t] for t in ticks], fontsize=6, rotation=90)
                ax.set_yticks(ticks, [tick_labels[t] for t in ticks], fontsize=6)
            else:
                ax.tick_params(labelsize=6)
            if layer == n_layers - 1:
                ax.set_xlabel("key", fontsize=7)
            if head == 0:
                ax.set_ylabel("query", fontsize=7)
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8)
    save_figure(fig, path)


def layer_head_map(
    values: np.ndarray,
    path: str | os.PathLike,
    title: str,
    colorbar_label: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> None:
    """A layer x head heatmap ``values [layer, head]`` with each cell annotated."""
    n_layers, n_heads = values.shape
    fig, ax = plt.subplots(figsize=(max(3.0, 0.5 * n_heads + 2), max(2.5, 0.4 * n_layers + 1.5)))
    image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap="magma", aspect="auto")
    if n_layers * n_heads <= 256:
        for layer in range(n_layers):
            for head in range(n_heads):
                value = values[layer, head]
                ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if value < (vmin + vmax) / 2 else "black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    save_figure(fig, path)
