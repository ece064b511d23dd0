"""A GPT-2 whose sink is built by construction from three parts, for the sink-circuit
battery: a flag in one dimension of the first position's embedding, one key weight that
reads that dimension, and a constant query bias (head ``SINK``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tiny_models import build_tiny_gpt2, load_hf_model

SINK = (1, 0)
FLAG_DIM = 5


def plant_position_sink(hf, strength: float = 10.0, flag: float = 20.0) -> None:
    """Head ``SINK`` of a GPT-2 finds position 0 through its position embedding: ``flag``
    added to wpe[0][FLAG_DIM], the head's key reading only that dimension, its query a
    constant bias ``strength`` (every other query and key weight of the head zeroed)."""
    layer, head = SINK
    width = hf.config.n_embd
    d_head = width // hf.config.n_head
    with torch.no_grad():
        hf.transformer.wpe.weight[0, FLAG_DIM] += flag
        c_attn = hf.transformer.h[layer].attn.c_attn
        q, k = slice(head * d_head, (head + 1) * d_head), slice(width + head * d_head, width + (head + 1) * d_head)
        for cols in (q, k):
            c_attn.weight[:, cols] = 0.0
            c_attn.bias[cols] = 0.0
        c_attn.bias[q.start] = strength
        c_attn.weight[FLAG_DIM, k.start] = 1.0


def build_position_sink_gpt2(directory: str | os.PathLike) -> Path:
    """Save a 2-layer, 2-head, 32-wide GPT-2 with the planted position sink to ``directory``."""
    directory = build_tiny_gpt2(directory, n_layer=2, n_head=2, n_embd=32)
    hf = load_hf_model(directory)
    plant_position_sink(hf)
    hf.save_pretrained(directory)
    return Path(directory)
