"""A long prompt's attention panel, drawn so that its first key (the anchor, where a sink
puts its mass) can always be seen.

A panel of a 700-token prompt has more keys than pixels: matplotlib's resampling would
average the first key's one-token column with its neighbours (and the axes' edge covers
half of it), so the sink column fades or vanishes. Instead a panel with more tokens than
``budget`` is drawn as maxima over blocks of tokens, the first token always a block of its
own: every drawn column is at least four pixels wide (the axes edge covers one), and a column holding any
strong weight stays strong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def block_starts(n: int, budget: int) -> list[int]:
    """The first token of each drawn row or column: every token when ``n`` fits ``budget``;
    else token 0 alone, then equal blocks of the rest."""
    if n <= budget:
        return list(range(n))
    width = math.ceil((n - 1) / max(budget - 1, 1))
    return [0, *range(1, n, width)]


def max_pooled(pattern: np.ndarray, rows: Sequence[int], columns: Sequence[int]) -> np.ndarray:
    """``pattern`` ``[query, key]`` as the maximum over each block (NaN ignored)."""
    return np.fmax.reduceat(np.fmax.reduceat(pattern, list(rows), axis=0), list(columns), axis=1)


def block_ticks(starts: Sequence[int], step: int, labels: Sequence[str] | None) -> tuple[list[int], list]:
    """Tick positions (drawn columns, every ``step``-th) and their labels: the token (or
    index) that starts each block."""
    ticks = list(range(0, len(starts), step))
    return ticks, [labels[starts[t]] if labels is not None else starts[t] for t in ticks]


def key_label(n_shown: int, n_keys: int) -> str:
    """The key axis's label, which says when a column is a block of keys."""
    return "key" if n_shown == n_keys else "key (maximum over a block of keys; the first key alone)"
