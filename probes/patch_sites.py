"""Which sites an activation patching run patches: the iterated axes (``per``), checked
against the model, and one ``PatchSite`` per combination of them."""

from __future__ import annotations

from collections.abc import Sequence

from sinkscope.infra.errors import InputError
from sinkscope.interp.model_spec import ModelSpec
from sinkscope.probes.patch_hooks import PatchSite, hook_layout

PATCH_AXES: tuple[str, ...] = ("layer", "head", "position")


def validate_per(per: Sequence[str]) -> tuple[str, ...]:
    axes = (per,) if isinstance(per, str) else tuple(per)
    unknown = [axis for axis in axes if axis not in PATCH_AXES]
    if unknown or "layer" not in axes or len(set(axes)) != len(axes):
        raise InputError(
            f"per={axes} is not valid; use ('layer',), ('layer', 'head'), ('layer', 'position') "
            "or ('layer', 'head', 'position')"
        )
    return tuple(axis for axis in PATCH_AXES if axis in axes)


def _indices(name: str, chosen: Sequence[int] | None, size: int) -> tuple[int, ...] | None:
    """``chosen`` as a sorted tuple checked against ``range(size)`` (None stays None)."""
    if chosen is None:
        return None
    indices = tuple(sorted({int(index) for index in chosen}))
    if not indices or not all(0 <= index < size for index in indices):
        raise InputError(f"{name} {list(chosen)} must be a non-empty subset of 0..{size - 1}")
    return indices


def _sites(
    hook: str,
    axes: tuple[str, ...],
    layers: tuple[int, ...],
    heads: tuple[int, ...] | None,
    positions: tuple[int, ...] | None,
    n_heads: int,
    n_pos: int,
) -> list[PatchSite]:
    """One site per combination of the iterated axes; a non-iterated axis keeps its
    restriction (None: all) in every site."""
    head_sites = [(head,) for head in heads or range(n_heads)] if "head" in axes else [heads]
    position_sites = [(pos,) for pos in positions or range(n_pos)] if "position" in axes else [positions]
    return [
        PatchSite(layer, hook, heads=head_site, positions=position_site)
        for layer in layers
        for head_site in head_sites
        for position_site in position_sites
    ]


def checked_sites(
    spec: ModelSpec,
    hook: str,
    axes: tuple[str, ...],
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    positions: Sequence[int] | None,
    n_pos: int,
) -> tuple[list[PatchSite], tuple[int, ...] | None, tuple[int, ...] | None]:
    """The sites to patch, with the checked head and position restrictions (None: all)."""
    layer_list = _indices("layers", layers, spec.n_layers) or spec.pattern_layers
    # k and v carry n_kv_heads heads under grouped-query attention: their sites are kv heads
    n_hook_heads = spec.heads_of(hook)
    head_list = _indices("heads", heads, n_hook_heads)
    position_list = _indices("positions", positions, n_pos)
    sites = _sites(hook, axes, layer_list, head_list, position_list, n_hook_heads, n_pos)
    return sites, head_list, position_list


def check_hook_heads(hook: str, axes: tuple[str, ...], heads: Sequence[int] | None) -> None:
    """Refuse a head axis or a head restriction on a hook without heads."""
    has_heads = hook_layout(hook).head_axis is not None
    if not has_heads and ("head" in axes or heads is not None):
        raise InputError(
            f"hook {hook!r} has no head axis; use per=('layer', 'position') or a head hook (q, k, v, z, attn_scores, pattern)"
        )
