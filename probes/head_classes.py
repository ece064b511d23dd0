"""Sink-head classes and the random-key null, summed in the probe's own pass.

Head classes (docs/metrics.md, "Sink-head classes"): a sink head is ``no-op`` when what
the anchor's value writes is small beside the other tokens' (``anchor_projected_value_norm_ratio``
below ``NO_OP_RATIO``), ``broadcast`` when it is not no-op and its update is near rank one
(``update_stable_rank`` below ``BROADCAST_STABLE_RANK``), else ``other``. The value ratio
is the key geometry's anchor norm ratio (``key_geometry.norm_ratios``: ||x_anchor|| over the
median of the prompt's other real tokens, one per prompt, averaged over prompts) taken of
the values after the head's output projection, ||v_j W_O[h]||. The update's stable rank
||M||_F^2 / ||M||_2^2, M the rows z_h W_O[h] at every selected query of every input, comes
from a ``[d_head, d_head]`` sum per head: S = sum_i z_i^T z_i, since M^T M = W_O^T S W_O
has the nonzero eigenvalues of L^T (W_O W_O^T) L for S = L L^T.

The random-key null (docs/metrics.md, "The random-key null"): per prompt one real key k
after the anchor, drawn from a hash of the seed and the prompt's own real tokens, so that the
batch order and length bucketing do not change it (not the last real token, so some query
follows it); per (layer, head, prompt) the mean of A[i, k]
over the selected queries i > k that see k, the anchor mass's statistic at a key with no
special role. ``RANDOM_KEY_PERCENTILE`` of those values, pooled over every probed head and
prompt, is the threshold a head's anchor mass is held against.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Int

from sinkscope.interp.hooked_model import PreparedBatch
from sinkscope.interp.visibility import sees_key
from sinkscope.probes.gate_sums import ratio
from sinkscope.probes.key_geometry import norm_ratios
from sinkscope.probes.sink_metrics import column

NO_OP_RATIO = 0.2  # a no-op sink head's anchor writes under 0.2 of the other tokens' value norm
BROADCAST_STABLE_RANK = 1.5  # the top direction holds over 2/3 of the update's energy
RANDOM_KEY_PERCENTILE = 99.0
HEAD_CLASSES = ("no-op", "broadcast", "other")


def head_class(value_ratio: float, stable_rank: float) -> str | None:
    """A sink head's class from its ``anchor_projected_value_norm_ratio`` and
    ``update_stable_rank``: ``no-op``, ``broadcast`` or ``other``; None when the
    measurement that decides it is missing (NaN)."""
    if math.isnan(value_ratio):
        return None
    if value_ratio < NO_OP_RATIO:
        return "no-op"
    if math.isnan(stable_rank):
        return None
    return "broadcast" if stable_rank < BROADCAST_STABLE_RANK else "other"


def update_gram_sums(
    z: Float[torch.Tensor, "batch pos head d_head"], queries: Bool[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, "head d_head d_head"]:
    """Per head, S = sum over ``queries`` of z_i^T z_i (float64): with the head's output
    Gram W_O W_O^T it gives the stable rank of its update (``update_stable_rank``)."""
    weighted = z.double() * queries.to(device=z.device, dtype=torch.float64)[..., None, None]
    return einsum(weighted, z.double(), "b p h d, b p h e -> h d e")


def update_stable_rank(
    gram_sums: Float[torch.Tensor, "head d_head d_head"], output_gram: Float[torch.Tensor, "head d_head d_head"]
) -> Float[torch.Tensor, " head"]:
    """||M||_F^2 / ||M||_2^2 of each head's update M (rows z_i W_O), from S = M's
    ``update_gram_sums`` before W_O and W_O W_O^T (``sink_metrics.output_gram``): the
    eigenvalues of L^T (W_O W_O^T) L with S = L L^T, their sum over their largest. NaN for
    a head that wrote nothing."""
    values, vectors = torch.linalg.eigh(gram_sums.double())
    factor = vectors * values.clamp_min(0.0).sqrt().unsqueeze(-2)  # L = U diag(sqrt(lambda))
    projected = factor.transpose(-1, -2) @ output_gram.double() @ factor
    eigen = torch.linalg.eigvalsh((projected + projected.transpose(-1, -2)) / 2).clamp_min(0.0)
    top = eigen[..., -1]
    return torch.where(top > 0, eigen.sum(dim=-1) / top.clamp_min(1e-300), math.nan)


def prompt_draws(batch: PreparedBatch, seed: int) -> Float[torch.Tensor, " batch"]:
    """One number u in [0, 1) per prompt, from a hash of ``seed`` and the prompt's real
    tokens (the model input at its real positions): the same prompt draws the same u in any
    batch, at any padding."""
    draws = []
    for row, real in zip(batch.model_input, batch.attention_mask.bool()):
        tokens = row[real.to(row.device)].detach().cpu().contiguous().numpy().tobytes()
        digest = hashlib.blake2b(tokens, digest_size=8, key=seed.to_bytes(8, "little", signed=True)).digest()
        draws.append(int.from_bytes(digest, "little") / 2.0**64)
    return torch.tensor(draws, dtype=torch.float64)


def random_keys(
    attention_mask: Bool[torch.Tensor, "batch pos"], draws: Float[torch.Tensor, " batch"]
) -> tuple[Int[torch.Tensor, " batch"], Bool[torch.Tensor, " batch"]]:
    """Each row's random key: its real token of rank r = 1 + floor(u (n - 2)) (rank 0 the
    anchor, n real tokens, u the row's draw in [0, 1), ``prompt_draws``), and whether the
    row has one (n >= 3)."""
    real = attention_mask.bool().cpu()
    n_real = real.sum(dim=1)
    rank = 1 + (draws.cpu() * (n_real - 2).clamp_min(0)).floor().long()
    ranks = real.long().cumsum(dim=1) - 1
    keys = ((ranks == rank.unsqueeze(1)) & real).long().argmax(dim=1)
    return keys.to(attention_mask.device), (n_real >= 3).to(attention_mask.device)


def key_mass_per_prompt(
    pattern: Float[torch.Tensor, "batch head query key"],
    key: Int[torch.Tensor, " batch"],
    queries: Bool[torch.Tensor, "batch query"],
) -> Float[torch.Tensor, "batch head"]:
    """Per prompt and head, the mean of A[i, key] over ``queries`` i > key; NaN for a prompt
    without such a query."""
    after = torch.arange(pattern.shape[2], device=pattern.device).unsqueeze(0) > key.unsqueeze(1)
    counted = (queries & after).to(pattern.dtype)
    count = counted.sum(dim=1, keepdim=True)
    sums = einsum(column(pattern, key), counted, "b h q, b q -> b h")
    return torch.where(count > 0, sums / count.clamp_min(1), math.nan)


class HeadClassSums:
    """Per-(layer, head) sums of the value ratio, the update's Gram and the random-key
    null, filled by the probe runner's hooks; ``start`` picks each batch's random keys."""

    def __init__(self, n_layers: int, n_heads: int, seed: int) -> None:
        zeros = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.ratio, self.ratio_count = zeros(n_layers, n_heads), zeros(n_layers, n_heads)
        self.gram: dict[int, torch.Tensor] = {}
        self.output_gram: dict[int, torch.Tensor] = {}
        self.key_mass: dict[int, list[torch.Tensor]] = {}  # per layer, [batch, head] per batch
        self.seed = seed
        self._keys: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fields: dict[str, list[list[float]]] | None = None
        self._p99 = math.nan

    def start(self, batch: PreparedBatch) -> None:
        self._keys = random_keys(batch.attention_mask, prompt_draws(batch, self.seed))

    def add_values(self, layer: int, value_norms: Float[torch.Tensor, "batch head pos"], batch: PreparedBatch) -> None:
        """Add one batch's ``projected_value_norms``: each prompt's anchor ratio per head."""
        ratios = norm_ratios(rearrange(value_norms.float(), "b h p -> b p h"), batch).double().cpu()
        valid = ~torch.isnan(ratios)
        self.ratio[layer] += torch.where(valid, ratios, 0.0).sum(dim=0)
        self.ratio_count[layer] += valid.sum(dim=0)

    def add_outputs(self, layer: int, z: torch.Tensor, output_gram: torch.Tensor, queries: torch.Tensor) -> None:
        """Add one batch's ``hook_z`` at the selected ``queries``; ``output_gram``: W_O W_O^T."""
        sums = update_gram_sums(z, queries).cpu()
        self.gram[layer] = sums if layer not in self.gram else self.gram[layer] + sums
        self.output_gram.setdefault(layer, output_gram.double().cpu())

    def add_pattern(self, layer: int, pattern: torch.Tensor, selected: torch.Tensor, visible: torch.Tensor) -> None:
        """Add one batch's mass on its random keys (selected queries that see the key)."""
        assert self._keys is not None, "start(batch) draws the random keys before the pass"
        keys, has_key = (tensor.to(pattern.device) for tensor in self._keys)
        masses = key_mass_per_prompt(pattern, keys, selected & sees_key(visible, keys) & has_key.unsqueeze(1))
        self.key_mass.setdefault(layer, []).append(masses.double().cpu())

    def random_key_p99(self) -> float:
        """``RANDOM_KEY_PERCENTILE`` of the per-(layer, head, prompt) random-key masses
        (numpy's linear interpolation); NaN when none was measured."""
        values = torch.cat([torch.cat(batches).flatten() for batches in self.key_mass.values()] or [torch.zeros(0)])
        values = values[~torch.isnan(values)]
        return float(np.percentile(values.numpy(), RANDOM_KEY_PERCENTILE)) if values.numel() else math.nan

    def head_cells(self, layer: int, head: int, is_sink: bool, anchor_mass: float) -> dict[str, object]:
        """One head's ``HeadProbe`` fields of this module: a sink head's class and the two
        numbers that decide it (NaN and None for the other heads), the random-key mass and
        whether ``anchor_mass`` is above the null's threshold (None: either is NaN)."""
        if self._fields is None:  # every head's, once
            self._fields = self._all_fields()
            self._p99 = self.random_key_p99()
        fields = {name: values[layer][head] for name, values in self._fields.items()}
        if not is_sink:
            fields["anchor_projected_value_norm_ratio"] = fields["update_stable_rank"] = math.nan
        measured = not (math.isnan(anchor_mass) or math.isnan(self._p99))
        return {
            **fields,
            "sink_class": head_class(fields["anchor_projected_value_norm_ratio"], fields["update_stable_rank"])
            if is_sink
            else None,
            "above_random_key_p99": bool(anchor_mass > self._p99) if measured else None,
        }

    def _all_fields(self) -> dict[str, list[list[float]]]:
        """``[layer][head]`` lists of the value ratio, the stable rank and the random-key
        mass (its mean over prompts, one value per prompt, as the percentile pools them);
        NaN where nothing was measured."""
        n_layers, n_heads = self.ratio.shape
        rank = torch.full((n_layers, n_heads), math.nan, dtype=torch.float64)
        for layer, sums in self.gram.items():
            rank[layer] = update_stable_rank(sums, self.output_gram[layer])
        key_mass = torch.full((n_layers, n_heads), math.nan, dtype=torch.float64)
        for layer, batches in self.key_mass.items():
            key_mass[layer] = torch.cat(batches).nanmean(dim=0)
        return {
            "anchor_projected_value_norm_ratio": ratio(self.ratio, self.ratio_count).tolist(),
            "update_stable_rank": rank.tolist(),
            "random_key_mass": key_mass.tolist(),
        }
