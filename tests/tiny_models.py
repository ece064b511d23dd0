"""Tiny Hugging Face checkpoints built on the spot, so tests run offline.

``build_tiny_gpt2(directory)`` writes a randomly initialised 2-layer GPT-2 (fixed seed)
plus a byte-level BPE tokenizer trained on a few sentences; ``load_tiny_gpt2_bridge``
boots it through ``TransformerBridge.boot_transformers`` from the local directory.
Reusable by any test module: ``from tiny_models import build_tiny_gpt2``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Mechanistic interpretability studies attention heads and circuits in transformers.",
    "Attention sinks park probability mass on the first token.",
    "A trigger token switches the model out of its default state.",
    "Softmax rows sum to one, so a head that has nothing to do must look somewhere.",
] * 4

TINY_GPT2_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention sinks park mass on the first token.",
    "A trigger switches the default state.",
]


def train_byte_level_tokenizer(vocab_size: int = 300):
    """A GPT-2-style byte-level BPE ``GPT2TokenizerFast`` with ``<|endoftext|>`` as BOS/EOS/PAD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_CORPUS, trainer=trainer)
    return GPT2TokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def build_tiny_gpt2(directory: str | os.PathLike, seed: int = 0, n_layer: int = 2, n_head: int = 2, n_embd: int = 32) -> Path:
    """Save a random GPT-2 (``n_ctx`` set explicitly) and its tokenizer to ``directory``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = Path(directory)
    tokenizer = train_byte_level_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_ctx=64,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_hf_model(directory: str | os.PathLike, model_class_name: str = "AutoModelForCausalLM"):
    """The plain transformers model from ``directory`` with eager attention, in eval mode."""
    import transformers

    model_class = getattr(transformers, model_class_name)
    return model_class.from_pretrained(str(directory), attn_implementation="eager").eval()


def load_bridge(directory: str | os.PathLike):
    """``TransformerBridge.boot_transformers`` on a local directory (offline)."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(directory), device="cpu")


def toy_sink_model():
    """A 2-layer x 2-head toy model (d_model 8) whose head (0, 0) sends every query to BOS
    (BOS-flag key x bias-coordinate/trigger-flag query); the other heads stay random.
    """
    from toy.model import ToyModelConfig, ToyTransformer

    torch.manual_seed(0)
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, d_model=8, seq_len=8))
    with torch.no_grad():
        attn = model.blocks[0].attn
        attn.W_Q.zero_()
        attn.W_K.zero_()
        attn.W_Q[0, 7, 0] = 30.0  # bias coordinate of content tokens
        attn.W_Q[0, 1, 0] = 30.0  # trigger flag
        attn.W_K[0, 0, 0] = 30.0  # BOS flag
    return model
