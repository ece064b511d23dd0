"""The streaming window test's masks (Xiao et al., StreamingLLM): which keys each query may
attend to when distant context is dropped, imposed on every head of every layer.

Settings (W: the window, S: the kept tokens):
- ``full``: every earlier key (the model as it is);
- ``window``: only the last W keys (i - W < j <= i, the query's own key included);
- ``first``: the first S tokens of the sequence plus the last W keys;
- ``random``: S keys drawn uniformly (seeded, per query) from the earlier keys that are
  neither among the first S tokens nor in the window, plus the last W keys: the control
  that keeps as many keys as ``first`` but not the first ones.

The masks keep the original positions: every token keeps the rotary or learned position
it had in the full sequence and only the hidden keys are taken away. StreamingLLM's rolling
cache instead re-indexes the kept keys to consecutive positions (the first S tokens at
0..S-1, the window right after them), so its distances differ from the text's; this test
asks what the model loses when keys vanish, with nothing else changed.

How they are imposed, on every head of every layer:
- on a bridge (a Hugging Face model), at ``hook_attn_scores``: the hidden keys' scores are
  set to the dtype's lowest value, as the model's own causal mask does, so its softmax (with
  a learned sink's logit, on models that have one) runs over the visible keys only. This is
  exact where an edit after the softmax is not: a strong sink can leave the other keys'
  weights at zero in float32 (underflow), and no renormalisation brings them back;
- on toy models (whose attention kinds include unnormalised ones), at ``hook_pattern``: the
  hidden keys' weights are set to zero and, for softmax, each row is divided by what its
  visible keys held (``restrict_pattern``).
The model's own causal, sliding-window and chunk masks still apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import torch
from jaxtyping import Bool, Float

from sinkscope.infra.arguments import check_argument, check_number
from sinkscope.infra.bounds import COUNT, Bound
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel

WindowKind = Literal["full", "window", "first", "random"]
WINDOW_KINDS: tuple[str, ...] = get_args(WindowKind)


@dataclass(frozen=True)
class WindowSetting:
    """One mask: ``kind`` (``WINDOW_KINDS``) with its window W and kept tokens S (0: unused)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"window": COUNT, "sinks": COUNT}

    kind: WindowKind
    window: int = 0
    sinks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in WINDOW_KINDS:
            raise InputError(f"unknown window setting {self.kind!r}; choose one of {', '.join(WINDOW_KINDS)}")
        if self.kind != "full" and self.window < 1:
            raise InputError(f"a {self.kind} setting needs a window W >= 1, got {self.window}", field="windows")
        if self.kind in ("first", "random") and self.sinks < 1:
            raise InputError(f"a {self.kind} setting needs S >= 1 kept tokens, got {self.sinks}", field="sinks")

    @property
    def label(self) -> str:
        if self.kind == "full":
            return "full attention"
        if self.kind == "window":
            return f"last {self.window}"
        return f"{'first' if self.kind == 'first' else 'random'} {self.sinks} + last {self.window}"


def window_settings(windows: Sequence[int], sinks: Sequence[int]) -> tuple[WindowSetting, ...]:
    """Full attention, then for each W: the window alone, and for each S the first S tokens
    and the random control with W."""
    for name, values in (("windows", windows), ("sinks", sinks)):
        check_argument(values, (tuple, list), name, "a tuple of whole numbers, e.g. (64, 256)")
        for value in values:
            check_argument(value, int, name, "a tuple of whole numbers, e.g. (64, 256)")
            check_number(value, WindowSetting.BOUNDS["window" if name == "windows" else "sinks"], name)
    if not windows:
        raise InputError("give at least one window W, e.g. --windows 64,256", field="windows")
    settings = [WindowSetting("full")]
    for window in sorted(set(windows)):
        settings.append(WindowSetting("window", window))
        for kept in sorted(set(sinks)):
            settings += [WindowSetting("first", window, kept), WindowSetting("random", window, kept)]
    return tuple(settings)


def allowed_keys(setting: WindowSetting, n_pos: int, seed: int = 0) -> Bool[torch.Tensor, "query key"]:
    """True where query i may attend to key j under ``setting`` (causal: j <= i always)."""
    positions = torch.arange(n_pos)
    query, key = positions.view(-1, 1), positions.view(1, -1)
    causal = key <= query
    if setting.kind == "full":
        return causal
    in_window = causal & (key > query - setting.window)
    if setting.kind == "window":
        return in_window
    first = causal & (key < setting.sinks)
    if setting.kind == "first":
        return in_window | first
    # the control: S keys per query from those neither first nor in the window
    candidates = causal & ~in_window & ~first
    generator = torch.Generator().manual_seed(seed)
    draws = torch.rand((n_pos, n_pos), generator=generator).masked_fill(~candidates, -1.0)
    top = draws.topk(min(setting.sinks, n_pos), dim=-1)
    chosen = torch.zeros_like(causal).scatter_(-1, top.indices, top.values >= 0)
    return in_window | chosen


def restrict_pattern(
    pattern: Float[torch.Tensor, "batch head query key"], allowed: Bool[torch.Tensor, "query key"], normalised: bool
) -> Float[torch.Tensor, "batch head query key"]:
    """``pattern`` with the keys ``allowed`` hides at zero; rows of normalised attention are
    divided by the mass left on their visible keys (the softmax over the visible scores)."""
    kept = pattern.masked_fill(~allowed.to(pattern.device), 0.0)
    if not normalised:
        return kept
    left = kept.sum(dim=-1, keepdim=True)
    return kept / torch.where(left > 0, left, torch.ones_like(left))


def window_hooks(model: HookedModel, allowed: Bool[torch.Tensor, "query key"]) -> FwdHooks:
    """Hooks that impose ``allowed`` on every head of every layer (``model.run_with_hooks``):
    on the scores of a bridge's softmax attention, else on the pattern."""
    spec = model.spec
    if not spec.causal:
        raise InputError("the window test needs a causal language model; this model attends in both directions")
    if spec.no_pattern_layers:
        raise InputError(
            f"the window test restricts every layer's attention, and layer {spec.no_pattern_layers[0].layer} of "
            f"this model is {spec.no_pattern_layers[0].kind}, which no window restricts; use an all-attention model"
        )
    if model.is_bridge and spec.attention == "softmax" and attn_hook(0, "attn_scores") in spec.hook_names:
        return [(attn_hook(layer, "attn_scores"), _score_hook(allowed)) for layer in range(spec.n_layers)]
    if not spec.pattern_writable:
        raise InputError(
            "this model's attention pattern is read-only (its module has consumed it before the hook); "
            "the window test needs a model whose hook_pattern edits reach the output (GPT-2, Pythia, Llama ...)"
        )

    def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
        _check_size(pattern, allowed)
        return restrict_pattern(pattern, allowed, spec.normalised)

    return [(attn_hook(layer, "pattern"), hook) for layer in range(spec.n_layers)]


def _score_hook(allowed: Bool[torch.Tensor, "query key"]) -> Any:
    def hook(scores: torch.Tensor, hook: Any) -> torch.Tensor:
        _check_size(scores, allowed)
        return scores.masked_fill(~allowed.to(scores.device), torch.finfo(scores.dtype).min)

    return hook


def _check_size(attention: torch.Tensor, allowed: torch.Tensor) -> None:
    if attention.shape[-2:] != allowed.shape:
        raise InputError(f"the mask covers {allowed.shape[-1]} positions, the input has {attention.shape[-1]}")
