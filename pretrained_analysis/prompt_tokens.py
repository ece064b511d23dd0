"""A prompt's token ids, with special-token text kept as text, and the checks that the
tokenizer belongs to the model.

Prompts are text: ``<|endoftext|>`` written inside a prompt is tokenized as the
characters it spells, as any other text (Hugging Face's ``split_special_tokens``), unless
``parse_special_tokens`` asks for the special token; read as special tokens, a prompt of
them is all anchors and its sink rate is meaningless. The anchor (the BOS prepended with
``prepend_bos``) is put first exactly as TransformerLens' ``to_tokens`` puts it, and a
prompt without special-token text gets ``to_tokens``' ids unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sinkscope.pretrained_analysis.prompt_files import PromptError

# a tokenizer this much smaller than the model's vocabulary is another model's (models pad
# their embedding matrix by a few percent at most: Pythia 50277 -> 50304, Qwen2 151665 -> 151936)
MIN_VOCABULARY_SHARE = 0.9


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens (BOS, EOS, padding, chat markers...)."""
    found = {str(token) for token in tokenizer.all_special_tokens}
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return tuple(sorted(text for text in found if text))


@contextmanager
def _special_text_as_text(tokenizer: Any) -> Iterator[None]:
    """Calls of ``tokenizer`` split special-token text like any text, for the duration."""
    before = tokenizer.split_special_tokens
    tokenizer.split_special_tokens = True
    try:
        yield
    finally:
        tokenizer.split_special_tokens = before


def _manual_bos(bridge: Any) -> list[int]:
    """The BOS ids ``to_tokens`` prepends itself (as text) when the tokenizer does not."""
    tokenizer, bos = bridge.tokenizer, bridge.tokenizer.bos_token
    if bos is None or getattr(bridge.cfg, "tokenizer_prepends_bos", True):
        return []
    ids = tokenizer(bos, add_special_tokens=False)["input_ids"]
    return list(ids) if len(ids) == 1 else []  # to_tokens skips a BOS that is no single token


def text_ids(bridge: Any, text: str, prepend_bos: bool, parse_special: bool, specials: Sequence[str]) -> list[int]:
    """The token ids of ``text`` (not truncated), the anchor first when ``prepend_bos``."""
    if parse_special or not any(special in text for special in specials):
        ids = bridge.to_tokens(text, prepend_bos=prepend_bos, truncate=False, move_to_device=False)[0].tolist()
        bos = bridge.tokenizer.bos_token_id
        if prepend_bos and bos is not None and ids[:2] == [bos, bos]:
            return ids[1:]  # the text spells its own BOS, read as one: one anchor, never two
        return ids
    prefix = _manual_bos(bridge) if prepend_bos else []
    with _special_text_as_text(bridge.tokenizer):
        ids = bridge.to_tokens(text, prepend_bos=prepend_bos and not prefix, truncate=False, move_to_device=False)
    return prefix + ids[0].tolist()


def special_text_note(texts: Sequence[str], specials: Sequence[str], parse_special: bool) -> str | None:
    """What an audit says when prompts spell special tokens (None when none does)."""
    holding = [text for text in texts if any(special in text for special in specials)]
    if not holding:
        return None
    example = min((special for special in specials if special in holding[0]), key=holding[0].index)
    how = (
        "parsed as special tokens (parse_special_tokens)"
        if parse_special
        else "tokenized as text (parse_special_tokens reads it as special tokens)"
    )
    return f"{len(holding)} of {len(texts)} prompts hold special-token text (e.g. {example}), {how}"


def check_vocabulary(tokenizer: Any, d_vocab: int, label: str) -> None:
    """The tokenizer must be the model's: no token id past the model's vocabulary, and not
    far fewer tokens than it (another model's tokenizer, or an empty one)."""
    n_tokens = len(tokenizer)
    if n_tokens > d_vocab or n_tokens < MIN_VOCABULARY_SHARE * d_vocab:
        raise PromptError(
            f"the tokenizer has {n_tokens} tokens but the model's vocabulary has {d_vocab}, so it is not the "
            f"tokenizer of {label}; pass the model's own tokenizer (save the model's own tokenizer next to its "
            "weights with tokenizer.save_pretrained)",
            field="tokenizer",
        )


def check_token_ids(rows: Sequence[Sequence[int]], d_vocab: int, label: str) -> None:
    """Every token id lies in the model's vocabulary (an added token could pass the size check)."""
    largest = max((max(row) for row in rows if row), default=0)
    if largest >= d_vocab:
        raise PromptError(
            f"a prompt has token id {largest}, outside the vocabulary of {label} ({d_vocab} tokens); "
            "pass the model's own tokenizer",
            field="tokenizer",
        )
