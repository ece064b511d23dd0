"""Key geometry per head (Gu et al., ICLR 2025, §3.1), summed in the probe's own pass.

For each query head: the mean cosine between its queries and the anchor's key, against
their mean cosine with the other keys they can see; ||k_anchor|| / median ||k_j|| and
||v_anchor|| / median ||v_j|| over the prompt's other real tokens. Cosines are read twice
where the model rotates queries and keys: before RoPE (``hook_q``/``hook_k``) and after it
(``hook_rot_q``/``hook_rot_k``), the vectors whose dot product is the attention score. A
rotation keeps norms, so the norm ratios are read once, before it. Under grouped-query
attention query head h reads its kv head (``ModelSpec.expand_kv``).

Averaging: cosines over every selected query that sees the anchor and at least one other
real key (all prompts pooled); norm ratios one per prompt (prompts with at least one
other real token), then averaged over prompts. Nothing of ``[batch, head, query, key]``
size is formed: the other keys' cosines are one sum of unit keys per query, a running sum
in plain causal layers (linear in T) and a masked sum under windows, chunks or
bidirectional attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Int

from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import ModelSpec, PreparedBatch
from sinkscope.interp.visibility import layer_reach

# (batch, selected queries [batch, query], visible keys of a layer [batch, query, key])
PassContext = Callable[[int], tuple[PreparedBatch, torch.Tensor, torch.Tensor]]
STAGES = ("pre", "rot")  # before and after the rotary embedding


def _unit(x: torch.Tensor) -> torch.Tensor:
    """``x`` scaled to unit norm along its last axis (zero vectors stay zero), in float32."""
    return torch.nn.functional.normalize(x.float(), dim=-1, eps=1e-12)


def _other_key_sums(
    kn: Float[torch.Tensor, "batch key kv_head d"], batch: PreparedBatch, visible: torch.Tensor, causal_prefix: bool
) -> tuple[Float[torch.Tensor, "batch query kv_head d"], Int[torch.Tensor, "batch query"]]:
    """Per query, the sum of the unit keys of the other real keys it sees and their number.
    A plain causal layer sees a prefix: a running sum, with no ``[batch, query, key]``
    tensor; a windowed, chunked or bidirectional one takes its visibility as a mask."""
    positions = torch.arange(batch.n_pos, device=kn.device)
    other = batch.attention_mask & (positions.view(1, -1) != batch.anchor.view(-1, 1))  # [batch, key]
    if causal_prefix:
        return (kn * other[..., None, None]).cumsum(dim=1), other.cumsum(dim=1)
    others = visible & other.unsqueeze(1)
    return einsum(others.float(), kn, "b q k, b k kv d -> b q kv d"), others.sum(dim=-1)


def cosine_sums(
    q: Float[torch.Tensor, "batch pos head d_head"],
    k: Float[torch.Tensor, "batch pos kv_head d_head"],
    batch: PreparedBatch,
    queries: Bool[torch.Tensor, "batch pos"],
    visible: Bool[torch.Tensor, "batch pos key"],
    causal_prefix: bool = False,
) -> tuple[Float[torch.Tensor, " head"], Float[torch.Tensor, " head"], torch.Tensor]:
    """Sums over ``queries`` of cos(q_i, k_anchor) and of the mean cos(q_i, k_j) over the
    other real keys j that query i sees, per query head, and how many queries counted.

    k holds one head per kv head (grouped-query attention: query head h reads kv head
    h // (head / kv_head)), so the keys are normalised and summed once per kv head, not
    once per query head; causal_prefix: the layer is plain causal (``visible`` is then
    j <= i over real keys)."""
    n_kv = k.shape[2]
    # dot products with unit keys, then over |q|: the query tensor is read, not rescaled
    grouped = rearrange(q.float(), "b p (kv g) d -> b p kv g d", kv=n_kv)
    q_norms = grouped.norm(dim=-1).clamp_min(1e-12)  # [batch, pos, kv_head, group]
    kn = _unit(k)
    rows = torch.arange(batch.batch_size, device=q.device)
    anchor_keys = rearrange(kn[rows, batch.anchor], "b kv d -> b 1 kv d 1")
    anchor_cos = (grouped @ anchor_keys).squeeze(-1) / q_norms
    key_sum, n_others = _other_key_sums(kn, batch, visible, causal_prefix)
    other_cos = (grouped @ key_sum.unsqueeze(-1)).squeeze(-1) / (q_norms * n_others.clamp_min(1)[..., None, None])
    counted = (queries & (n_others > 0)).float()
    per_head = "b p kv g, b p -> kv g"
    return (
        einsum(anchor_cos, counted, per_head).flatten(),
        einsum(other_cos, counted, per_head).flatten(),
        counted.sum(),
    )


def anchor_norm_ratios(x: Float[torch.Tensor, "batch pos head d"], batch: PreparedBatch) -> torch.Tensor:
    """``||x_anchor|| / median_j ||x_j||`` over each prompt's other real tokens j, per head
    of ``x`` (kv heads for keys and values): ``[batch, head]``, NaN for a prompt without
    another real token or with a zero median."""
    return norm_ratios(x.float().norm(dim=-1), batch)


def norm_ratios(norms: Float[torch.Tensor, "batch pos head"], batch: PreparedBatch) -> torch.Tensor:
    """``anchor_norm_ratios`` of vectors whose norms are ``norms`` (e.g. values after W_O)."""
    rows = torch.arange(batch.batch_size, device=norms.device)
    others = batch.attention_mask.clone()
    others[rows, batch.anchor] = False
    median = norms.masked_fill(~others.unsqueeze(-1), float("nan")).nanmedian(dim=1).values
    # a head whose other keys are all zero has no ratio (not an infinite one)
    return torch.where(median > 0, norms[rows, batch.anchor] / median.clamp_min(1e-30), float("nan"))


class KeyGeometrySums:
    """Per-(layer, head) sums and counts of the key geometry, filled by forward hooks."""

    def __init__(self, spec: ModelSpec, context: PassContext) -> None:
        self.spec, self.context = spec, context
        shape = (spec.n_layers, spec.n_heads)
        zeros = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.anchor_cos = {stage: zeros(shape) for stage in STAGES}
        self.other_cos = {stage: zeros(shape) for stage in STAGES}
        self.cos_count = {stage: zeros(spec.n_layers) for stage in STAGES}
        self.ratio = {name: zeros(shape) for name in ("k", "v")}
        self.ratio_count = {name: zeros(shape) for name in ("k", "v")}
        self._waiting: dict[tuple[int, str], torch.Tensor] = {}
        self._fields: dict[str, list[list[float]]] | None = None

    def rotates(self, layer: int) -> bool:
        """Whether the model exposes ``layer``'s rotated queries and keys."""
        return all(attn_hook(layer, name) in self.spec.hook_names for name in ("rot_q", "rot_k"))

    def hooks(self, layer: int) -> list[tuple[str, Any]]:
        hooks = [
            (attn_hook(layer, "q"), self._qk_hook(layer, "pre", "q")),
            (attn_hook(layer, "k"), self._qk_hook(layer, "pre", "k")),
            (attn_hook(layer, "v"), self._value_hook(layer)),
        ]
        if self.rotates(layer):
            hooks += [
                (attn_hook(layer, "rot_q"), self._qk_hook(layer, "rot", "q")),
                (attn_hook(layer, "rot_k"), self._qk_hook(layer, "rot", "k")),
            ]
        return hooks

    def _qk_hook(self, layer: int, stage: str, kind: str):
        def hook(x: torch.Tensor, hook: Any) -> None:
            if kind == "q" and stage == "pre" and attn_hook(layer, "q_gate") in self.spec.hook_names:
                x = x[:, :, 0::2]  # a doubled q_proj: head h's query at 2h, its gate at 2h + 1
            # whichever of q and k fires first waits for the other, then both are dropped
            other = self._waiting.pop((layer, stage), None)
            if other is None:
                self._waiting[(layer, stage)] = x
                return
            q, k = (x, other) if kind == "q" else (other, x)
            self._add_cosines(layer, stage, q, k)

        return hook

    def _add_cosines(self, layer: int, stage: str, q: torch.Tensor, k: torch.Tensor) -> None:
        batch, selected, visible = self.context(layer)
        seen = selected & visible[torch.arange(batch.batch_size), :, batch.anchor]
        causal_prefix = self.spec.causal and layer_reach(self.spec, layer) == (0, 0)
        anchor, other, count = cosine_sums(q, k, batch, seen, visible, causal_prefix)
        self.anchor_cos[stage][layer] += anchor.double().cpu()
        self.other_cos[stage][layer] += other.double().cpu()
        self.cos_count[stage][layer] += float(count)
        if stage == "pre":
            self._add_ratio("k", layer, k, batch)

    def _value_hook(self, layer: int):
        def hook(v: torch.Tensor, hook: Any) -> None:
            self._add_ratio("v", layer, v, self.context(layer)[0])

        return hook

    def _add_ratio(self, name: str, layer: int, x: torch.Tensor, batch: PreparedBatch) -> None:
        # per kv head, then one copy per query head that reads it (the norms are the kv head's)
        ratios = self.spec.expand_kv(anchor_norm_ratios(x, batch), head_axis=1).double().cpu()
        valid = ~torch.isnan(ratios)
        self.ratio[name][layer] += torch.where(valid, ratios, 0.0).sum(dim=0)
        self.ratio_count[name][layer] += valid.sum(dim=0)

    def head_fields(self, layer: int, head: int) -> dict[str, float]:
        """The ``HeadProbe`` geometry fields of one head (NaN where nothing was counted)."""
        if self._fields is None:  # every head's, once: [layer][head] lists, not a lookup per head and field
            self._fields = self._all_fields()
        return {name: values[layer][head] for name, values in self._fields.items()}

    def _all_fields(self) -> dict[str, list[list[float]]]:
        fields = {}
        for stage, suffix in (("pre", ""), ("rot", "_rotated")):
            count = self.cos_count[stage].unsqueeze(1)  # [layer, 1]
            for name, sums in (("anchor_key_cos", self.anchor_cos), ("other_key_cos", self.other_cos)):
                fields[name + suffix] = torch.where(count > 0, sums[stage] / count.clamp_min(1), math.nan).tolist()
        for name, field in (("k", "anchor_key_norm_ratio"), ("v", "anchor_value_norm_ratio")):
            count = self.ratio_count[name]
            fields[field] = torch.where(count > 0, self.ratio[name] / count.clamp_min(1), math.nan).tolist()
        return fields
