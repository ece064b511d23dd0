"""The attention examples an audit draws: the patterns of a few prompts in an evenly spread
subset of layers and heads, with token labels fit for a plot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadedModel
from sinkscope.pretrained_analysis.prompts import (
    TokenizedPrompts,
)

if TYPE_CHECKING:
    pass


MAX_EXAMPLE_LAYERS = 6  # heatmaps show at most 6 x 6 heads, spread evenly (each panel costs ~0.1 s)


MAX_EXAMPLE_HEADS = 6


EXAMPLE_TEXT_CHARS = 400  # of each example prompt kept for its caption (a report shows less)


@dataclass(frozen=True)
class AttentionExample:
    """One prompt's attention for a subset of heads: patterns
    ``[len(layer_indices), len(head_indices), query, key]`` over the prompt's real tokens."""

    prompt_index: int
    tokens: tuple[str, ...]
    layer_indices: tuple[int, ...]
    head_indices: tuple[int, ...]
    patterns: np.ndarray


def _spread(n: int, k: int) -> tuple[int, ...]:
    """Up to ``k`` indices spread evenly over ``range(n)``, first and last included."""
    if n <= k:
        return tuple(range(n))
    return tuple(sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}))


def plot_text(text: str) -> str:
    """``text`` safe for a matplotlib label: control characters shown as ``?``, ``$`` escaped
    (no mathtext)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text).replace("$", r"\$")


def token_label(token: str) -> str:
    return plot_text(token[:10]) or "''"


def attention_examples(
    hooked: HookedModel, model: LoadedModel, prompts: TokenizedPrompts, n_examples: int
) -> tuple[AttentionExample, ...]:
    spec = hooked.spec
    layers, heads = _spread(spec.n_layers, MAX_EXAMPLE_LAYERS), _spread(spec.n_heads, MAX_EXAMPLE_HEADS)
    examples = []
    for index in range(min(n_examples, len(prompts))):
        batch = hooked.prepare(*prompts.batch(index, index + 1))
        captured: dict[int, np.ndarray] = {}

        def capture(layer: int):
            def hook(pattern: torch.Tensor, hook: Any) -> None:
                captured[layer] = pattern[0, list(heads)].float().cpu().numpy()  # noqa: B023 (used within this iteration)

            return hook

        with torch.inference_mode():  # read-only hooks; nothing after the last pattern shown is needed
            hooked.run_with_hooks(
                batch,
                [(attn_hook(layer, "pattern"), capture(layer)) for layer in layers],
                stop_after=attn_hook(layers[-1], "pattern"),
            )
        ids = batch.model_input[0].tolist()
        examples.append(
            AttentionExample(
                prompt_index=index,
                tokens=tuple(str(token) for token in model.bridge.tokenizer.convert_ids_to_tokens(ids)),
                layer_indices=layers,
                head_indices=heads,
                patterns=np.stack([captured[layer] for layer in layers]),
            )
        )
    return tuple(examples)
