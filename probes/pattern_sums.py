"""The probe's per-layer sums of every metric read from an attention pattern, one batch at a time.

Each query counts only with the keys its layer lets it see (``HookedModel.visible_keys``:
causal, sliding-window or chunked). Anchor-based metrics (anchor mass, Gu et al.'s alpha and
sink rate, the value-weighted anchor share) are summed twice: over the selected queries
that see the anchor (the headline numbers), and over every selected query, as a model
without windows would (``*_all`` below; a query that cannot see the anchor adds a zero
there). ``hidden`` counts the selected queries of each layer that cannot see it.
"""

from __future__ import annotations

import math

import torch

from sinkscope.interp.hooked_model import PreparedBatch
from sinkscope.interp.visibility import sees_key
from sinkscope.probes.probe import SinkRate
from sinkscope.probes.sink_metrics import (
    alpha_k,
    anchor_mass_sums,
    row_entropy_sums,
    row_mass_sums,
    value_weighted_anchor_share_sums,
)


def _zeros(*shape: int) -> torch.Tensor:
    """A float64 accumulator (``_zeros()``: a scalar)."""
    return torch.zeros(shape, dtype=torch.float64)


class PatternSums:
    """Per-(layer, head) sums and counts of the pattern metrics of ``n_layers`` x ``n_heads``
    heads, Gu et al.'s alpha with offset ``k`` and sink-rate hits at each of ``eps``."""

    def __init__(self, n_layers: int, n_heads: int, k: int, eps: tuple[float, ...]) -> None:
        self.k, self.eps = k, eps
        shape = (n_layers, n_heads)
        self.mass, self.mass_count = _zeros(*shape), _zeros(n_layers)
        self.mass_all, self.all_count, self.hidden = _zeros(*shape), _zeros(n_layers), _zeros(n_layers)
        self.other, self.other_count = _zeros(*shape), _zeros(n_layers)
        self.row_mass = _zeros(*shape)
        self.alpha, self.alpha_count = _zeros(*shape), _zeros(*shape)
        self.alpha_all, self.alpha_all_count = _zeros(*shape), _zeros(*shape)
        self.rate_hits, self.rate_count = _zeros(len(eps)), _zeros()
        self.rate_hits_all, self.rate_count_all = _zeros(len(eps)), _zeros()
        self.share, self.share_count = _zeros(*shape), _zeros(*shape)
        self.entropy, self.entropy_count = _zeros(*shape), _zeros(*shape)

    def add(
        self,
        layer: int,
        pattern: torch.Tensor,
        batch: PreparedBatch,
        selected: torch.Tensor,
        visible: torch.Tensor,
        value_norms: torch.Tensor | None,
        clean: bool | None = None,
    ) -> None:
        """Add one batch's ``pattern [batch, head, query, key]`` of ``layer``; ``selected``:
        the queries that count ``[batch, query]``; ``visible``: the layer's ``[batch, query,
        key]`` key visibility; ``value_norms``: ``projected_value_norms`` or None; ``clean``:
        ``masked_cleanly(pattern, visible)`` where known."""
        anchor = batch.anchor
        sees_anchor = sees_key(visible, anchor)
        seen = selected & sees_anchor
        sums, count = anchor_mass_sums(pattern, anchor, seen)
        self.mass[layer] += sums.double().cpu()
        self.mass_count[layer] += float(count)
        sums, count = anchor_mass_sums(pattern, anchor, selected)
        self.mass_all[layer] += sums.double().cpu()
        self.all_count[layer] += float(count)
        self.hidden[layer] += float((selected & ~sees_anchor).sum())
        self.row_mass[layer] += row_mass_sums(pattern, anchor, selected)[0].double().cpu()
        sums, count = anchor_mass_sums(pattern, anchor, batch.attention_mask & ~selected & sees_anchor)
        self.other[layer] += sums.double().cpu()
        self.other_count[layer] += float(count)
        sees_alpha_key = sees_key(visible, (anchor + self.k).clamp_max(batch.n_pos - 1))
        self._add_alpha(layer, pattern, anchor, batch.attention_mask & sees_alpha_key, all_queries=False)
        self._add_alpha(layer, pattern, anchor, batch.attention_mask, all_queries=True)
        sums, counts = row_entropy_sums(pattern, visible, selected, clean)
        self.entropy[layer] += sums.double().cpu()
        self.entropy_count[layer] += counts.double().cpu()
        if value_norms is not None:
            # a cleanly masked pattern is non-negative: no second pass to find that out
            sums, counts = value_weighted_anchor_share_sums(pattern, value_norms, anchor, seen, True if clean else None)
            self.share[layer] += sums.double().cpu()
            self.share_count[layer] += counts.double().cpu()

    def _add_alpha(
        self, layer: int, pattern: torch.Tensor, anchor: torch.Tensor, queries: torch.Tensor, all_queries: bool
    ) -> None:
        """Gu et al.'s alpha_k of each prompt and head over ``queries``, and its sink-rate hits."""
        alpha = alpha_k(pattern, self.k, anchor, queries).double().cpu()
        valid = ~torch.isnan(alpha)
        total, count = (self.alpha_all, self.alpha_all_count) if all_queries else (self.alpha, self.alpha_count)
        total[layer] += torch.where(valid, alpha, 0.0).sum(dim=0)
        count[layer] += valid.sum(dim=0)
        hits = self.rate_hits_all if all_queries else self.rate_hits
        for index, eps in enumerate(self.eps):
            hits[index] += float((alpha[valid] > eps).sum())
        if all_queries:
            self.rate_count_all += float(valid.sum())
        else:
            self.rate_count += float(valid.sum())

    def sink_rates(self, k: int) -> tuple[SinkRate, ...]:
        """Gu et al.'s sink rate at each epsilon (NaN when nothing was counted); the every-query
        rate only where some query of some layer cannot see the anchor."""
        narrowed = bool((self.hidden > 0).any())
        return tuple(
            SinkRate(
                k=k,
                eps=eps,
                percent=_percent(self.rate_hits[index], self.rate_count),
                percent_all_queries=_percent(self.rate_hits_all[index], self.rate_count_all) if narrowed else math.nan,
            )
            for index, eps in enumerate(self.eps)
        )


def _percent(hits: torch.Tensor, count: torch.Tensor) -> float:
    """``hits`` in percent of ``count``, NaN when nothing was counted."""
    return float(100.0 * hits / count) if count > 0 else math.nan
