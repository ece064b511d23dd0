"""Tiny GGUF checkpoints of many model families, written on the spot with the ``gguf``
package's own writer, so GGUF loading is tested offline for every family.

``build_tiny_gguf(directory, family, quantization)`` draws a random 2-layer causal LM of
``family`` (a ``GGUF_FAMILIES`` key: llama.cpp's ``general.architecture``) from its
transformers config class, names every tensor as llama.cpp does through
``gguf.get_tensor_name_map`` (the table llama.cpp's converter and transformers' GGUF
reader both use), writes the shape metadata with the writer's ``add_*`` keys and a tiny
byte-level BPE tokenizer (``tokenizer.ggml.model = gpt2``, trained by
``tiny_models.train_byte_level_tokenizer``), and stores matrices as F32, F16 or Q8_0
(``gguf.quants.quantize``); 1-D tensors (norms, biases) stay F32, as llama.cpp keeps them.
The weights in the file are what both sides of a test read back, dequantised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tiny_models import train_byte_level_tokenizer

QUANTIZATIONS: tuple[str, ...] = ("F32", "F16", "Q8_0")
WIDTH, N_LAYERS, N_HEADS, MAX_POSITIONS = 32, 2, 4, 64


@dataclass(frozen=True)
class GGUFFamily:
    """How to draw one family: its transformers model type, the extra config fields, the
    llama.cpp architecture name and ``general.name`` (Mistral files say ``llama`` and are
    told apart by their name), whether norms are stored as ``1 + w`` (Gemma, Nemotron), which
    Conv1D weights llama.cpp stores transposed (GPT-2), the norm kind (RMS or layer norm) and
    the spread the matrices are drawn with."""

    model_type: str
    config: dict = field(default_factory=dict)
    architecture: str = ""
    name: str = "tiny"
    norm_offset: bool = False
    transposed: tuple[str, ...] = ()
    rms_norm: bool = True
    init_std: float = 0.2


GGUF_FAMILIES: dict[str, GGUFFamily] = {
    "llama": GGUFFamily("llama", {"num_key_value_heads": 2}),
    # llama.cpp writes Mistral as architecture llama; transformers reads it as Llama unless
    # general.name is exactly "mistral" (then its reader fails with gguf 0.19: REFUSED_FAMILIES)
    "mistral": GGUFFamily(
        "mistral", {"num_key_value_heads": 2, "sliding_window": None}, "llama", "Mistral-7B-Instruct-v0.3"
    ),
    "qwen2": GGUFFamily("qwen2", {"num_key_value_heads": 2}),
    # transformers' GGUF reader takes Qwen3's head_dim (128) from the config class, not the file
    "qwen3": GGUFFamily("qwen3", {"num_key_value_heads": 2}),
    "gemma2": GGUFFamily("gemma2", {"num_key_value_heads": 2, "head_dim": 8}, norm_offset=True, init_std=0.6),
    "gemma3": GGUFFamily("gemma3_text", {"num_key_value_heads": 1, "head_dim": 8}, norm_offset=True, init_std=0.6),
    "phi3": GGUFFamily("phi3", {"num_key_value_heads": N_HEADS}),
    "gpt2": GGUFFamily("gpt2", {}, transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"), rms_norm=False),
    "starcoder2": GGUFFamily("starcoder2", {"num_key_value_heads": 2}, rms_norm=False),
    "stablelm": GGUFFamily("stablelm", {"num_key_value_heads": N_HEADS}, rms_norm=False),
    "falcon": GGUFFamily("falcon", {"new_decoder_architecture": False, "multi_query": True}, rms_norm=False),
    "bloom": GGUFFamily("bloom", {}, rms_norm=False),
    # Nemotron's layer norms scale by 1 + w, and llama.cpp stores them so
    "nemotron": GGUFFamily("nemotron", {"num_key_value_heads": 2}, norm_offset=True, rms_norm=False),
}

# mixture-of-experts families: transformers' GGUF reader reads the expert count and top-k
# from the file but keeps the config class's expert widths (``moe_intermediate_size``,
# Qwen2-MoE's shared expert), so the tiny model is drawn with those defaults
MOE_FAMILIES: dict[str, GGUFFamily] = {
    "qwen2moe": GGUFFamily("qwen2_moe", {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2}),
    "qwen3moe": GGUFFamily(
        "qwen3_moe", {"num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2}
    ),
    # MiniMax-M2: QK-norm over all heads at once, partial rotary (rotary_dim < head_dim) and a
    # routing bias; its experts are intermediate_size wide
    "minimax-m2": GGUFFamily(
        "minimax_m2",
        {"num_key_value_heads": 2, "head_dim": 8, "rotary_dim": 4, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}


# families transformers' GGUF reader does not read (tests of the refusal)
REFUSED_FAMILIES: dict[str, GGUFFamily] = {
    "gemma": GGUFFamily("gemma", {"num_key_value_heads": 1, "head_dim": 8}, norm_offset=True),
    "mistral-named": GGUFFamily("mistral", {"num_key_value_heads": 2, "sliding_window": None}, "llama", "mistral"),
    # LFM2: convolution layers (layer 0) among attention ones; the file lists key/value heads
    # per layer, 0 for a convolution layer, as llama.cpp writes it
    "lfm2": GGUFFamily("lfm2", {"num_key_value_heads": 2, "full_attn_idxs": [1], "block_auto_adjust_ff_dim": False}),
    # transformers reads neither the experts nor the learned sinks of a gpt-oss file as
    # llama.cpp writes it (ffn_*_exps, attn_sinks) and would start them at random; the head
    # size is the config class's 64, which it does not read from the file either
    "gpt-oss": GGUFFamily(
        "gpt_oss",
        {
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
}


def tiny_causal_lm(family: GGUFFamily, tokenizer, seed: int):
    """A random 2-layer model of ``family``, its matrices drawn wide enough that attention is
    far from uniform: Gemma divides scores by sqrt(256) whatever the head size (transformers'
    GGUF reader keeps the config class's ``query_pre_attn_scalar``) and Gemma 3 normalises
    queries and keys, so Gemma draws wider and gives its q/k norms random scales."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {
        # transformers' GGUF reader keeps GPT-2's 1024 positions whatever the file says
        "gpt2": {"n_embd": WIDTH, "n_layer": N_LAYERS, "n_head": N_HEADS},
    }.get(family.model_type) or {
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
    }
    special = {name: tokenizer.bos_token_id for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = AutoConfig.for_model(family.model_type, vocab_size=len(tokenizer), **special, **sizes, **family.config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, family.init_std)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.normal_(1.0, 2.0)
    return model


def tokenizer_metadata(writer, tokenizer) -> None:
    """A byte-level BPE vocabulary in GGUF's tokenizer keys, its special tokens as control
    tokens (type 3), ``<|endoftext|>`` as BOS, EOS and padding."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    special = set(tokenizer.all_special_tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)


def shape_metadata(writer, config, family: GGUFFamily) -> None:
    """The architecture's shape keys, as llama.cpp's converter writes them."""
    text = config.get_text_config()
    n_heads = getattr(text, "num_attention_heads", None) or text.n_head
    width = getattr(text, "hidden_size", None) or text.n_embd
    writer.add_context_length(MAX_POSITIONS)
    writer.add_embedding_length(width)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(getattr(text, "intermediate_size", None) or 4 * width)
    writer.add_head_count(n_heads)
    kv_heads = getattr(text, "num_key_value_heads", n_heads)
    kinds = getattr(text, "layer_types", None) or ()
    writer.add_head_count_kv([0 if kind == "conv" else kv_heads for kind in kinds] if "conv" in kinds else kv_heads)
    if hasattr(text, "conv_L_cache"):
        writer.add_shortconv_l_cache(text.conv_L_cache)
    head_dim = getattr(text, "head_dim", None) or width // n_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(getattr(text, "rotary_dim", None) or head_dim)
    theta = getattr(text, "rope_theta", None) or (getattr(text, "rope_parameters", None) or {}).get("rope_theta")
    if theta is not None:
        writer.add_rope_freq_base(float(theta))
    eps = next(
        getattr(text, name)
        for name in ("rms_norm_eps", "norm_epsilon", "layer_norm_epsilon", "layer_norm_eps", "norm_eps")
        if hasattr(text, name)
    )
    (writer.add_layer_norm_rms_eps if family.rms_norm else writer.add_layer_norm_eps)(float(eps))
    if getattr(text, "num_experts_per_tok", None) is not None:
        writer.add_expert_count(getattr(text, "num_experts", None) or text.num_local_experts)
        writer.add_expert_used_count(text.num_experts_per_tok)
        writer.add_expert_feed_forward_length(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)


def gguf_tensors(model, family: GGUFFamily, architecture) -> dict:
    """Every weight under its llama.cpp name, as llama.cpp lays it out (numpy, float32); the
    tied output matrix is left out, as llama.cpp leaves it."""
    import gguf

    names = gguf.get_tensor_name_map(architecture, N_LAYERS)
    tensors = {}
    for hf_name, tensor in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        # gguf's map spells some names without the model's prefix (BLOOM's h.0..., not transformer.h.0...)
        gguf_name = names.get_name(base) or names.get_name(base.partition(".")[2])
        if gguf_name is None or (gguf_name == "output" and model.config.get_text_config().tie_word_embeddings):
            continue
        data = tensor.detach().float()
        if family.norm_offset and "norm" in hf_name:
            data = data + 1.0  # llama.cpp stores Gemma's norms as 1 + w
        if suffix == "weight" and any(part in hf_name for part in family.transposed):
            data = data.T  # Conv1D keeps [in, out]; llama.cpp stores [out, in]
        if gguf_name.endswith("shortconv.conv"):
            data = data.squeeze(1)  # llama.cpp keeps LFM2's depthwise kernel [channel, width]
        tensors[f"{gguf_name}.{suffix}"] = data.contiguous().numpy()
    experts = gpt_oss_tensors if model.config.model_type == "gpt_oss" else expert_tensors
    return tensors | experts(model, names)


def expert_tensors(model, names) -> dict:
    """A mixture-of-experts layer's stacked expert matrices under llama.cpp's names:
    transformers fuses gate and up as ``experts.gate_up_proj`` ``[expert, 2 * width, d_model]``,
    llama.cpp keeps ``ffn_gate_exps`` and ``ffn_up_exps`` apart; the shared expert's gate is a
    vector in llama.cpp (``ffn_gate_inp_shexp``)."""
    tensors = {}
    for hf_name, tensor in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        data = tensor.detach().float()
        if suffix == "gate_up_proj" and data.dim() == 3:
            gate, up = data.chunk(2, dim=1)
            tensors[f"{names.get_name(base + '.gate_proj')}.weight"] = gate.contiguous().numpy()
            tensors[f"{names.get_name(base + '.up_proj')}.weight"] = up.contiguous().numpy()
        elif suffix == "down_proj" and data.dim() == 3:
            tensors[f"{names.get_name(base + '.down_proj')}.weight"] = data.contiguous().numpy()
        elif suffix == "e_score_correction_bias":  # llama.cpp's exp_probs_b
            tensors[f"{names.get_name(base + '.e_score_correction')}.bias"] = data.contiguous().numpy()
        elif hf_name.endswith("shared_expert_gate.weight"):
            tensors[f"{names.get_name(base)}.weight"] = data.flatten().contiguous().numpy()
    return tensors


def gpt_oss_tensors(model, names) -> dict:
    """gpt-oss's experts and learned sinks as llama.cpp's converter writes them: gate and up
    interleaved in ``gate_up_proj`` ``[expert, d_model, 2 * width]`` come apart into
    ``ffn_gate_exps`` / ``ffn_up_exps`` ``[expert, width, d_model]`` (and their biases), the
    down matrices are transposed, the sink logits are ``attn_sinks.weight``."""
    tensors = {}
    for hf_name, tensor in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        data = tensor.detach().float()
        if suffix in ("gate_up_proj", "gate_up_proj_bias"):
            kind = "weight" if suffix == "gate_up_proj" else "bias"
            for part, half in (("gate_proj", data[..., ::2]), ("up_proj", data[..., 1::2])):
                half = half.transpose(1, 2) if kind == "weight" else half
                tensors[f"{names.get_name(f'{base}.{part}')}.{kind}"] = half.contiguous().numpy()
        elif suffix in ("down_proj", "down_proj_bias") and base.endswith("experts"):
            half = data.transpose(1, 2) if suffix == "down_proj" else data
            kind = "weight" if suffix == "down_proj" else "bias"
            tensors[f"{names.get_name(base + '.down_proj')}.{kind}"] = half.contiguous().numpy()
        elif suffix == "sinks":
            tensors[f"{names.get_name(base + '.sinks')}.weight"] = data.contiguous().numpy()
    return tensors


def add_tensor(writer, name: str, data, quantization: str) -> None:
    """One tensor; matrices in ``quantization``, 1-D tensors (and rows shorter than one
    quantisation block) in F32."""
    import gguf
    import numpy as np

    if data.ndim < 2 or quantization == "F32":
        writer.add_tensor(name, data.astype(np.float32))
    elif quantization == "F16":
        writer.add_tensor(name, data.astype(np.float16))
    elif data.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quantization]][0]:
        writer.add_tensor(name, data.astype(np.float32))  # rows shorter than a block stay F32, as in llama.cpp
    else:
        kind = gguf.GGMLQuantizationType[quantization]
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0"}


def build_tiny_gguf(directory: Path, family: str, quantization: str = "F32", seed: int = 0) -> Path:
    """Write ``directory/tiny-FAMILY.QUANT.gguf`` and return its path."""
    import gguf

    spec = GGUF_FAMILIES.get(family) or MOE_FAMILIES.get(family) or REFUSED_FAMILIES[family]
    tokenizer = train_byte_level_tokenizer()
    # transformers reads Gemma files with GemmaTokenizer, which adds <mask> when the vocabulary
    # lacks it (real Gemma vocabularies have it): every file carries one, a control token
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    model = tiny_causal_lm(spec, tokenizer, seed)
    arch_name = spec.architecture or family
    architecture = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch_name)
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"tiny-{family}.{quantization}.gguf"
    writer = gguf.GGUFWriter(str(path), arch_name)
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType[FILE_TYPES[quantization]])
    shape_metadata(writer, model.config, spec)
    tokenizer_metadata(writer, tokenizer)
    for name, data in gguf_tensors(model, spec, architecture).items():
        add_tensor(writer, name, data, quantization)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
