"""Interventions on attention heads, for any set of (layer, head), on any hooked model.

Kinds (docs/metrics.md):
- ``remove_sink``: zero A[i, a] for every query after the anchor and renormalise the
  rest of the row (softmax heads; other kinds are only zeroed, since their rows are not
  normalised). A row left with no mass becomes zero: the head writes nothing.
- ``evict_anchor``: mask the anchor key for ALL queries, the anchor's own row included
  (the eviction StreamingLLM avoids by keeping the first tokens), renormalising likewise.
- ``redirect_to_sink``: replace each real row by one-hot on the anchor (head made dormant).
- ``mask_random_key``: the matched control for ``remove_sink``: every query after the
  anchor loses one visible non-anchor key, drawn uniformly with ``seed``, renormalised.

Renormalising after a key is masked follows the kind: softmax rows are divided by what is
left of them; the kinds with a null slot (``softmax1``, ``learned_sink``, ``kv_bias``) divide
by 1 - the removed mass, as their softmax would with that key's logit at -inf, so the
null's share grows with the rest; the other kinds are only zeroed.
- ``remove_learned_sink``: for models with learned per-head sink logits (gpt-oss), give
  the sink logit's share to the real keys: every row of the head renormalised over its
  visible keys, as the model computes it with that head's sink logit at -inf.
- ``remove_null``: the same edit for every model whose null is one more logit in its
  softmax (learned sink logits, a key/value bias slot, ``softmax1``): the null's share
  goes to the real keys in proportion, and a bias slot's value v' is no longer written
  (the toy layer writes v' with weight 1 - row sum, read after ``hook_pattern``).
- ``open_gate``: a gated model's gate (``hook_gate``) forced to 1 for the heads.
- ``zero_head``: the head's ``z`` (its output before W_O) set to zero.
- ``mean_ablate_head``: the head's ``z`` replaced by its per-position mean over a
  reference set (``head_means`` in sinkscope.probes.head_ablations).

How they are applied: ``zero_head``/``mean_ablate_head`` write at ``hook_z``. Pattern
edits write at ``hook_pattern`` where edits there reach the output (toy models, GPT-2,
GPT-NeoX bridges). Where ``hook_pattern`` is read-only (BERT-family bridges, whose
wrapped module fires it after computing ``z``), they are applied as
``z' = pattern' @ v`` at ``hook_z``: one capture pass per edited layer records that
layer's pattern and values (with the earlier layers' edits in place), then the returned
hooks write the recomputed ``z``. Either way the output changes; nothing is silently
skipped.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from jaxtyping import Float, Shaped

from sinkscope.infra.arguments import check_seed
from sinkscope.infra.errors import InputError
from sinkscope.interp.attention_kinds import GATED_KINDS, NULL_SLOT_KINDS
from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel, ModelInput, ModelOutput, PreparedBatch
from sinkscope.interp.learned_sinks import has_learned_sinks, has_null_slot
from sinkscope.interp.visibility import sees_key
from sinkscope.probes.pattern_edits import mask_keys, one_hot_rows, renormalise_rows

InterventionKind = Literal[
    "remove_sink",
    "evict_anchor",
    "redirect_to_sink",
    "mask_random_key",
    "remove_learned_sink",
    "remove_null",
    "open_gate",
    "zero_head",
    "mean_ablate_head",
]
INTERVENTION_KINDS: tuple[str, ...] = get_args(InterventionKind)
PATTERN_KINDS: tuple[str, ...] = (
    "remove_sink",
    "evict_anchor",
    "redirect_to_sink",
    "mask_random_key",
    "remove_learned_sink",
    "remove_null",
)
HeadRef = tuple[int, int]


@dataclass(frozen=True)
class HeadMeans:
    """Mean head outputs over a reference set: z, averaged over the real tokens at each
    position."""

    z: Float[torch.Tensor, "layer pos head d_head"]
    n_inputs: int


@dataclass(frozen=True)
class Intervention:
    """One intervention on a set of (layer, head) pairs; build it with the helpers below."""

    kind: InterventionKind
    heads: tuple[HeadRef, ...]
    seed: int = 0
    means: HeadMeans | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if self.kind not in INTERVENTION_KINDS:
            raise InputError(f"unknown intervention {self.kind!r}; choose one of {', '.join(INTERVENTION_KINDS)}")
        if not self.heads:
            raise InputError(f"{self.kind} needs at least one (layer, head) pair")
        if self.kind == "mean_ablate_head" and self.means is None:
            raise InputError(
                "mean_ablate_head needs means=head_means(model, reference_inputs) (sinkscope.probes.head_ablations)"
            )

    def layers(self) -> list[int]:
        return sorted({layer for layer, _ in self.heads})

    def heads_in(self, layer: int) -> list[int]:
        return sorted({head for head_layer, head in self.heads if head_layer == layer})


HEAD_NAME = re.compile(r"L(\d+)H(\d+)")  # how tables and findings name a head: L3H7


def _heads(heads: Sequence[HeadRef] | Sequence[str]) -> tuple[HeadRef, ...]:
    """(layer, head) pairs of whole numbers, or the names tables print (``"L3H7"``)."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence):
        raise InputError(
            f"heads must be a list of (layer, head) pairs or names like 'L0H3', got {type(heads).__name__} {heads!r}",
            field="heads",
        )
    return tuple(_head(item) for item in heads)


