"""Tiny Hugging Face checkpoints built on the spot, so tests run offline.

``build_tiny_gpt2(directory)`` / ``build_tiny_gpt_neox(directory)`` write a randomly
initialised 2-layer GPT-2 / GPT-NeoX (fixed seed) plus a byte-level BPE tokenizer
trained on a few sentences; ``bos_sink_head=(layer, head)`` plants a BOS attention sink
in one head (``plant_bos_sink``). ``build_tiny_checkpoints`` saves several checkpoints
of one short training run (after 0, k, 2k, ... Adam steps), standing in for Pythia's
``step*`` revisions; ``install_in_hf_cache`` files a saved directory into a Hugging Face
cache as ``repo_id`` at ``revision``, so hub names resolve offline. ``load_bridge`` boots
a directory through ``TransformerBridge.boot_transformers``.
Reusable by any test module: ``from tiny_models import build_tiny_gpt2``.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import shutil
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


def _tiny_model(arch: str, tokenizer, seed: int, n_layer: int, n_head: int, width: int):
    """A random ``GPT2LMHeadModel`` or ``GPTNeoXForCausalLM`` with a 64-token context."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=64,
            n_ctx=64,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=width,
            attn_implementation="eager",
            **special,
        )
        model_class = GPT2LMHeadModel
    elif arch == "gpt_neox":
        config = GPTNeoXConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=64,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            hidden_size=width,
            intermediate_size=2 * width,
            rotary_pct=0.25,
            attn_implementation="eager",
            **special,
        )
        model_class = GPTNeoXForCausalLM
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose gpt2 or gpt_neox")
    torch.manual_seed(seed)
    return model_class(config).eval()


def plant_bos_sink(model, layer: int, head: int, strength: float = 10.0) -> None:
    """Make ``(layer, head)`` a BOS sink: BOS gets a distinctive +-1 embedding u, the head's
    keys read u in one (non-rotary) dimension and its query is a constant bias there, so
    every query scores BOS about ``strength * sqrt(d_model / d_head)`` above a typical key."""
    config = model.config
    width = config.hidden_size
    n_heads = config.num_attention_heads
    d_head = width // n_heads
    u = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(width)])
    with torch.no_grad():
        model.get_input_embeddings().weight[config.bos_token_id] = u
        if config.model_type == "gpt2":
            # Conv1D: y = x @ W + b, W [d_model, 3 d_model] = [q | k | v], heads contiguous inside each
            c_attn = model.transformer.h[layer].attn.c_attn
            q, k = slice(head * d_head, (head + 1) * d_head), slice(width + head * d_head, width + (head + 1) * d_head)
            for cols in (q, k):
                c_attn.weight[:, cols] = 0.0
                c_attn.bias[cols] = 0.0
            c_attn.bias[q.start] = strength
            c_attn.weight[:, k.start] = u / math.sqrt(width)
        else:
            # Linear [3 d_model, d_model]: per head [q | k | v]; rotary acts on the first dims only
            qkv = model.gpt_neox.layers[layer].attention.query_key_value
            base = head * 3 * d_head
            q, k = slice(base, base + d_head), slice(base + d_head, base + 2 * d_head)
            for rows in (q, k):
                qkv.weight[rows] = 0.0
                qkv.bias[rows] = 0.0
            qkv.bias[q.stop - 1] = strength
            qkv.weight[k.stop - 1] = u / math.sqrt(width)


def _save(model, tokenizer, directory: Path) -> Path:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_gpt2(
    directory: str | os.PathLike,
    seed: int = 0,
    n_layer: int = 2,
    n_head: int = 2,
    n_embd: int = 32,
    bos_sink_head: tuple[int, int] | None = None,
) -> Path:
    """Save a random GPT-2 (``n_ctx`` set explicitly) and its tokenizer to ``directory``."""
    tokenizer = train_byte_level_tokenizer()
    model = _tiny_model("gpt2", tokenizer, seed, n_layer, n_head, n_embd)
    if bos_sink_head is not None:
        plant_bos_sink(model, *bos_sink_head)
    return _save(model, tokenizer, Path(directory))


def build_tiny_gpt_neox(
    directory: str | os.PathLike,
    seed: int = 0,
    n_layer: int = 2,
    n_head: int = 2,
    hidden_size: int = 32,
    bos_sink_head: tuple[int, int] | None = None,
) -> Path:
    """Save a random GPT-NeoX (Pythia's architecture, rotary on a quarter of each head) and its tokenizer."""
    tokenizer = train_byte_level_tokenizer()
    model = _tiny_model("gpt_neox", tokenizer, seed, n_layer, n_head, hidden_size)
    if bos_sink_head is not None:
        plant_bos_sink(model, *bos_sink_head)
    return _save(model, tokenizer, Path(directory))


