"""Explicit weights that solve the single-layer trigger task (Ran-Milo 2026, Theorems 1 and 3; docs/toy-task.md).

Both constructions are one layer, one full-width head (d_head = d_model), no residual,
with weights in TransformerLens layout (``W_Q/W_K/W_V [head, d_model, d_head]``,
``W_O [head, d_head, d_model]``). They read only the task's fixed coordinates (BOS flag,
trigger flag, bias), so they work for any ``TaskConfig``.
"""

from __future__ import annotations

import math

import torch

from sinkscope.infra.errors import InputError
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import BOS_FLAG, TRIGGER_FLAG, TaskConfig

_HEAD = 0  # the single head
_SCORE = 0  # the single head coordinate that carries the query-key match


def _blank_model(task: TaskConfig, attention: str) -> ToyTransformer:
    """A one-layer, one-head, no-residual model of the task's shape with all weights zero.

    The random initialisation runs on a forked RNG, so building a construction leaves the
    caller's global random stream untouched.
    """
    config = ToyModelConfig(n_layers=1, n_heads=1, d_model=task.d_model, seq_len=task.seq_len, attention=attention)
    with torch.random.fork_rng(devices=[]):
        model = ToyTransformer(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return model


def relu_exact_model(task: TaskConfig) -> ToyTransformer:
    """ReLU attention solving the single-layer target exactly, with no weight on BOS.

    Why it works: ReLU attention is not normalised, so a query that should output 0 can
    simply attend to nothing; it needs no place to park its mass (Theorem 3). The score
    is S_ik = t_i * (b_k + t_k): the query is the trigger flag, and the key is 1 on every
    non-BOS token (each has exactly one of bias or trigger flag) and 0 on BOS. Non-trigger
    rows therefore score 0 everywhere and come out exactly zero; the trigger row at j
    scores 1 on keys 1..j (the causal mask hides later ones), and the kind's fixed
    1 / max(j, 1) turns that into weight 1/j each. With identity values and output, the
    trigger output is mean(x_1 .. x_j).
    """
    model = _blank_model(task, "relu")
    attn = model.attention(0)
    eye = torch.eye(task.d_model)
    with torch.no_grad():
        attn.W_Q[_HEAD, TRIGGER_FLAG, _SCORE] = 1.0
        attn.W_K[_HEAD, TRIGGER_FLAG, _SCORE] = 1.0
        attn.W_K[_HEAD, task.bias_coord, _SCORE] = 1.0
        attn.W_V[_HEAD].copy_(eye)
        attn.W_O[_HEAD].copy_(eye)
    return model


def softmax_scaled_model(task: TaskConfig, scale: float) -> ToyTransformer:
    """Softmax attention solving the single-layer target up to an error that vanishes as
    ``scale`` grows, by parking default queries on BOS (the sink of Theorem 1).

    Why it works: softmax rows sum to one, so a query that must output 0 has to put its
    mass on a key whose value is 0; BOS is the only such key, so W_V zeroes the BOS flag
    and BOS's value is the zero vector. The score is S_ik = scale * f_k * (b_i - t_i)
    (f = BOS flag, b = bias, t = trigger flag): a default query at i scores ``scale`` on
    BOS and 0 elsewhere, so its BOS mass is m_i = e^scale / (e^scale + i) and its output
    is exactly (1 - m_i) * mean(x_1 .. x_i), an error that falls as e^-scale only while
    the sink mass climbs to 1. The trigger query scores -scale on BOS and 0 on keys
    1..j, giving weight 1 / (j + e^-scale) to each, i.e. the mean up to a factor
    j / (j + e^-scale). ``scale = 0`` is uniform attention.
    """
    if not (math.isfinite(scale) and scale >= 0):
        raise InputError(f"scale must be a finite number >= 0, got {scale}", field="scale")
    model = _blank_model(task, "softmax")
    attn = model.attention(0)
    eye = torch.eye(task.d_model)
    eye[BOS_FLAG, BOS_FLAG] = 0.0
    with torch.no_grad():
        attn.W_Q[_HEAD, task.bias_coord, _SCORE] = scale
        attn.W_Q[_HEAD, TRIGGER_FLAG, _SCORE] = -scale
        attn.W_K[_HEAD, BOS_FLAG, _SCORE] = 1.0
        attn.W_V[_HEAD].copy_(eye)
        attn.W_O[_HEAD].copy_(torch.eye(task.d_model))
    return model


def _null_construction(task: TaskConfig, attention: str, scale: float) -> ToyTransformer:
    """The shared weights of the two null constructions: the trigger query scores
    ``2 * scale`` on every non-BOS key (key = bias + trigger flag, as in ``relu_exact_model``),
    a default query scores 0 on every key, and values copy the input with BOS's flag
    zeroed, so the trigger row is the mean of keys 1..j up to a factor that tends to one."""
    if not (math.isfinite(scale) and scale >= 0):
        raise InputError(f"scale must be a finite number >= 0, got {scale}", field="scale")
    model = _blank_model(task, attention)
    attn = model.attention(0)
    eye = torch.eye(task.d_model)
    eye[BOS_FLAG, BOS_FLAG] = 0.0
    with torch.no_grad():
        attn.W_Q[_HEAD, TRIGGER_FLAG, _SCORE] = 2.0 * scale
        attn.W_K[_HEAD, TRIGGER_FLAG, _SCORE] = 1.0
        attn.W_K[_HEAD, task.bias_coord, _SCORE] = 1.0
        attn.W_V[_HEAD].copy_(eye)
        attn.W_O[_HEAD].copy_(torch.eye(task.d_model))
    return model


def learned_sink_model(task: TaskConfig, scale: float) -> ToyTransformer:
    """A learned sink logit solving the single-layer target with no mass on BOS: the error
    vanishes as ``scale`` grows while the anchor mass falls to zero with it.

    Why it works: the sink logit ``scale`` is one more key that no token holds and that
    writes nothing. A default query scores 0 on its i + 1 keys, so each gets
    1 / (e^scale + i + 1) and the row's output is (i / (e^scale + i + 1)) * mean(x_1 .. x_i),
    BOS's value being zero: the null, not the anchor, holds the default state. The trigger
    query scores 2 * scale on keys 1..j and 0 on BOS, which outweighs the sink.
    """
    model = _null_construction(task, "learned_sink", scale)
    with torch.no_grad():
        model.attention(0).sinks.fill_(scale)
    return model


def kv_bias_zero_value_model(task: TaskConfig, scale: float) -> ToyTransformer:
    """A key/value bias slot with value 0 solving the single-layer target with no mass on
    BOS (Gu et al. 2025 §7: the sink moves off the first token entirely).

    Why it works: as ``learned_sink_model``, with the null's logit q_i . k' = ``scale`` * b_i
    (the bias coordinate): ``scale`` at every default content query, 0 at the trigger
    (which has no bias), so the slot takes a default row and leaves the trigger's row alone.
    """
    model = _null_construction(task, "kv_bias_zero_value", scale)
    attn = model.attention(0)
    with torch.no_grad():
        attn.W_Q[_HEAD, task.bias_coord, _SCORE + 1] = scale
        attn.null_key[_HEAD, _SCORE + 1] = 1.0
    return model


def gated_head_model(task: TaskConfig, scale: float) -> ToyTransformer:
    """A per-head output gate solving the single-layer target: the gate, not the anchor,
    holds the default state.

    Why it works: the gate is sigmoid(scale * (t_i - b_i)) (trigger flag minus bias), so it
    is sigmoid(-scale) at every default content query and sigmoid(scale) at the trigger,
    whatever the softmax row does. The trigger's row is the softmax construction's: it
    scores -scale on BOS and 0 on keys 1..j. Default rows score 0 everywhere and spread
    their mass over every key, BOS included: they are not sinks, and the gate shuts them.
    """
    if not (math.isfinite(scale) and scale >= 0):
        raise InputError(f"scale must be a finite number >= 0, got {scale}", field="scale")
    model = _blank_model(task, "gated_head")
    attn = model.attention(0)
    eye = torch.eye(task.d_model)
    eye[BOS_FLAG, BOS_FLAG] = 0.0
    with torch.no_grad():
        attn.W_Q[_HEAD, TRIGGER_FLAG, _SCORE] = -scale
        attn.W_K[_HEAD, BOS_FLAG, _SCORE] = 1.0
        attn.W_V[_HEAD].copy_(eye)
        attn.W_O[_HEAD].copy_(torch.eye(task.d_model))
        attn.W_gate[_HEAD, TRIGGER_FLAG] = scale
        attn.W_gate[_HEAD, task.bias_coord] = -scale
    return model