def _head(item: object) -> HeadRef:
    if isinstance(item, str) and (named := HEAD_NAME.fullmatch(item.strip())):
        return int(named.group(1)), int(named.group(2))
    pair = tuple(item) if isinstance(item, (tuple, list)) else ()
    try:  # any whole number (numpy's, a 0-d integer tensor), never a float or a bool
        if len(pair) != 2 or any(isinstance(x, bool) for x in pair):
            raise TypeError
        return operator.index(pair[0]), operator.index(pair[1])
    except TypeError:
        raise InputError(
            f"each head is a (layer, head) pair of integers or a name like 'L0H3', got {item!r}", field="heads"
        ) from None


def remove_sink(heads: Sequence[HeadRef]) -> Intervention:
    return Intervention("remove_sink", _heads(heads))


def evict_anchor(heads: Sequence[HeadRef]) -> Intervention:
    return Intervention("evict_anchor", _heads(heads))


def redirect_to_sink(heads: Sequence[HeadRef]) -> Intervention:
    return Intervention("redirect_to_sink", _heads(heads))


def mask_random_key(heads: Sequence[HeadRef], seed: int = 0) -> Intervention:
    return Intervention("mask_random_key", _heads(heads), seed=seed)


def remove_learned_sink(heads: Sequence[HeadRef]) -> Intervention:
    """Zero the learned sink's share of the heads' rows (models with learned sink logits)."""
    return Intervention("remove_learned_sink", _heads(heads))


def remove_null(heads: Sequence[HeadRef]) -> Intervention:
    """Give the null's share of the heads' rows to their keys, and drop a bias slot's value."""
    return Intervention("remove_null", _heads(heads))


def open_gate(heads: Sequence[HeadRef]) -> Intervention:
    """Force the heads' gate open (1) at every position (gated kinds)."""
    return Intervention("open_gate", _heads(heads))


def zero_head(heads: Sequence[HeadRef]) -> Intervention:
    return Intervention("zero_head", _heads(heads))


def mean_ablate_head(heads: Sequence[HeadRef], means: HeadMeans) -> Intervention:
    return Intervention("mean_ablate_head", _heads(heads), means=means)


def _keys_for(model: HookedModel, batch: PreparedBatch, intervention: Intervention, layer: int) -> torch.Tensor:
    """``[batch, query]`` key to mask per row (-1 = none) for a key-masking intervention on
    ``layer``: only keys the query sees there (a sliding window or chunk may hide the anchor)."""
    positions = torch.arange(batch.n_pos, device=batch.anchor.device)
    anchor = batch.anchor.unsqueeze(1)
    visible = model.visible_keys(batch, layer)
    real = batch.attention_mask & sees_key(visible, batch.anchor)
    after = real & (positions.unsqueeze(0) > anchor)
    none = torch.full_like(real, -1, dtype=torch.long)
    if intervention.kind == "remove_sink":
        return torch.where(after, anchor.expand_as(none), none)
    if intervention.kind == "evict_anchor":
        return torch.where(real, anchor.expand_as(none), none)
    # mask_random_key, matched to remove_sink (the queries that see the anchor): uniform over
    # the other keys each query sees
    candidates = visible & (positions.view(1, 1, -1) != anchor.unsqueeze(-1))
    generator = torch.Generator().manual_seed(intervention.seed)
    draws = torch.rand(candidates.shape, generator=generator).to(candidates.device)
    draws = draws.masked_fill(~candidates, -1.0)
    choice = draws.argmax(dim=-1)
    return torch.where(after & candidates.any(dim=-1), choice, none)


