"""Sink metrics on attention patterns, written once for toy and pretrained models.

All functions take a pattern ``[batch, head, query, key]``; for non-normalised attention
kinds (ReLU, sigmoid) this is the weight matrix after its fixed scaling, and rows need
not sum to one.
"""

from __future__ import annotations

import torch


def _anchor_index(anchor: int | torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    if isinstance(anchor, int):
        return torch.full((batch,), anchor, dtype=torch.long, device=device)
    return anchor.to(device=device, dtype=torch.long)


def anchor_mass_sums(
    pattern: torch.Tensor,
    anchor: int | torch.Tensor = 0,
    query_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of A[i, a] over selected queries i > a, per head, and the number of queries.

    pattern: ``[batch, head, query, key]``; anchor: int or ``[batch]`` per-row anchor
    position; query_mask: ``[batch, query]`` bool (e.g. default or trigger queries).
    Returns (``[head]`` sums, scalar count) so batches can be accumulated exactly.
    """
    batch, _, n_query, _ = pattern.shape
    anchor_index = _anchor_index(anchor, batch, pattern.device)
    # [batch, head, query]: weight each query puts on its row's anchor key
    to_anchor = pattern.gather(-1, anchor_index.view(batch, 1, 1, 1).expand(batch, pattern.shape[1], n_query, 1)).squeeze(-1)
    after_anchor = torch.arange(n_query, device=pattern.device).unsqueeze(0) > anchor_index.unsqueeze(1)
    selected = after_anchor if query_mask is None else after_anchor & query_mask.to(pattern.device)
    weights = selected.to(pattern.dtype).unsqueeze(1)
    return (to_anchor * weights).sum(dim=(0, 2)), selected.sum()


def anchor_mass(
    pattern: torch.Tensor,
    anchor: int | torch.Tensor = 0,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``anchor_mass`` per head ``[head]``: mean over queries i > a of A[i, a].

    NaN for a head when no query is selected.
    """
    sums, count = anchor_mass_sums(pattern, anchor, query_mask)
    return sums / count if count > 0 else torch.full_like(sums, float("nan"))


def is_sink_head(anchor_mass_default: torch.Tensor | float, eps: float = 0.1) -> torch.Tensor | bool:
    """The paper's sink head: anchor mass over default queries >= 1 - eps."""
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must lie in [0, 1), got {eps}")
    return anchor_mass_default >= 1.0 - eps