def build_tiny_checkpoints(
    directory: str | os.PathLike,
    arch: str = "gpt2",
    steps: tuple[int, ...] = (0, 30, 60),
    seed: int = 0,
    bos_sink_head: tuple[int, int] | None = None,
    lr: float = 3e-3,
) -> list[Path]:
    """Checkpoints of one training run: the model after each of ``steps`` Adam steps on
    BOS-prefixed 32-token windows of the tokenizer corpus, saved to ``directory/step{n}``."""
    tokenizer = train_byte_level_tokenizer()
    model = _tiny_model(arch, tokenizer, seed, 2, 2, 32)
    if bos_sink_head is not None:
        plant_bos_sink(model, *bos_sink_head)
    stream = [token for text in TOKENIZER_CORPUS for token in tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]]
    rng = random.Random(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    saved, done = [], 0
    for target in sorted(steps):
        model.train()
        for _ in range(target - done):
            starts = [rng.randrange(len(stream) - 31) for _ in range(8)]
            batch = torch.tensor([[tokenizer.bos_token_id] + stream[start : start + 31] for start in starts])
            loss = model(batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        done = target
        model.eval()
        saved.append(_save(model, tokenizer, Path(directory) / f"step{target}"))
    return saved


def install_in_hf_cache(
    model_dir: str | os.PathLike, cache_dir: str | os.PathLike, repo_id: str, revision: str = "main"
) -> Path:
    """Copy ``model_dir`` into the Hugging Face hub cache layout at ``cache_dir`` as
    ``repo_id`` at ``revision`` (refs/<revision> -> snapshots/<fake commit>/files)."""
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    return snapshot


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
    from sinkscope.toy.model import ToyModelConfig, ToyTransformer

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


# grouped- and multi-query attention ---------------------------------------------------
# family -> (config class, model class, extra config): GQA 4 query heads on 2 kv heads,
# or MQA on 1 (Gemma, with head_dim 16 != hidden_size / heads as in real Gemma models)
GQA_FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2, "attention_bias": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 8}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"num_key_value_heads": 2, "head_dim": 8, "sliding_window": 64}),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"num_key_value_heads": 1, "head_dim": 8, "sliding_window": 64},
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"num_key_value_heads": 2}),
}
# families whose q/k projections have biases, so a constant query can plant a sink
BIASED_QK_FAMILIES: tuple[str, ...] = ("llama", "qwen2")


def plant_gqa_bos_sink(model, layer: int, head: int, strength: float = 12.0) -> None:
    """Make query head ``head`` of ``layer`` a BOS sink in a Llama-style model with q/k
    biases: BOS gets a +-1 embedding u; the kv head it reads keeps only its last dimension,
    which reads u, and the query is a constant bias there. The last dimension pairs with
    the lowest rotary frequency (rotate_half), so the score barely depends on distance."""
    config = model.config
    width = config.hidden_size
    d_head = getattr(config, "head_dim", None) or width // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads
    kv_head = head // group
    u = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(width)])
    attention = model.model.layers[layer].self_attn
    q_rows = slice(head * d_head, (head + 1) * d_head)
    k_rows = slice(kv_head * d_head, (kv_head + 1) * d_head)
    with torch.no_grad():
        model.get_input_embeddings().weight[config.bos_token_id] = u
        attention.q_proj.weight[q_rows] = 0.0
        attention.q_proj.bias[q_rows] = 0.0
        attention.q_proj.bias[q_rows.stop - 1] = strength
        attention.k_proj.weight[k_rows] = 0.0
        attention.k_proj.bias[k_rows] = 0.0
        attention.k_proj.weight[k_rows.stop - 1] = u


def build_tiny_gqa(
    directory: str | os.PathLike,
    family: str = "llama",
    seed: int = 0,
    n_layer: int = 2,
    n_head: int = 4,
    hidden_size: int = 32,
    bos_sink_head: tuple[int, int] | None = None,
) -> Path:
    """Save a random grouped-/multi-query causal LM of ``family`` (``GQA_FAMILIES``) and the
    byte-level tokenizer; ``bos_sink_head`` plants a sink (families in ``BIASED_QK_FAMILIES``)."""
    import transformers

    if family not in GQA_FAMILIES:
        raise ValueError(f"unknown GQA family {family!r}; choose one of {', '.join(GQA_FAMILIES)}")
    config_name, model_name, extra = GQA_FAMILIES[family]
    tokenizer = train_byte_level_tokenizer()
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
        **extra,
    )
    # no pad_token_id: the tokenizer pads with its BOS, and a padding_idx embedding row
    # starts at zero, which would leave the anchor's values (and their metrics) at zero
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    if bos_sink_head is not None:
        if family not in BIASED_QK_FAMILIES:
            raise ValueError(f"planting a sink needs q/k biases; use one of {', '.join(BIASED_QK_FAMILIES)}")
        plant_gqa_bos_sink(model, *bos_sink_head)
    return _save(model, tokenizer, Path(directory))
