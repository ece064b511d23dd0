"""Per-layer key visibility (``sinkscope.interp.visibility``): windows and chunks read from each
family's config as transformers builds it, and the ``[batch, query, key]`` mask equal to the one
transformers' own mask functions give (sliding window, chunked, padding on either side)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    chunked_overlay,
    padding_mask_function,
    sliding_window_overlay,
)

from sinkscope.infra.errors import InputError
from sinkscope.interp.model_spec import ModelSpec
from sinkscope.interp.visibility import key_visibility, layer_reach, layer_windows_and_chunks


def transformers_visibility(mask: torch.Tensor, window: int = 0, chunk: int = 0) -> torch.Tensor:
    """transformers' mask functions, evaluated on every (row, query, key)."""
    functions = [causal_mask_function, padding_mask_function(mask)]
    if window:
        functions.append(sliding_window_overlay(window))
    if chunk:
        functions.append(chunked_overlay(chunk, left_padding=mask.long().argmax(dim=1)))
    combined = and_masks(*functions)
    batch, n_pos = mask.shape
    rows = torch.arange(batch).view(-1, 1, 1)
    positions = torch.arange(n_pos)
    return combined(rows, 0, positions.view(1, -1, 1), positions.view(1, 1, -1)).expand(batch, n_pos, n_pos)


def padded_mask(side: str) -> torch.Tensor:
    lengths = [13, 9, 4]
    mask = torch.zeros(len(lengths), 13, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    return mask.flip(1) if side == "left" else mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(("window", "chunk"), [(0, 0), (1, 0), (4, 0), (5, 0), (0, 3), (0, 4)])
def test_visibility_equals_transformers_masks(side, window, chunk):
    mask = padded_mask(side)
    expected = transformers_visibility(mask, window, chunk)
    assert torch.equal(key_visibility(mask, causal=True, window=window, chunk=chunk), expected)


def test_a_window_hides_far_keys_only():
    visible = key_visibility(torch.ones(1, 8, dtype=torch.bool), window=3)[0]
    assert visible[7].tolist() == [False] * 5 + [True] * 3  # the window counts the query itself
    assert visible[2].tolist() == [True] * 3 + [False] * 5


def _config(name: str, **settings):
    return getattr(transformers, name)(num_hidden_layers=settings.pop("num_hidden_layers", 4), **settings)


@pytest.mark.parametrize(
    ("config", "windows", "chunks"),
    [
        (_config("MistralConfig", sliding_window=4), (4, 4, 4, 4), ()),
        (_config("MistralConfig", sliding_window=None), (), ()),
        (_config("Gemma2Config", sliding_window=6), (6, 0, 6, 0), ()),
        (_config("Gemma3TextConfig", sliding_window=5, sliding_window_pattern=3), (5, 5, 0, 5), ()),
        (
            _config("Gemma3TextConfig", sliding_window=5, layer_types=["full_attention"] + ["sliding_attention"] * 3),
            (0, 5, 5, 5),
            (),
        ),
        (_config("Qwen2Config", use_sliding_window=True, sliding_window=8, max_window_layers=2), (0, 0, 8, 8), ()),
        (_config("Qwen2Config", sliding_window=8), (), ()),
        (_config("LlamaConfig"), (), ()),
        (_config("GPT2Config", n_layer=4), (), ()),
    ],
)
def test_windows_come_from_the_config(config, windows, chunks):
    n_layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    assert layer_windows_and_chunks(config, n_layers) == (windows, chunks)


def test_llama4_chunks_come_from_its_layer_types():
    config = transformers.Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=16, no_rope_layers=[1, 1, 1, 0])
    windows, chunks = layer_windows_and_chunks(config, 4)
    assert windows == ()
    assert chunks == tuple(16 if kind == "chunked_attention" else 0 for kind in config.layer_types)
    assert any(chunks) and not all(chunks)


def test_the_spec_records_one_value_per_layer():
    spec = ModelSpec("bridge", 2, 2, 4, 8, True, "softmax", True, True, sliding_windows=(4, 0))
    assert layer_reach(spec, 0) == (4, 0) and layer_reach(spec, 1) == (0, 0)
    with pytest.raises(InputError, match="sliding_windows must hold one value per layer"):
        ModelSpec("bridge", 2, 2, 4, 8, True, "softmax", True, True, sliding_windows=(4,))
