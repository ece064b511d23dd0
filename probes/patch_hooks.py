"""Activation patching primitives: copy one hook's activation, or a slice of it, from a
source run into a target run.

A ``PatchSite`` names what to copy: hook ``name`` at ``layer``, optionally some ``heads``
and/or some ``positions`` (their cross product). Hook layouts (TransformerLens conventions):

- ``q``, ``k``, ``v``, ``z``: ``[batch, pos, head, d_head]``: head axis 2, position axis 1
  (under grouped- or multi-query attention ``k`` and ``v`` hold the ``n_kv_heads``
  key/value heads, so a head index there names a kv head);
- ``attn_scores``, ``pattern``: ``[batch, head, query, key]``: head axis 1, and a
  position selects QUERY rows (axis 2), i.e. how those queries attend;
- ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``:
  ``[batch, pos, d_model]``: no head axis, position axis 1.

Source activations are captured once per source batch with ``run_with_cache`` and a
``names_filter`` that keeps only the hooks being patched (``capture_activations``);
``patch_hooks`` turns sites plus that cache into forward hooks for ``run_with_hooks``.
Several sites on the same hook compose into one hook.

Bridges can expose hooks whose edits never reach the output (BERT-family attention
patterns and scores); ``hook_reaches_output`` detects that, so callers can refuse to
patch instead of silently measuring nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import ATTN_HOOKS, BLOCK_HOOKS, attn_hook, block_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel, PreparedBatch

PATCHABLE_HOOKS: tuple[str, ...] = ATTN_HOOKS + BLOCK_HOOKS
HEAD_HOOKS: tuple[str, ...] = ATTN_HOOKS


@dataclass(frozen=True)
class HookLayout:
    """Which tensor axis holds heads (None: no head axis) and which holds positions
    (the query axis for ``attn_scores``/``pattern``)."""

    head_axis: int | None
    position_axis: int


def validate_hook(name: str) -> str:
    """``name`` if it is a patchable short hook name; otherwise a ValueError listing them."""
    if name not in PATCHABLE_HOOKS:
        raise InputError(f"unknown hook {name!r}; choose one of {', '.join(PATCHABLE_HOOKS)}")
    return name


def hook_layout(name: str) -> HookLayout:
    """The layout of a short hook name such as ``"z"`` or ``"resid_pre"``."""
    validate_hook(name)
    if name in ("attn_scores", "pattern"):
        return HookLayout(head_axis=1, position_axis=2)
    if name in HEAD_HOOKS:
        return HookLayout(head_axis=2, position_axis=1)
    return HookLayout(head_axis=None, position_axis=1)


def full_hook_name(layer: int, name: str) -> str:
    """``blocks.{layer}.attn.hook_{name}`` or ``blocks.{layer}.hook_{name}``."""
    return attn_hook(layer, name) if validate_hook(name) in ATTN_HOOKS else block_hook(layer, name)


@dataclass(frozen=True)
class PatchSite:
    """Hook ``name`` (short, e.g. ``"z"``) at ``layer``; ``heads`` None means all heads,
    ``positions`` None means all positions (query rows for patterns)."""

    layer: int
    name: str
    heads: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        layout = hook_layout(self.name)
        if self.heads is not None and layout.head_axis is None:
            raise InputError(
                f"hook {self.name!r} has no head axis; patch it per position, or choose a head hook "
                f"({', '.join(HEAD_HOOKS)})"
            )
        for axis, chosen in (("heads", self.heads), ("positions", self.positions)):
            if chosen is not None and not chosen:
                raise InputError(f"{axis} must name at least one index, or be None for all")

    @property
    def hook_name(self) -> str:
        return full_hook_name(self.layer, self.name)


def _axis_mask(target: torch.Tensor, axis: int, indices: tuple[int, ...], what: str, hook_name: str) -> torch.Tensor:
    """Bool mask broadcastable to ``target``, True at ``indices`` along ``axis``."""
    size = target.shape[axis]
    if not all(0 <= index < size for index in indices):
        raise InputError(f"{what} {list(indices)} must lie in 0..{size - 1} at {hook_name}")
    shape = [1] * target.ndim
    shape[axis] = size
    mask = torch.zeros(shape, dtype=torch.bool, device=target.device)
    mask.view(-1)[list(indices)] = True
    return mask


def patch_activation(target: torch.Tensor, source: torch.Tensor, site: PatchSite) -> torch.Tensor:
    """``target`` with the ``site`` slice (its heads x its positions) taken from ``source``.

    Both tensors have the hook's layout and the same shape; the result is a new tensor.
    """
    if source.shape != target.shape:
        raise InputError(
            f"source activation {tuple(source.shape)} at {site.hook_name} does not match the target's "
            f"{tuple(target.shape)}; source and target inputs must have the same shape"
        )
    layout = hook_layout(site.name)
    mask = torch.ones((), dtype=torch.bool, device=target.device)
    if site.heads is not None and layout.head_axis is not None:  # Site refuses heads on a hook without them
        mask = mask & _axis_mask(target, layout.head_axis, site.heads, "heads", site.hook_name)
    if site.positions is not None:
        mask = mask & _axis_mask(target, layout.position_axis, site.positions, "positions", site.hook_name)
    return torch.where(mask, source.to(target.device, target.dtype), target)


def patch_hooks(sites: Sequence[PatchSite], source: Mapping[str, torch.Tensor]) -> FwdHooks:
    """Forward hooks that write every site's slice of ``source`` (hook name -> activation,
    e.g. from ``capture_activations``) into the running activations."""
    by_hook: dict[str, list[PatchSite]] = {}
    for site in sites:
        if site.hook_name not in source:
            raise InputError(f"no source activation for {site.hook_name}; capture it with capture_activations first")
        by_hook.setdefault(site.hook_name, []).append(site)

    def make(name: str, group: list[PatchSite]) -> Callable[..., torch.Tensor]:
        def hook(activation: torch.Tensor, hook: Any) -> torch.Tensor:
            for site in group:
                activation = patch_activation(activation, source[name], site)
            return activation

        return hook

    return [(name, make(name, group)) for name, group in by_hook.items()]


def capture_activations(
    model: HookedModel, batch: PreparedBatch, hook_names: Sequence[str]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward pass of ``batch`` that caches only ``hook_names``.

    Returns the model output (toy outputs ``[batch, pos, d_model]`` or logits
    ``[batch, pos, vocab]``) and {hook name: activation}.
    """
    wanted = frozenset(hook_names)
    model.spec.require_hooks(sorted(wanted), "activation patching")
    with torch.no_grad():
        output, cache = model.model.run_with_cache(
            batch.model_input, names_filter=lambda name: name in wanted, **model.forward_kwargs(batch)
        )
    return output, {name: cache[name] for name in wanted}


def run_patched(
    model: HookedModel, target: PreparedBatch, sites: Sequence[PatchSite], source: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """The output of ``target`` with every site patched from ``source``."""
    with torch.no_grad():
        return model.run_with_hooks(target, patch_hooks(sites, source))


def hook_reaches_output(model: HookedModel, batch: PreparedBatch, hook_name: str, seed: int = 0) -> bool:
    """Whether adding seeded Gaussian noise (scaled to the activation) at ``hook_name``
    changes the output of ``batch``; False for read-only hooks (e.g. BERT-bridge patterns).

    Random noise, not a constant shift: softmax ignores a constant added to a score row
    (and so to ``k``) and LayerNorm ignores one added to the residual stream.
    """

    def perturb(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(activation.shape, generator=generator).to(activation.device, activation.dtype)
        finite = activation[torch.isfinite(activation)]
        scale = float(finite.float().std()) if finite.numel() > 1 else 0.0
        return activation + (scale + 1.0) * noise

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only bridge hooks warn that the edit is discarded
        plain = model.forward(batch)
        edited = model.run_with_hooks(batch, [(hook_name, perturb)])
    return not torch.equal(plain, edited)
