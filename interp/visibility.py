"""Which keys each query of each layer can see: causal, sliding-window and chunked attention.

A model's config says how far each layer looks back, in transformers' own terms:
- ``layer_types`` (Gemma 2 and 3, Qwen2/3, Cohere 2, OLMo 3, gpt-oss, Llama 4): per layer
  ``"sliding_attention"`` (window ``sliding_window``), ``"chunked_attention"`` (chunks of
  ``attention_chunk_size``) or ``"full_attention"``; Gemma 2's alternation and Gemma 3's
  ``sliding_window_pattern`` are turned into ``layer_types`` by their configs;
- no ``layer_types`` but an integer ``sliding_window`` (Mistral, Mixtral, Phi-3,
  Starcoder2): every layer slides.

A layer's window W (transformers' ``sliding_window_overlay``) lets query i see key j when
i - W < j <= i: W keys including its own. A chunk of size C (``chunked_overlay``) lets it
see the keys of its own chunk, counted from each row's first real token. Padding keys are
never visible. ``ModelSpec`` records the per-layer windows and chunks (0: none), so every
metric reads the same visibility the model's attention used.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Bool

from sinkscope.infra.bounds import COUNT
from sinkscope.infra.errors import InputError

SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
REACH_BOUNDS = dict.fromkeys(["sliding_windows", "attention_chunks"], COUNT)  # ModelSpec's per-layer fields


def _positive_int(value: Any) -> int:
    """``value`` when it is a positive integer (a window or chunk size), else 0 (none)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def layer_windows_and_chunks(config: Any, n_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-layer (sliding windows, attention chunk sizes) of a transformers ``config``, 0 where a
    layer has none; two empty tuples when no layer is narrowed (every layer fully causal)."""
    config = getattr(config, "text_config", None) or config  # multimodal wrappers keep the text model's config
    window = _positive_int(getattr(config, "sliding_window", None))
    chunk = _positive_int(getattr(config, "attention_chunk_size", None))
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == n_layers:
        windows = tuple(window if kind == SLIDING else 0 for kind in layer_types)
        chunks = tuple(chunk if kind == CHUNKED else 0 for kind in layer_types)
    else:
        windows, chunks = (window,) * n_layers, (0,) * n_layers
    return (windows if any(windows) else (), chunks if any(chunks) else ())


def bridge_reach(bridge: Any, n_layers: int) -> dict[str, tuple[int, ...]]:
    """``ModelSpec``'s ``sliding_windows`` and ``attention_chunks`` of the Hugging Face model a
    TransformerBridge wraps (``layer_windows_and_chunks`` of its config)."""
    config = getattr(getattr(bridge, "original_model", None), "config", None)
    windows, chunks = layer_windows_and_chunks(config, n_layers)
    return {"sliding_windows": windows, "attention_chunks": chunks}


def check_reach(n_layers: int, windows: tuple[int, ...], chunks: tuple[int, ...]) -> None:
    """An InputError unless the per-layer windows and chunks hold one value per layer, or none."""
    for name, values in (("sliding_windows", windows), ("attention_chunks", chunks)):
        if len(values) not in (0, n_layers):
            raise InputError(f"{name} must hold one value per layer ({n_layers}) or none, got {len(values)}")


def key_visibility(
    attention_mask: Bool[torch.Tensor, "batch pos"], causal: bool = True, window: int = 0, chunk: int = 0
) -> Bool[torch.Tensor, "batch query key"]:
    """True where query i may attend to key j: j is a real token, and (if ``causal``) j <= i,
    i - j < ``window`` (when > 0), and i, j lie in the same ``chunk`` counted from the row's
    first real token (when > 0)."""
    real = attention_mask.bool()
    n_pos = real.shape[1]
    positions = torch.arange(n_pos, device=real.device)
    query, key = positions.view(1, -1, 1), positions.view(1, 1, -1)
    visible = real.unsqueeze(1).expand(-1, n_pos, -1)
    if causal:
        visible = visible & (key <= query)
    if window > 0:
        visible = visible & (key > query - window)
    if chunk > 0:
        first = real.to(torch.long).argmax(dim=1).view(-1, 1, 1)
        visible = visible & (
            (key - first).div(chunk, rounding_mode="floor") == (query - first).div(chunk, rounding_mode="floor")
        )
    return visible


def layer_reach(spec: Any, layer: int) -> tuple[int, int]:
    """(window, chunk) of ``layer`` from a ``ModelSpec``'s per-layer tuples (empty: none anywhere)."""
    windows, chunks = spec.sliding_windows, spec.attention_chunks
    return (windows[layer] if windows else 0, chunks[layer] if chunks else 0)


def sees_key(visible: Bool[torch.Tensor, "batch query key"], key: torch.Tensor) -> Bool[torch.Tensor, "batch query"]:
    """Whether each query sees key ``key[b]`` of its row (e.g. the anchor)."""
    index = key.to(device=visible.device, dtype=torch.long).view(-1, 1, 1).expand(-1, visible.shape[1], 1)
    return visible.gather(-1, index).squeeze(-1)
