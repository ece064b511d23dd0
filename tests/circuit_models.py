"""For the sink-circuit battery's tests: a GPT-2 whose sink is built by construction from
three parts (a flag in one dimension of the first position's embedding, one key weight that
reads that dimension, and a constant query bias: head ``SINK``), and each circuit edit made
directly in transformers with the anchor masses read from its eager attention."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.pretrained_analysis.ablation import next_token_loss
from sinkscope.probes.circuit_edits import CircuitEdit, random_later_positions, random_query_shift
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


def hf_edit(hf, batch: PreparedBatch, edit: CircuitEdit, hooked: HookedModel):
    """A copy of ``hf`` (GPT-2 or a Llama-style model) with ``edit`` made directly in
    transformers (weights edited, or a module's output zeroed by a forward hook), and the
    embeddings to feed it (None: the token ids)."""
    hf = copy.deepcopy(hf)
    gpt2 = hf.config.model_type == "gpt2"
    layers = hf.transformer.h if gpt2 else hf.model.layers
    width = hf.config.hidden_size
    d_head = width // hf.config.num_attention_heads
    embeds = None
    with torch.no_grad():
        if edit.kind in ("null_query_bias", "random_query_bias"):
            for layer, head in edit.heads:
                bias = layers[layer].attn.c_attn.bias if gpt2 else layers[layer].self_attn.q_proj.bias
                cols = slice(head * d_head, (head + 1) * d_head)
                if edit.kind == "null_query_bias":
                    bias[cols] = 0.0
                else:
                    shift = random_query_shift(hooked.model.blocks[layer].attn.b_Q.detach(), edit.seed, layer)
                    bias[cols] += shift[head]
        elif edit.kind in ("replace_first_position", "remove_positions", "swap_later_positions"):
            wpe = hf.transformer.wpe.weight
            p = edit.position
            if edit.kind == "replace_first_position":
                wpe[0] = wpe[p].clone()
            elif edit.kind == "remove_positions":
                wpe.zero_()
            else:
                wpe[[p, p + 1]] = wpe[[p + 1, p]].clone()
        elif edit.kind in ("zero_key_dims", "zero_random_key_dims"):
            for layer, dims in edit.key_dims:
                if gpt2:
                    layers[layer].attn.c_attn.weight[list(dims), width : 2 * width] = 0.0
                else:
                    layers[layer].self_attn.k_proj.weight[:, list(dims)] = 0.0
        elif edit.kind == "replace_anchor_token":
            embeds = hf.get_input_embeddings()(batch.model_input).clone()
            last = batch.attention_mask.long().sum(dim=1) - 1
            embeds[:, 0] = embeds[torch.arange(embeds.shape[0]), last]
    if edit.kind in ("swap_effective_positions", "swap_later_effective_positions"):
        first, second = (
            (0, edit.position) if edit.kind == "swap_effective_positions" else (edit.position, edit.position + 1)
        )
        block = layers[0]
        with torch.no_grad():
            wpe = hf.transformer.wpe.weight[[first, second]]
            epe = wpe + block.mlp(block.ln_2(wpe))
        shift = epe[1] - epe[0]

        def swap(module, args, output):
            tensor = (output[0] if isinstance(output, tuple) else output).clone()
            tensor[:, first] += shift
            tensor[:, second] -= shift
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        block.register_forward_hook(swap)
    if edit.kind in ("zero_anchor_write", "zero_random_write"):
        at = batch.anchor if edit.kind == "zero_anchor_write" else random_later_positions(batch, edit.seed)
        block = layers[edit.layer]
        module = (block.mlp if gpt2 else block.mlp) if edit.part == "mlp" else (block.attn if gpt2 else block.self_attn)

        def zero(module, args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            tensor = tensor.clone()
            tensor[torch.arange(tensor.shape[0]), at] = 0.0
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        module.register_forward_hook(zero)
    return hf, embeds


def hf_anchor_readout(hf, batch: PreparedBatch, embeds, heads, position_ids=None):
    """Per input, each head's mean attention on position 0 from its real later queries
    ``[n, head]``, read from transformers' eager attention, and the next-token loss ``[n]``."""
    kwargs = {"inputs_embeds": embeds} if embeds is not None else {"input_ids": batch.model_input}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    with torch.no_grad():
        out = hf(**kwargs, attention_mask=batch.attention_mask.long(), output_attentions=True)
    after = batch.attention_mask.clone()
    after[:, 0] = False
    masses = [(out.attentions[layer][:, head, :, 0].double() * after).sum(1) / after.sum(1) for layer, head in heads]
    return torch.stack(masses, dim=1), next_token_loss(out.logits, batch)
