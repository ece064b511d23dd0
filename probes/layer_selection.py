"""Which layers a probe runs on: the ``layers`` selection of ``ProbeConfig`` and
``AuditConfig`` checked, sorted, and written as a reader writes it."""

from __future__ import annotations

import numbers
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from sinkscope.infra.errors import InputError

if TYPE_CHECKING:
    from sinkscope.interp.model_spec import ModelSpec


def layer_selection(layers: Any) -> tuple[int, ...] | None:
    """``layers`` (any sequence of layer indices, e.g. ``range(4)``, or None for every
    layer) as a sorted tuple without repeats; an ``InputError`` naming ``layers`` for
    anything else."""
    if layers is None:
        return None
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise InputError(f"layers must be a list of layer indices such as [0, 3] or None, got {layers!r}", "layers")
    chosen = tuple(layers)
    # numpy's integers are integers too (numbers.Integral); a bool is not a layer
    if any(isinstance(layer, bool) or not isinstance(layer, numbers.Integral) for layer in chosen):
        raise InputError(f"layers must hold integers, got {chosen!r}; pass indices such as [0, 3]", field="layers")
    if not chosen:
        raise InputError("layers is empty; name at least one layer index, or pass None for every layer", "layers")
    if min(chosen) < 0:
        raise InputError(f"layers are counted from 0, got {min(chosen)}; pass indices >= 0 such as [0, 3]", "layers")
    return tuple(sorted({int(layer) for layer in chosen}))


def check_layers(layers: tuple[int, ...] | None, n_layers: int, model: str = "the model") -> None:
    """An ``InputError`` naming the model's layer count when a chosen layer is not one of its."""
    outside_model = [layer for layer in layers or () if layer >= n_layers]
    if outside_model:
        raise InputError(
            f"layer {outside_model[0]} is out of range: {model} has {n_layers} layers, "
            f"numbered 0 to {n_layers - 1}; choose layers in that range",
            field="layers",
        )


def probed_layers(layers: tuple[int, ...] | None, n_layers: int, no_pattern: Collection[int] = ()) -> tuple[int, ...]:
    """The layers a probe with ``layers`` runs on, in an ``n_layers``-layer model whose
    layers ``no_pattern`` have no attention pattern (``ModelSpec.no_pattern_layers``):
    every other layer when ``layers`` is None."""
    return tuple(layer for layer in range(n_layers) if layer not in no_pattern) if layers is None else layers


def check_pattern_layers(layers: tuple[int, ...] | None, spec: ModelSpec) -> None:
    """An ``InputError`` when a chosen layer is one without an attention pattern."""
    kinds = {row.layer: row.kind for row in spec.no_pattern_layers}
    chosen = [layer for layer in layers or () if layer in kinds]
    if chosen:
        raise InputError(
            f"layer {chosen[0]} has no attention pattern ({kinds[chosen[0]]}); choose among the attention "
            f"layers {layers_text(spec.pattern_layers)}",
            field="layers",
        )


def no_pattern_note(spec: ModelSpec) -> tuple[str, ...]:
    """What a probe of a model with layers without an attention pattern says (nothing otherwise)."""
    if not spec.no_pattern_layers:
        return ()
    kinds = sorted({row.kind for row in spec.no_pattern_layers})
    skipped = layers_text(tuple(row.layer for row in spec.no_pattern_layers))
    return (
        f"layers {skipped} of {spec.n_layers} have no attention pattern ({', '.join(kinds)}): every probe reads "
        f"the {len(spec.pattern_layers)} attention layers only, and heads, sink heads, the sink rate and the "
        "layer-output norms are over them",
    )


def layers_text(layers: tuple[int, ...] | None) -> str:
    """``layers`` as a reader writes them: ``all``, or runs such as ``0-3, 7``."""
    if layers is None:
        return "all"
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def layers_note(layers: tuple[int, ...] | None, n_layers: int) -> tuple[str, ...]:
    """What a probe of some layers only says about its numbers (nothing for every layer)."""
    if layers is None or len(layers) == n_layers:
        return ()
    return (
        f"layers {layers_text(layers)} of {n_layers} probed (layers): heads, sink heads, the sink rate and "
        "the layer-output norms are over these layers only",
    )


def layers_setting(layers: tuple[int, ...] | None) -> tuple[str, str]:
    """The settings line of a probe's or an audit's ``layers``, for ``config_block``."""
    return "layers probed", layers_text(layers)


def normalisation_notes(spec: ModelSpec) -> tuple[str, ...]:
    """A note when the model's attention is not normalised (none when it is)."""
    if spec.normalised:
        return ()
    return (
        f"{spec.attention} attention is not normalised: pattern rows need not sum to one, "
        "and row_entropy is computed on renormalised rows",
    )
