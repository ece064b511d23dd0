"""The streaming window test on a pretrained causal language model: a long text cut into
chunks, next-token loss at every position of every chunk under each window setting
(``sinkscope.probes.window_masks``), summarised with intervals over the chunks.

The default text ships with the package (``data/window_text.txt``): chapters 1 to 4 of Jane
Austen's *Pride and Prejudice* (1813, public domain), about 4,400 words, reproduced for
sinkscope from memory of the 1813 text (the wording may differ in places from a printed
edition); it runs offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sinkscope.infra.arguments import check_argument, check_number, check_seed
from sinkscope.infra.bounds import POSITIVE, TOKENS
from sinkscope.infra.errors import InputError
from sinkscope.infra.heartbeat import progress_bar
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.pretrained_analysis.boot import LoadedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model, loading_announced, wrap_model
from sinkscope.probes.window_masks import window_settings
from sinkscope.probes.window_test import WindowRun, WindowTestResult, run_window_test

DEFAULT_TEXT_SOURCE = "Pride and Prejudice, chapters 1-4 (Jane Austen, 1813; public domain; packaged)"
DEFAULT_WINDOWS: tuple[int, ...] = (32, 256)
DEFAULT_SINKS: tuple[int, ...] = (1, 4)
DEFAULT_CHUNK_TOKENS = 1024
LOSS_NAME = "next-token loss (nats)"


def default_text() -> str:
    """The packaged public-domain text (see the module docstring)."""
    path = Path(str(resources.files("sinkscope.pretrained_analysis") / "data" / "window_text.txt"))
    return path.read_text(encoding="utf-8")


def text_chunks(hooked: HookedModel, text: str, chunk_tokens: int, max_chunks: int | None) -> list[PreparedBatch]:
    """``text`` tokenized once and cut into consecutive chunks of ``chunk_tokens`` tokens,
    each opened by the model's BOS when it prepends one; a last, shorter piece is dropped.
    Special-token text in it ("<|endoftext|>") is read as the characters it spells, as the
    audit reads prompts: parsed, it would put extra BOS tokens, extra sinks, in the windows."""
    n_ctx = getattr(hooked.model.cfg, "n_ctx", None)
    if isinstance(n_ctx, int) and chunk_tokens > n_ctx:
        raise InputError(
            f"chunks of {chunk_tokens} tokens exceed the model's context of {n_ctx}; use --chunk-tokens {n_ctx} or less",
            field="chunk_tokens",
        )
    tokenizer = hooked.model.tokenizer
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    bos = tokenizer.bos_token_id if hooked.spec.prepend_bos else None
    body = chunk_tokens - (bos is not None)
    if body < 2:
        raise InputError(f"chunks of {chunk_tokens} tokens are too short; use --chunk-tokens of 64 or more")
    n_chunks = len(ids) // body if max_chunks is None else min(max_chunks, len(ids) // body)
    if n_chunks < 1:
        raise InputError(
            f"the text has {len(ids):,} tokens, fewer than one chunk of {chunk_tokens}; "
            "give a longer text or lower --chunk-tokens",
            field="chunk_tokens",
        )
    chunks = []
    for k in range(n_chunks):
        tokens = ([bos] if bos is not None else []) + ids[k * body : (k + 1) * body]
        chunks.append(hooked.prepare(torch.tensor([tokens], dtype=torch.long)))
    return chunks


def position_next_token_loss(logits: torch.Tensor, batch: PreparedBatch) -> torch.Tensor:
    """``[batch, pos - 1]``: the cross-entropy of predicting token i + 1 at position i."""
    tokens = batch.model_input.to(logits.device)
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none")
    return losses.view(tokens.shape[0], -1)


def window_test(
    model: LoadSpec | LoadedModel | Any,
    text: str | None = None,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    sinks: Sequence[int] = DEFAULT_SINKS,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    max_chunks: int | None = None,
    seed: int = 0,
    progress: bool = True,
    tokenizer: Any = None,
    source: str | None = None,
) -> WindowTestResult:
    """The streaming window test of a causal LM on ``text`` (None: the packaged text).

    model: a ``LoadSpec`` to load, a ``LoadedModel``, or a model in memory (a
    ``TransformerBridge``, or a Hugging Face model with its ``tokenizer``). windows / sinks:
    the W and S values (every W alone, and with each S as first tokens and as the random
    control). The text is cut into chunks of ``chunk_tokens`` (at most ``max_chunks``); the
    chunks are the units of the intervals. ``source`` names the text in the result."""
    check_argument(progress, bool, "progress", "True or False")
    check_argument(chunk_tokens, int, "chunk_tokens", "a whole number of tokens")
    check_argument(max_chunks, (int, type(None)), "max_chunks", "a whole number or None (every chunk)")
    if max_chunks is not None and max_chunks < 1:
        raise InputError(f"max_chunks must be >= 1 (or None: every chunk), got {max_chunks}", field="max_chunks")
    check_number(max_chunks, POSITIVE, "max_chunks", none=True)  # what the result file holds
    check_number(chunk_tokens, TOKENS, "chunk_tokens")
    check_seed(seed)  # torch's generator takes 64 bits: 2**64 is one line here, not an overflow inside torch
    if text is not None and not (isinstance(text, str) and text.strip()):
        raise InputError("text must be a non-empty string (or None for the packaged text)", field="text")
    settings = window_settings(windows, sinks)
    if isinstance(model, LoadSpec):
        with loading_announced(model.label, progress):
            loaded = load_model(model, progress=progress)
    else:
        loaded = wrap_model(model, tokenizer)
    hooked = HookedModel(loaded.bridge)
    chunks = text_chunks(hooked, default_text() if text is None else text, chunk_tokens, max_chunks)
    run = WindowRun(
        model=loaded.info.label,
        source=source or (DEFAULT_TEXT_SOURCE if text is None else "the given text"),
        unit="text chunk",
        loss_name=LOSS_NAME,
        shift=1,
    )
    bar = progress_bar(len(settings), f"window test {run.model}", progress, unit="setting", leave=True)
    with bar:
        return run_window_test(
            hooked, chunks, settings, position_next_token_loss, run, seed, tick=lambda: bar.update(1)
        )
