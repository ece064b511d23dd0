"""What a hooked model offers to probes, as results record it: sizes, grouped-query heads,
causality, the attention kind, the BOS convention, sliding windows and chunks, the layers
without an attention pattern (hybrids' linear-attention layers), and the hook names a live
model exposes (``sinkscope.interp.hooked_model`` builds it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float

from sinkscope.infra.bounds import COUNT, POSITIVE
from sinkscope.infra.errors import InputError
from sinkscope.interp.attention_kinds import NORMALISED_KINDS
from sinkscope.interp.visibility import REACH_BOUNDS, check_reach

# hooks that carry key/value heads (fewer than the query heads under grouped-query attention)
KV_HOOKS: frozenset[str] = frozenset({"k", "v", "rot_k"})


@dataclass(frozen=True)
class NoPatternLayer:
    """A layer with no attention pattern for probes to read: a hybrid model's linear-attention
    layer (Qwen3-Next's Gated DeltaNet). ``kind``: what the layer is, in words."""

    BOUNDS = {"layer": COUNT}

    layer: int
    kind: str


@dataclass(frozen=True)
class ModelSpec:
    """What a hooked model offers to probes.

    ``family`` is ``"toy"`` or ``"bridge"``; ``prepend_bos`` records the BOS convention used to
    tokenize strings (None for toy models, whose anchor is their BOS token). ``n_kv_heads``: key/value
    heads; fewer than ``n_heads`` under grouped-query attention (Llama, Mistral, Qwen2, SmolLM: query
    head h reads kv head h // (n_heads / n_kv_heads), transformers' ``repeat_kv`` order), one under
    multi-query attention; None reads as ``n_heads`` (files written before it was recorded).
    ``sliding_windows`` / ``attention_chunks``: see ``sinkscope.interp.visibility``.
    ``no_pattern_layers``: the layers without an attention pattern, ascending (a hybrid's
    linear-attention layers); every probe reads the other layers only (``pattern_layers``).
    """

    BOUNDS = {**dict.fromkeys(["n_layers", "n_heads", "d_head", "d_model", "n_kv_heads"], POSITIVE), **REACH_BOUNDS}

    family: str
    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    causal: bool
    attention: str
    pattern_writable: bool
    prepend_bos: bool | None
    n_kv_heads: int | None = None
    sliding_windows: tuple[int, ...] = ()
    attention_chunks: tuple[int, ...] = ()
    no_pattern_layers: tuple[NoPatternLayer, ...] = ()
    # not persisted: a spec read from a result file describes the model, it cannot
    # vouch for a live model's hooks
    hook_names: frozenset[str] = field(default=frozenset(), repr=False, metadata={"persist": False})

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise InputError(
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}; "
                "check the model config's num_key_value_heads"
            )
        check_reach(self.n_layers, self.sliding_windows, self.attention_chunks)
        skipped = [row.layer for row in self.no_pattern_layers]
        if skipped != sorted(set(skipped)) or any(layer >= self.n_layers for layer in skipped):
            raise InputError(f"no_pattern_layers {skipped} must be distinct layers below n_layers={self.n_layers}")
        if skipped and len(skipped) == self.n_layers:
            raise InputError("no_pattern_layers names every layer: a model without attention has nothing to probe")

    @property
    def pattern_layers(self) -> tuple[int, ...]:
        """The layers with an attention pattern, ascending: every layer but ``no_pattern_layers``."""
        skipped = {row.layer for row in self.no_pattern_layers}
        return tuple(layer for layer in range(self.n_layers) if layer not in skipped)

    @property
    def kv_heads(self) -> int:
        """``n_kv_heads`` once set (``__post_init__`` fills None with ``n_heads``)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.kv_heads

    def heads_of(self, hook: str) -> int:
        """Heads on the head axis of a short attention hook name: ``n_kv_heads`` for
        ``k``/``v`` (and rotary ``rot_k``), ``n_heads`` otherwise."""
        return self.kv_heads if hook in KV_HOOKS else self.n_heads

    def expand_kv(
        self, tensor: Float[torch.Tensor, "batch pos kv_head d_head"], head_axis: int = 2
    ) -> Float[torch.Tensor, "batch pos head d_head"]:
        """A ``hook_k``/``hook_v`` tensor with one head per query head: kv head g repeated
        ``kv_group`` times in place; unchanged without GQA. The shapes shown are those of
        the default ``head_axis=2``; another ``head_axis`` names where the heads lie."""
        if tensor.shape[head_axis] == self.n_heads:
            return tensor
        if tensor.shape[head_axis] != self.n_kv_heads:
            raise ValueError(
                f"expected {self.n_kv_heads} key/value heads on axis {head_axis}, got shape {tuple(tensor.shape)}"
            )
        return tensor.repeat_interleave(self.kv_group, dim=head_axis)

    @property
    def normalised(self) -> bool:
        """Whether attention rows sum to one (softmax); for other kinds they need not."""
        return self.attention in NORMALISED_KINDS

    def require_hooks(self, names: Sequence[str], purpose: str) -> None:
        missing = [name for name in names if name not in self.hook_names]
        if missing:
            raise InputError(
                f"{purpose} needs hooks {missing} that this {self.family} model does not expose; "
                "use a model with TransformerLens-named attention hooks"
            )


def upgrade_model_spec_v1(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``ModelSpec``'s fields as files of schema version 1 hold them, in today's names
    (``attention_kind`` became ``attention``); the upgrades of the files that nest a spec
    (probe, audit) call it."""
    return {("attention" if key == "attention_kind" else key): value for key, value in spec.items()}
