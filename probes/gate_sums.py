"""The probe's per-(layer, head) sums of a gated model's gate, one batch at a time: at the
selected queries (the toy task's default positions; in audits every real query after the
anchor) and at the other real queries after the anchor (its trigger).

Two sources of gates: a toy gated kind's ``hook_gate`` (the gate values themselves), and a
bridge whose q_proj is doubled into query and gate halves (Qwen3-Next's full-attention
layers), whose ``hook_q_gate`` carries the gate before its sigmoid, one per output element
of each head. For the latter, ``QueryGateSums`` also sums the anchor's term in each
head's gated output, A[i, a] ||g_i * v_a|| (elementwise product) (``gated_anchor_norm``, docs/metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Bool, Float

from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import PreparedBatch
from sinkscope.interp.model_spec import ModelSpec
from sinkscope.probes.sink_metrics import column, gate_sums

# (batch, selected queries [batch, query], visible keys of a layer [batch, query, key])
PassContext = Callable[[int], tuple[PreparedBatch, torch.Tensor, torch.Tensor]]


def ratio(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``total / count``, NaN where nothing was counted."""
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan))


class GateSums:
    """Gate sums and counts of ``n_layers`` x ``n_heads`` heads (float64)."""

    def __init__(self, n_layers: int, n_heads: int) -> None:
        shape = (n_layers, n_heads)
        self.selected = (torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))
        self.others = (torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))

    def add(
        self,
        layer: int,
        gate: Float[torch.Tensor, "batch pos head *d_head"],
        batch: PreparedBatch,
        selected: Bool[torch.Tensor, "batch pos"],
    ) -> None:
        positions = torch.arange(batch.n_pos, device=selected.device)
        others = batch.attention_mask & ~selected & (positions.unsqueeze(0) > batch.anchor.unsqueeze(1))
        for (total, count), queries in ((self.selected, selected), (self.others, others)):
            sums, counts = gate_sums(gate, queries)
            total[layer] += sums.double().cpu()
            count[layer] += counts.double().cpu()

    def means(self) -> tuple[Float[torch.Tensor, "layer head"], Float[torch.Tensor, "layer head"]]:
        """The mean gate at the selected and at the other queries; NaN where none was summed."""
        return tuple(ratio(total, count) for total, count in (self.selected, self.others))  # type: ignore[return-value]


def gated_anchor_terms(
    gate: Float[torch.Tensor, "batch pos head d_head"],
    anchor_weights: Float[torch.Tensor, "batch head pos"],
    anchor_values: Float[torch.Tensor, "batch head d_head"],
) -> Float[torch.Tensor, "batch pos head"]:
    """A[i, a] ||g_i * v_a|| (elementwise product) per query i and head: the norm of the anchor's term in the head's
    output after an elementwise gate g_i (the gate values, after the sigmoid)."""
    gated = gate * anchor_values.unsqueeze(1)  # [batch, pos, head, d_head]
    return anchor_weights.transpose(1, 2) * gated.norm(dim=-1)


class QueryGateSums:
    """Sums of the gate of a doubled q_proj (``hook_q_gate``) and of ``gated_anchor_terms``,
    filled by three hooks per gated layer that fire in this order: ``hook_v`` (the anchor's
    value kept), ``hook_pattern`` (its column kept), ``hook_q_gate`` (both summed, dropped)."""

    def __init__(self, spec: ModelSpec, gates: GateSums, context: PassContext) -> None:
        self.spec, self.gates, self.context = spec, gates, context
        shape = (spec.n_layers, spec.n_heads)
        self.anchor_sum, self.anchor_count = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape)
        self._values: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None

    def hooks(self, layer: int) -> list[tuple[str, Any]]:
        """The hooks of ``layer``; none when its attention has no query gate."""
        if attn_hook(layer, "q_gate") not in self.spec.hook_names:
            return []
        return [
            (attn_hook(layer, "v"), self._value_hook(layer)),
            (attn_hook(layer, "pattern"), self._pattern_hook(layer)),
            (attn_hook(layer, "q_gate"), self._gate_hook(layer)),
        ]

    def _value_hook(self, layer: int):
        def hook(v: torch.Tensor, hook: Any) -> None:
            batch = self.context(layer)[0]
            rows = torch.arange(batch.batch_size, device=v.device)
            self._values = self.spec.expand_kv(v)[rows, batch.anchor].float()  # [batch, head, d_head]

        return hook

    def _pattern_hook(self, layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> None:
            self._weights = column(pattern, self.context(layer)[0].anchor).float()  # [batch, head, query]

        return hook

    def _gate_hook(self, layer: int):
        def hook(q_gate: torch.Tensor, hook: Any) -> None:
            batch, selected, visible = self.context(layer)
            gate = torch.sigmoid(q_gate.float()).view(*q_gate.shape[:2], self.spec.n_heads, -1)
            self.gates.add(layer, gate, batch, selected)
            assert self._values is not None and self._weights is not None, "hook_v and hook_pattern fire first"
            seen = selected & visible[torch.arange(batch.batch_size), :, batch.anchor]  # as anchor_mass counts
            terms = gated_anchor_terms(gate, self._weights, self._values)
            self.anchor_sum[layer] += (terms * seen.unsqueeze(-1)).sum(dim=(0, 1)).double().cpu()
            self.anchor_count[layer] += float(seen.sum())
            self._values = self._weights = None

        return hook

    def gated_anchor_norm(self) -> Float[torch.Tensor, "layer head"]:
        """The mean of ``gated_anchor_terms`` over the selected queries that see the anchor;
        NaN for heads without a query gate."""
        return ratio(self.anchor_sum, self.anchor_count)
