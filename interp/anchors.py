"""Which token is a prompt's anchor, and how it got there, decided per tokenizer.

TransformerLens keeps a changed copy of a model's tokenizer: one that adds no BOS is
reloaded to add it, and one without a BOS token is given its EOS as BOS. Its ``to_tokens``
would then put ``<|endoftext|>`` in front of every Qwen prompt, a token Qwen's own
tokenizer call never gives. The anchor is therefore decided from the tokenizer as its
files declare it (``own_tokenizer``):

- ``tokenizer``: the tokenizer's own call puts its BOS first (Llama, Gemma, Mistral);
  sinkscope adds nothing, so the anchor is that one BOS;
- ``prepended``: the tokenizer has a BOS token but its own call does not add it (GPT-2,
  Pythia, SmolLM2); sinkscope prepends it once;
- ``absent``: the tokenizer has no BOS token (Qwen); nothing is prepended and each
  prompt's first token is the anchor, as the tokenizer's own call gives it;
- ``off``: ``prepend_bos`` turned off: each prompt's first token;
- ``cls``: a bidirectional encoder: its tokenizer puts [CLS] first.
"""

from __future__ import annotations

import weakref
from typing import Any

ANCHOR_HOWS: tuple[str, ...] = ("tokenizer", "prepended", "absent", "off", "cls")
# the ways that put a BOS (or [CLS]) token first in every row
ANCHOR_PREFIXED: tuple[str, ...] = ("tokenizer", "prepended", "cls")
# a short text whose own tokenization shows whether the tokenizer adds BOS itself
PROBE_TEXT = "a"


def own_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer as its files declare it: reloaded (local files only, never a
    download) from where TransformerLens' copy came from; the copy itself where that
    cannot be read (a tokenizer built in memory)."""
    from transformers import AutoTokenizer

    source = str(getattr(tokenizer, "name_or_path", "") or "")
    if not source:
        return tokenizer
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError):
        return tokenizer


def declared_bos(tokenizer: Any) -> str | None:
    """The BOS token its files declare (TransformerLens sets a missing BOS to EOS on its
    copy, but leaves the declaration in ``init_kwargs``)."""
    declared = getattr(tokenizer, "init_kwargs", {})
    if "bos_token" in declared:
        value = declared["bos_token"]
        return None if value is None else str(value)
    return tokenizer.bos_token


# tokenizer -> its causal anchor: reloading a tokenizer's files takes seconds (a 49k-token
# vocabulary is deep-copied on load), once per audit or prepare() call without this
_DECIDED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def anchor_how(tokenizer: Any, causal: bool, prepend_bos: bool) -> str:
    """One of ``ANCHOR_HOWS`` for prompts tokenized with ``tokenizer`` (the bridge's);
    decided once per tokenizer object read from files (they do not change under it)."""
    if not prepend_bos:
        return "off"
    if not causal:
        return "cls"
    try:
        return _DECIDED[tokenizer]
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        pass
    own = own_tokenizer(tokenizer)
    how = _causal_anchor(tokenizer, own)
    if own is not tokenizer:  # read from files; an in-memory tokenizer may still be changed by its owner
        try:
            _DECIDED[tokenizer] = how
        except TypeError:
            pass
    return how


def _causal_anchor(tokenizer: Any, own: Any) -> str:
    bos = declared_bos(tokenizer) if own is tokenizer else own.bos_token
    if bos is None:
        return "absent"
    first = own(PROBE_TEXT)["input_ids"][:1]
    return "tokenizer" if first == [own.convert_tokens_to_ids(bos)] else "prepended"
