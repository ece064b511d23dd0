"""Sink metrics on attention patterns, written once for toy and pretrained models.

Every function takes one layer's pattern ``[batch, head, query, key]``; for
non-normalised attention kinds (ReLU, sigmoid) this is the weight matrix after its
fixed scaling, and rows need not sum to one. Functions ending in ``_sums`` return sums
and counts so that batches accumulate exactly without keeping earlier patterns.

``anchor`` is an int or a ``[batch]`` tensor (each row's anchor, e.g. its first real
token under left padding). ``query_mask [batch, query]`` bool selects queries (real
tokens, default or trigger positions); anchor-based metrics always drop queries at or
before the anchor, so in bidirectional encoders every real query except the anchor
row counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Int

from sinkscope.infra.errors import InputError

SINK_RATE_EPSILONS: tuple[float, ...] = (0.3, 0.8)
SINK_EPS = 0.1  # a sink head has anchor mass >= 1 - SINK_EPS (0.9), as the paper reads its heatmaps


def _anchor_index(anchor: int | torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    if isinstance(anchor, int):
        return torch.full((batch,), anchor, dtype=torch.long, device=device)
    if anchor.shape != (batch,):
        raise InputError(f"anchor must be an int or a [batch={batch}] tensor, got shape {tuple(anchor.shape)}")
    return anchor.to(device=device, dtype=torch.long)


def column(
    pattern: Float[torch.Tensor, "batch head query key"], key: Int[torch.Tensor, " batch"]
) -> Float[torch.Tensor, "batch head query"]:
    """A[b, h, i, key[b]] for every head and query."""
    batch, n_heads, n_query, _ = pattern.shape
    index = key.view(batch, 1, 1, 1).expand(batch, n_heads, n_query, 1)
    return pattern.gather(-1, index).squeeze(-1)


def queries_after_anchor(
    n_query: int,
    anchor: int | Int[torch.Tensor, " batch"],
    batch: int,
    query_mask: Bool[torch.Tensor, "batch query"] | None,
    device: torch.device,
) -> Bool[torch.Tensor, "batch query"]:
    """Queries i > anchor that ``query_mask`` keeps."""
    anchor_index = _anchor_index(anchor, batch, device)
    selected = torch.arange(n_query, device=device).unsqueeze(0) > anchor_index.unsqueeze(1)
    return selected if query_mask is None else selected & query_mask.to(device=device, dtype=torch.bool)


def anchor_mass_sums(
    pattern: Float[torch.Tensor, "batch head query key"],
    anchor: int | Int[torch.Tensor, " batch"] = 0,
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
) -> tuple[Float[torch.Tensor, " head"], Int[torch.Tensor, ""]]:
    """Sum of A[i, a] over selected queries i > a, per head, and the number of queries.

    anchor: int or per-row anchor position; query_mask: e.g. default or trigger queries.
    Returns (per-head sums, scalar count) so batches can be accumulated exactly.
    """
    batch, _, n_query, _ = pattern.shape
    anchor_index = _anchor_index(anchor, batch, pattern.device)
    to_anchor = column(pattern, anchor_index)
    selected = queries_after_anchor(n_query, anchor_index, batch, query_mask, pattern.device)
    weights = selected.to(pattern.dtype).unsqueeze(1)
    return (to_anchor * weights).sum(dim=(0, 2)), selected.sum()


def row_mass_sums(
    pattern: Float[torch.Tensor, "batch head query key"],
    anchor: int | Int[torch.Tensor, " batch"] = 0,
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
) -> tuple[Float[torch.Tensor, " head"], Int[torch.Tensor, ""]]:
    """Sum over selected queries i > a of the row's total weight sum_j A[i, j], per head,
    and the number of queries: 1 per row under softmax; under ReLU-family attention,
    how much a head attends at all (0 for a head that is off at those queries)."""
    batch, _, n_query, _ = pattern.shape
    selected = queries_after_anchor(n_query, anchor, batch, query_mask, pattern.device)
    weights = selected.to(pattern.dtype).unsqueeze(1)
    return (pattern.sum(dim=-1) * weights).sum(dim=(0, 2)), selected.sum()


def null_mass(row_mass: Float[torch.Tensor, " *shape"]) -> Float[torch.Tensor, " *shape"]:
    """The null mass from ``row_mass`` (a mean of row sums over real keys, e.g.
    ``row_mass_sums`` over its count): 1 - row_mass, the share of a row that goes to no
    token (a learned sink logit as gpt-oss's, a key/value bias slot, off-by-one softmax's
    1, or softpick's empty rows); clamped to [0, 1], since float rounding of a row that
    sums to one can land a hair either side. NaN stays NaN (nothing measured)."""
    return (1.0 - row_mass).clamp(0.0, 1.0)


def anchor_mass(
    pattern: Float[torch.Tensor, "batch head query key"],
    anchor: int | Int[torch.Tensor, " batch"] = 0,
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
) -> Float[torch.Tensor, " head"]:
    """``anchor_mass`` per head: mean over queries i > a of A[i, a].

    NaN for a head when no query is selected.
    """
    sums, count = anchor_mass_sums(pattern, anchor, query_mask)
    return sums / count if count > 0 else torch.full_like(sums, float("nan"))


@overload
def is_sink_head(
    anchor_mass_default: Float[torch.Tensor, " *shape"], eps: float = 0.1
) -> Bool[torch.Tensor, " *shape"]: ...


@overload
def is_sink_head(anchor_mass_default: float, eps: float = 0.1) -> bool: ...


def is_sink_head(
    anchor_mass_default: Float[torch.Tensor, " *shape"] | float, eps: float = 0.1
) -> Bool[torch.Tensor, " *shape"] | bool:
    """The paper's sink head: anchor mass over default queries >= 1 - eps."""
    if not 0.0 <= eps < 1.0:
        raise InputError(f"eps must lie in [0, 1), got {eps}", field="eps")
    return anchor_mass_default >= 1.0 - eps


def alpha_k(
    pattern: Float[torch.Tensor, "batch head query key"],
    k: int = 0,
    anchor: int | Int[torch.Tensor, " batch"] = 0,
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
) -> Float[torch.Tensor, "batch head"]:
    """Gu et al.'s alpha_k per sample and head: mean over queries i >= k of A[i, k].

    ``k`` counts from each row's anchor (k = 0 is the first real token); ``query_mask``
    keeps real queries. NaN where a row has no query i > k (a one-token row, whose only
    query is k itself, would count as a sink by construction).
    """
    if k < 0:
        raise InputError(f"k must be >= 0 (offset from the first token), got {k}", field="k")
    batch, _, n_query, n_key = pattern.shape
    key = _anchor_index(anchor, batch, pattern.device) + k
    if bool((key >= n_key).any()):
        raise InputError(f"k={k} lies beyond the last token of a row; use a smaller k or longer inputs")
    positions = torch.arange(n_query, device=pattern.device).unsqueeze(0)
    selected, after = positions >= key.unsqueeze(1), positions > key.unsqueeze(1)
    if query_mask is not None:
        real = query_mask.to(device=pattern.device, dtype=torch.bool)
        selected, after = selected & real, after & real
    weights = selected.to(pattern.dtype).unsqueeze(1)
    count = weights.sum(dim=2)
    alpha = (column(pattern, key) * weights).sum(dim=2) / count
    # a row whose only query is k itself says nothing: under softmax it attends to k wholly
    return torch.where(after.any(dim=1).unsqueeze(1), alpha, torch.nan)


def sink_rate(alpha: Float[torch.Tensor, " ..."], eps: float = 0.3) -> float:
    """Sink_k^eps in percent: share of (sample, layer, head) entries of ``alpha`` above eps.

    ``alpha``: any shape, e.g. ``[batch, layer, head]`` from ``alpha_k``; NaNs are skipped.
    """
    valid = alpha[~torch.isnan(alpha)]
    if valid.numel() == 0:
        raise InputError("sink_rate needs at least one alpha value; check that inputs are longer than k")
    return float((valid > eps).to(torch.float64).mean() * 100.0)


def output_gram(W_O: Float[torch.Tensor, "head d_head d_model"]) -> Float[torch.Tensor, "head d_head d_head"]:
    """Each head's Gram matrix W_O[h] W_O[h]^T; ||x W_O[h]||^2 = x G[h] x^T."""
    return W_O @ W_O.transpose(-1, -2)


def head_output_norms(
    x: Float[torch.Tensor, "batch pos head d_head"], gram: Float[torch.Tensor, "head d_head d_head"]
) -> Float[torch.Tensor, "batch pos head"]:
    """||x[b, p, h] W_O[h]|| for every position and head; gram from ``output_gram(W_O)``.

    Through the Gram matrix, so the ``[batch, pos, head, d_model]`` projection is never
    built (d_model / d_head times less work per head).
    """
    return rearrange(_norms_by_head(x, gram), "h b p -> b p h")


def _norms_by_head(
    x: Float[torch.Tensor, "batch pos head d_head"], gram: Float[torch.Tensor, "head d_head d_head"]
) -> Float[torch.Tensor, "head batch pos"]:
    """||x[b, p, h] W_O[h]||, heads first: one batched matmul per head over every position
    (a third faster than the einsum over batch and position)."""
    n_batch, n_pos, n_heads, d_head = x.shape
    by_head = rearrange(x, "b p h d -> h (b p) d")  # one copy, then contiguous per head
    squared = (torch.bmm(by_head, gram.to(x.dtype)) * by_head).sum(dim=-1)
    return squared.clamp_min(0.0).sqrt().view(n_heads, n_batch, n_pos)


def projected_value_norms(
    v: Float[torch.Tensor, "batch pos head d_head"], gram: Float[torch.Tensor, "head d_head d_head"]
) -> Float[torch.Tensor, "batch head pos"]:
    """||v_j W_O[h]|| for every key and head: v holds one value per query head (expanded
    with ``ModelSpec.expand_kv`` under grouped-query attention), gram comes from
    ``output_gram``; ``pos`` is the key axis of ``value_weighted_anchor_share_sums``."""
    return rearrange(_norms_by_head(v, gram), "h b p -> b h p")


# a query row whose attention weights sum below this writes rounding residue, not a mix of
# values: softmax rows sum to 1, so only ReLU-family heads that attend nowhere fall under it
SILENT_ROW_MASS = 1e-4
# a query where a head's write bound sum_j ||A[i,j] v_j W_O|| is below this fraction of the
# largest value any head of the layer writes for the input (max over heads and keys of
# ||v_j W_O||): its share divides rounding-sized norms by rounding-sized norms (a ReLU head
# with quiet rows, a head whose W_O has decayed, showed "shares" of 0.4 to 0.98), so it is no
# share. Relative to the layer's own values, as a model's norms have no absolute scale.
SILENT_WRITE_FRACTION = 1e-3


def value_weighted_anchor_share_sums(
    pattern: Float[torch.Tensor, "batch head query key"],
    value_norms: Float[torch.Tensor, "batch head key"],
    anchor: int | Int[torch.Tensor, " batch"] = 0,
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
    nonnegative: bool | None = None,
) -> tuple[Float[torch.Tensor, " head"], Int[torch.Tensor, " head"]]:
    """Sums over selected queries of ||A[i,a] v_a W_O|| / sum_j ||A[i,j] v_j W_O||.
    ``nonnegative``: known of the pattern (a ``masked_cleanly`` one is); None: checked here.

    value_norms from ``projected_value_norms``. Returns (per-head sums, per-head counts);
    queries whose head writes nothing (all terms zero) or almost nothing (attention weights
    summing to less than ``SILENT_ROW_MASS``, as a ReLU head that attends nowhere, or a write
    bound sum_j ||A[i,j] v_j W_O|| below ``SILENT_WRITE_FRACTION`` of the largest projected
    value of any head of the layer for that input) are not counted: a share of rounding
    residue is no share. So ``pattern`` holds every head of its layer.
    """
    batch, n_heads, n_query, _ = pattern.shape
    anchor_index = _anchor_index(anchor, batch, pattern.device)
    # softmax and ReLU-family patterns are non-negative: no [batch, head, query, key] copy
    # for |A| then (at 4,096 tokens one copy is hundreds of MiB), and the sum over keys is
    # one batched matmul that materialises no product either
    if nonnegative is None:
        nonnegative = pattern.numel() == 0 or bool(pattern.amin() >= 0)
    magnitudes = pattern if nonnegative else pattern.abs()
    total = einsum(magnitudes, value_norms.to(magnitudes.dtype), "b h q k, b h k -> b h q")
    anchor_norms = value_norms.gather(-1, anchor_index.view(batch, 1, 1).expand(batch, n_heads, 1))
    largest_value = value_norms.amax(dim=(1, 2)).view(batch, 1, 1) if value_norms.numel() else total
    audible = total >= SILENT_WRITE_FRACTION * largest_value.to(total.dtype)
    speaking = (total > 0) & (magnitudes.sum(dim=-1) >= SILENT_ROW_MASS) & audible
    selected = queries_after_anchor(n_query, anchor_index, batch, query_mask, pattern.device).unsqueeze(1) & speaking
    share = column(magnitudes, anchor_index) * anchor_norms / total.clamp_min(torch.finfo(total.dtype).tiny)
    return (share * selected).sum(dim=(0, 2)), selected.sum(dim=(0, 2))


def masked_cleanly(
    pattern: Float[torch.Tensor, "batch head query key"], visible: Bool[torch.Tensor, "batch query key"]
) -> bool:
    """Whether ``pattern`` is non-negative and exactly zero on every key a query cannot see
    (softmax and ReLU under a mask): sums over keys then need no mask and no copy."""
    if pattern.numel() == 0 or bool(pattern.amin() < 0):
        return False
    return not bool((pattern * (~visible).unsqueeze(1)).any())


def _clean_row_entropy(pattern: Float[torch.Tensor, "batch head query key"]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's entropy after renormalising, H = log m - sum(p log p) / m with m = sum(p),
    of a ``masked_cleanly`` pattern: one temporary instead of four, and each row's mass."""
    tiny = torch.finfo(pattern.dtype).tiny
    mass = pattern.sum(dim=-1)
    plogp = pattern.xlogy(pattern).sum(dim=-1)
    return torch.log(mass.clamp_min(tiny)) - plogp / mass.clamp_min(tiny), mass


def row_entropy_sums(
    pattern: Float[torch.Tensor, "batch head query key"],
    visible: Bool[torch.Tensor, "batch query key"],
    query_mask: Bool[torch.Tensor, "batch query"] | None = None,
    clean: bool | None = None,
) -> tuple[Float[torch.Tensor, " head"], Int[torch.Tensor, " head"]]:
    """Sums of row entropy normalised by log(#visible keys), per head, and counts.

    Rows are renormalised first (non-softmax kinds); rows with fewer than two visible
    keys or no mass are skipped. ``clean``: ``masked_cleanly(pattern, visible)`` where the
    caller knows it (None: checked here). Returns (per-head sums, per-head counts).
    """
    n_visible = visible.sum(dim=-1).unsqueeze(1)
    if clean if clean is not None else masked_cleanly(pattern, visible):
        entropy, mass = _clean_row_entropy(pattern)
    else:
        # one [batch, head, query, key] temporary, updated in place: on a long prompt each
        # full-size copy of the pattern costs hundreds of MiB
        probs = pattern.clamp_min(0).masked_fill_(~visible.unsqueeze(1), 0.0)
        mass = probs.sum(dim=-1)
        probs.div_(mass.unsqueeze(-1).clamp_min(torch.finfo(probs.dtype).tiny))
        entropy = -probs.xlogy_(probs).sum(dim=-1)
    selected = (n_visible >= 2) & (mass > 0)
    if query_mask is not None:
        selected = selected & query_mask.to(device=pattern.device, dtype=torch.bool).unsqueeze(1)
    normalised = entropy / torch.log(n_visible.clamp_min(2).to(entropy.dtype))
    return (normalised * selected).sum(dim=(0, 2)), selected.sum(dim=(0, 2))


@dataclass(frozen=True)
class MassiveActivations:
    """Massive activations of one layer's residual in one batch (Sun et al. 2024).

    ``count``: entries with |x| > abs_threshold and > ratio x the median |x| of their
    prompt (over its real tokens and all of d_model); ``at_anchor``: how many of those
    sit at the anchor token; ``median_abs``: each prompt's median |x|; ``position_max``:
    each position's largest |x| (padding included; the secondary-sink tally reads it). The
    median is per prompt so that no number depends on which prompts share a batch.
    """

    count: int
    at_anchor: int
    max_abs: float
    median_abs: Float[torch.Tensor, " batch"]
    position_max: Float[torch.Tensor, "batch pos"]


def lower_median(values: Float[torch.Tensor, "row n"]) -> Float[torch.Tensor, " row"]:
    """Each row's lower middle value, as ``torch.median`` takes it. On the CPU a selection
    (numpy's introselect) finds it about 10x faster than torch's full sort of each row,
    which made the median a quarter of the audit's cost beyond the forward."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64):
        return values.median(dim=1).values
    middle = (values.shape[1] - 1) // 2
    selected = np.partition(values.detach().numpy(), middle, axis=1)[:, middle]
    return torch.from_numpy(np.ascontiguousarray(selected))


def _row_medians(magnitude: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Each prompt's median |x| over its real tokens ``[batch]``."""
    if bool(real.all()):  # no padding: one batched median (the lower middle value, as below)
        return lower_median(magnitude.flatten(1))
    zero = magnitude.new_zeros(())  # row by row, since rows hold different numbers of real tokens
    return torch.stack(
        [
            lower_median(magnitude[row][real[row]].reshape(1, -1))[0] if real[row].any() else zero
            for row in range(len(real))
        ]
    )


def massive_activations(
    resid: Float[torch.Tensor, "batch pos d_model"],
    real: Bool[torch.Tensor, "batch pos"],
    anchor: Int[torch.Tensor, " batch"],
    abs_threshold: float = 100.0,
    ratio: float = 1000.0,
) -> MassiveActivations:
    """Massive activations of one layer's residual ``resid``; ``real`` marks real tokens,
    ``anchor`` each row's anchor position."""
    magnitude = resid.abs()
    real = real.to(resid.device)
    position_max = magnitude.amax(dim=-1)  # [batch, pos]
    real_max = position_max.masked_fill(~real, 0.0)
    max_abs = float(real_max.max()) if real_max.numel() else 0.0
    median = _row_medians(magnitude, real)
    if max_abs <= abs_threshold:  # no entry can pass: most layers of most models
        return MassiveActivations(0, 0, max_abs, median, position_max)
    limit = torch.clamp(ratio * median.to(magnitude.dtype), min=abs_threshold).view(-1, 1, 1)
    massive = (magnitude > limit) & real.unsqueeze(-1)
    rows = torch.arange(resid.shape[0], device=resid.device)
    return MassiveActivations(int(massive.sum()), int(massive[rows, anchor].sum()), max_abs, median, position_max)


def gate_sums(
    gate: Float[torch.Tensor, "batch pos head *d_head"], queries: Bool[torch.Tensor, "batch pos"]
) -> tuple[Float[torch.Tensor, " head"], Float[torch.Tensor, " head"]]:
    """Per head, the sum over ``queries`` of the gate's mean over its elements (one per
    head, or one per output element), and the number of queries summed."""
    per_head = gate if gate.ndim == 3 else gate.mean(dim=-1)
    weights = queries.to(per_head.dtype).unsqueeze(-1)
    return (per_head * weights).sum(dim=(0, 1)), weights.sum(dim=(0, 1)).expand(per_head.shape[-1])


# where a head's default state lives (docs/metrics.md), checked in this order
DEFAULT_SOURCES: tuple[str, ...] = ("gate", "anchor", "null", "anchor and null", "quiet rows", "none")


def default_source(anchor_mass: float, null: float, row_mass: float, gate: float, sink_eps: float) -> str:
    """Where a head's default state lives, from its means over the default (selected)
    queries, the first rule that holds, each at the sink-head margin ``sink_eps``:
    ``gate`` (the mean gate is at most sink_eps: the head is switched off), ``anchor``
    (anchor mass >= 1 - sink_eps: a sink head), ``null`` (null mass >= 1 - sink_eps),
    ``anchor and null`` (the two together >= 1 - sink_eps), ``quiet rows`` (a kind whose
    rows need not sum to one puts at most sink_eps on all its keys together), else
    ``none`` (no one place holds it). NaN (not measured) satisfies no rule."""
    strong = 1.0 - sink_eps
    if gate <= sink_eps:
        return "gate"
    if anchor_mass >= strong:
        return "anchor"
    if null >= strong:
        return "null"
    if anchor_mass + null >= strong:
        return "anchor and null"
    if math.isnan(null) and row_mass <= sink_eps:
        return "quiet rows"
    return "none"