def edit_pattern(
    model: HookedModel,
    batch: PreparedBatch,
    intervention: Intervention,
    layer: int,
    pattern: Float[torch.Tensor, "batch head query key"],
) -> Float[torch.Tensor, "batch head query key"]:
    """The edited pattern of ``layer`` under a pattern intervention."""
    heads = intervention.heads_in(layer)
    if intervention.kind in ("remove_learned_sink", "remove_null"):
        return renormalise_rows(pattern, heads)
    if intervention.kind == "redirect_to_sink":
        positions = torch.arange(batch.n_pos, device=batch.anchor.device)
        rows = batch.attention_mask & (positions.unsqueeze(0) >= batch.anchor.unsqueeze(1))
        # a query whose window or chunk hides the anchor keeps its row: it cannot attend there
        rows = rows & sees_key(model.visible_keys(batch, layer), batch.anchor)
        return one_hot_rows(pattern, batch.anchor, rows, heads)
    keys = _keys_for(model, batch, intervention, layer)
    null_slot = model.spec.attention in NULL_SLOT_KINDS
    return mask_keys(pattern, keys, heads, renormalise=model.spec.normalised or null_slot, null_slot=null_slot)


# hooks ---------------------------------------------------------------------------------
def _z_head_hook(heads: list[int], replacement: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
        edited = z.clone()
        edited[:, :, heads] = replacement(z)[:, :, heads].to(z.dtype)
        return edited

    return hook


def _gate_open_hook(heads: list[int]) -> Callable[..., torch.Tensor]:
    def hook(gate: torch.Tensor, hook: Any) -> torch.Tensor:
        opened = gate.clone()
        opened[:, :, heads] = 1.0  # [batch, pos, head] or [batch, pos, head, d_head]
        return opened

    return hook


def _means_of(intervention: Intervention) -> HeadMeans:
    assert intervention.means is not None  # mean_ablate_head always carries its means
    return intervention.means


def _constant(value: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A replacement that ignores what it replaces (a recomputed ``z``)."""
    return lambda _: value


def _mean_replacement(means: HeadMeans, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def replacement(z: torch.Tensor) -> torch.Tensor:
        if z.shape[1] > means.z.shape[1]:
            raise InputError(
                f"inputs of {z.shape[1]} positions are longer than the mean-ablation reference set "
                f"({means.z.shape[1]}); compute head_means on inputs at least as long"
            )
        return means.z[layer, : z.shape[1]].to(z.device).unsqueeze(0).expand_as(z)

    return replacement


def intervention_hooks(model: HookedModel, batch: PreparedBatch, intervention: Intervention) -> FwdHooks:
    """Forward hooks that apply ``intervention`` to ``batch`` in ``model.run_with_hooks``.

    For pattern edits on models whose ``hook_pattern`` is read-only this runs one
    capture pass per edited layer first (see the module docstring).
    """
    spec = model.spec
    _refuse_what_the_model_lacks(model, intervention)
    if intervention.kind == "open_gate":
        return [
            (attn_hook(layer, "gate"), _gate_open_hook(intervention.heads_in(layer))) for layer in intervention.layers()
        ]
    if intervention.kind == "zero_head":
        return [
            (attn_hook(layer, "z"), _z_head_hook(intervention.heads_in(layer), torch.zeros_like))
            for layer in intervention.layers()
        ]
    if intervention.kind == "mean_ablate_head":
        return [
            (
                attn_hook(layer, "z"),
                _z_head_hook(intervention.heads_in(layer), _mean_replacement(_means_of(intervention), layer)),
            )
            for layer in intervention.layers()
        ]
    if spec.pattern_writable:
        return [
            (attn_hook(layer, "pattern"), _pattern_hook(model, batch, intervention, layer))
            for layer in intervention.layers()
        ]
    spec.require_hooks(
        [attn_hook(layer, name) for layer in intervention.layers() for name in ("v", "z", "pattern")],
        f"{intervention.kind} on a model with read-only attention patterns",
    )
    hooks: FwdHooks = []
    for layer in intervention.layers():
        captured: dict[str, torch.Tensor] = {}

        def capture(name: str) -> Callable[..., None]:
            def hook(tensor: torch.Tensor, hook: Any) -> None:
                captured[name] = tensor.detach()  # noqa: B023 (used within this iteration)

            return hook

        with torch.no_grad():
            model.run_with_hooks(
                batch,
                hooks + [(attn_hook(layer, "pattern"), capture("pattern")), (attn_hook(layer, "v"), capture("v"))],
            )
        edited = edit_pattern(model, batch, intervention, layer, captured["pattern"])
        # [batch, pos, head, d_head]
        values = spec.expand_kv(captured["v"])  # one value per query head under grouped-query attention
        recomputed = (edited @ values.transpose(1, 2)).transpose(1, 2)
        hooks.append((attn_hook(layer, "z"), _z_head_hook(intervention.heads_in(layer), _constant(recomputed))))
    return hooks


def _refuse_what_the_model_lacks(model: HookedModel, intervention: Intervention) -> None:
    """One line naming what the model has, when it lacks a head, the learned sinks, the null
    slot or the gate that ``intervention`` acts on."""
    spec, kind = model.spec, intervention.kind
    for layer, head in intervention.heads:
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise InputError(
                f"head ({layer}, {head}) does not exist; layers 0..{spec.n_layers - 1}, heads 0..{spec.n_heads - 1}"
            )
        if layer not in spec.pattern_layers:
            raise InputError(
                f"layer {layer} of head ({layer}, {head}) has no attention heads (it is linear attention); "
                f"choose heads of the attention layers {', '.join(map(str, spec.pattern_layers))}"
            )
    if kind == "remove_learned_sink" and not has_learned_sinks(model):
        if has_null_slot(model):  # a toy kind with a null slot, learned_sink's included
            raise InputError(
                f"remove_learned_sink is for pretrained models with learned sink logits (gpt-oss); this toy "
                f"model's {spec.attention} attention has a null slot: use remove_null"
            )
        raise InputError(
            "remove_learned_sink needs a model with learned sink logits (gpt-oss); this model's attention rows "
            "already sum to one over its keys, so use remove_sink to take the anchor away"
        )
    attention = spec.attention
    if kind == "remove_null" and not has_null_slot(model):
        why = (
            "softpick's null is its rows' own emptiness, not a slot that can be taken away"
            if attention == "softpick"
            else f"this model's {attention} attention has none"
        )
        raise InputError(
            f"remove_null needs a model with a null slot ({', '.join(NULL_SLOT_KINDS)}, or learned sink logits); "
            f"{why}: use remove_sink to take the anchor away"
        )
    if kind == "open_gate" and attention not in GATED_KINDS:
        raise InputError(
            f"open_gate needs a gated model ({', '.join(GATED_KINDS)}); this model's attention is {attention}, "
            "with no gate to open"
        )


def _pattern_hook(
    model: HookedModel, batch: PreparedBatch, intervention: Intervention, layer: int
) -> Callable[..., torch.Tensor]:
    def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
        return edit_pattern(model, batch, intervention, layer, pattern)

    return hook


# one-call helpers ----------------------------------------------------------------------
def _as_hooked(model: torch.nn.Module | HookedModel) -> HookedModel:
    return model if isinstance(model, HookedModel) else HookedModel(model)


def run_with_intervention(
    model: torch.nn.Module | HookedModel,
    inputs: ModelInput | str | Sequence[str],
    intervention: Intervention,
    attention_mask: Shaped[torch.Tensor, "batch pos"] | None = None,
) -> ModelOutput:
    """The model's output (toy outputs or logits) with ``intervention`` applied."""
    hooked = _as_hooked(model)
    batch = hooked.prepare(inputs, attention_mask)
    with torch.no_grad():
        return hooked.run_with_hooks(batch, intervention_hooks(hooked, batch, intervention))
