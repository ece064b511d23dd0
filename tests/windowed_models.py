"""Tiny sliding-window checkpoints (Mistral, Gemma 2's alternation, Gemma 3's
``sliding_window_pattern``) with windows of 4-6 tokens, and prompts several windows long,
shared by the window tests of every layer."""

from __future__ import annotations

import torch

from tiny_models import _save, train_byte_level_tokenizer

# family -> (config class, model class, config, per-layer window transformers applies)
WINDOWED: dict[str, tuple[str, str, dict, tuple[int, ...]]] = {
    # every layer slides
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "sliding_window": 4}, (4, 4)),
    # Gemma 2 alternates: even layers local, odd layers global
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"num_key_value_heads": 2, "head_dim": 8, "sliding_window": 6, "num_hidden_layers": 3},
        (6, 0, 6),
    ),
    # Gemma 3: every sliding_window_pattern-th layer global
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"num_key_value_heads": 1, "head_dim": 8, "sliding_window": 5, "sliding_window_pattern": 2},
        (5, 0),
    ),
}
PROMPTS = [
    "The sink takes the mass that no other key wants, again and again, window after window.",
    "A short one.",
    "Local layers see only the last few tokens; global layers see them all.",
]


def build_windowed(directory, family: str):
    import transformers

    config_name, model_name, extra, _ = WINDOWED[family]
    tokenizer = train_byte_level_tokenizer()
    settings = {"num_hidden_layers": 2, **extra}
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # no padding row: the tokenizer pads with its BOS, whose embedding must not start at zero
        pad_token_id=None,
        initializer_range=0.3,  # large random weights: peaked attention rows, not uniform ones
        attn_implementation="eager",
        **settings,
    )
    torch.manual_seed(1)
    model = getattr(transformers, model_name)(config).eval()
    return _save(model, tokenizer, directory)
