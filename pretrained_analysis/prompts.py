"""Prompt sets for audits, read through ``datasets`` and tokenized with an explicit BOS rule.

Sources (``PromptSpec.source``):
- ``default``: the built-in set of varied English prompts shipped with sinkscope
  (``pretrained_analysis/data/default_prompts.txt``);
- ``random``: random-token prompts (Gu et al. find sinks on random tokens too), drawn
  uniformly from the tokenizer's non-special tokens with ``seed``;
- a local ``.txt`` (one prompt per line), ``.jsonl``/``.json``, ``.csv`` or ``.parquet``
  file (``text_column`` names the column);
- a Hugging Face dataset id, ``ID`` or ``ID:CONFIG`` (e.g.
  ``Salesforce/wikitext:wikitext-2-raw-v1``), with ``split`` (``datasets`` slicing such as
  ``train[:2000]`` works) and ``text_column``; needs the hub or the local datasets cache.

Local files are checked before they are read (``prompt_files``: a regular file, sniffed
from its first bytes, streamed). Prompts given in Python must be strings. Empty and
whitespace-only texts are skipped. When a source holds more than
``n_prompts`` prompts, a ``seed``-ed random subset is taken (kept in source order).
Every prompt is tokenized with TransformerLens' ``to_tokens`` and ``prepend_bos``
(True: the tokenizer's BOS, or [CLS] for encoders, comes first), then truncated to
``max_len`` tokens (BOS included); shorter prompts are kept whole and right-padded, with
an ``attention_mask`` marking real tokens. Special-token text inside a prompt
(``<|endoftext|>``) is tokenized as text unless ``parse_special_tokens`` (``prompt_tokens``),
and the tokenizer must fit the model's vocabulary.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.infra.arguments import check_argument, check_items
from sinkscope.infra.bounds import COUNT, SAMPLES, SEED, TOKENS, Bound, Problem, at_most, check_bounds
from sinkscope.interp.anchors import ANCHOR_PREFIXED, anchor_how
from sinkscope.pretrained_analysis.anchors import anchor_token_id
from sinkscope.pretrained_analysis.prompt_files import (
    PromptError,
    cache_error,
    column_values,
    read_file,
)
from sinkscope.pretrained_analysis.prompt_tokens import (
    check_token_ids,
    check_vocabulary,
    special_text_note,
    special_texts,
    text_ids,
)
from sinkscope.reports.formatting import plural

if TYPE_CHECKING:
    import torch

    from sinkscope.pretrained_analysis.loading import LoadedModel

# a Hugging Face dataset id, ``ID`` or ``ID:CONFIG`` (``org/name:config``): no spaces, so
# a sentence given as a source is named as such rather than looked up on the hub
DATASET_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?", re.ASCII)
BUILTIN_SOURCE = "default"
RANDOM_SOURCE = "random"
TEXTS_SOURCE = "texts"  # a list of strings given in Python (``prompt_set``), not a file
DEFAULT_MAX_LEN = 64
DEFAULT_N_PROMPTS = 64

BUILTIN_PROMPTS = Path(str(resources.files("sinkscope.pretrained_analysis") / "data" / "default_prompts.txt"))


@dataclass(frozen=True)
class PromptSpec:
    """Which prompts, how many, how long, and the BOS convention.

    source: ``default``, ``random``, a file path or a Hugging Face dataset id (see the
    module docstring); max_len: T, the most tokens per prompt, BOS included; n_prompts:
    how many prompts; seed: for random tokens and for subsetting larger sources;
    parse_special_tokens: read special-token text in a prompt (``<|endoftext|>``) as the
    special token, not as text (the default: prompts are text).
    """

    # the command line's --max-len, --n-prompts and --seed read these too
    BOUNDS: ClassVar[dict[str, Bound]] = {"max_len": TOKENS, "n_prompts": SAMPLES, "seed": SEED}

    source: str = BUILTIN_SOURCE
    max_len: int = DEFAULT_MAX_LEN
    n_prompts: int = DEFAULT_N_PROMPTS
    seed: int = 0
    prepend_bos: bool = True
    text_column: str = "text"
    split: str = "train"
    parse_special_tokens: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.source, os.PathLike):  # a pathlib.Path to a prompt file
            object.__setattr__(self, "source", os.fspath(self.source))
        check_argument(self.source, str, "source", "default, random, a file path or a dataset id")
        for name in ("max_len", "n_prompts", "seed"):
            check_argument(getattr(self, name), int, name, "an integer")
        for name in ("prepend_bos", "parse_special_tokens"):
            check_argument(getattr(self, name), bool, name, "True or False")
        check_bounds(self, PromptError)  # max_len: the anchor and one query at least
        if not self.source.strip():
            raise PromptError(
                "the prompt source is empty; pass default, random, a file or a dataset id", field="source"
            )
        if self.kind == "hub" and not is_dataset_id(self.source):
            raise PromptError(
                f"the prompt source {self.source!r} is not a file, default, random or a dataset id (ID or ID:CONFIG); "
                "if it is a file, check its path; to audit text you type, pass it in a list of prompt strings",
                field="source",
            )

    @property
    def kind(self) -> str:
        """``builtin``, ``random``, ``texts`` (given in Python), ``file`` or ``hub``."""
        return source_kind(self.source)


def source_kind(source: str) -> str:
    """What a prompt source names: ``builtin``, ``random``, ``texts``, ``file`` or ``hub``."""
    if source == BUILTIN_SOURCE:
        return "builtin"
    if source == RANDOM_SOURCE:
        return "random"
    if source == TEXTS_SOURCE:
        return "texts"
    path = Path(source).expanduser()
    # a name with a file extension (x.bin, prompts.tsv) is a file, never a dataset id
    has_extension = bool(path.suffix) and path.suffix[1:].isalnum() and ":" not in source
    if path.exists() or has_extension:
        return "file"
    return "hub"


def is_dataset_id(source: str) -> bool:
    """Whether ``source`` can name a Hugging Face dataset (``ID`` or ``ID:CONFIG``)."""
    return DATASET_ID.fullmatch(source) is not None


@dataclass(frozen=True)
class PromptSet:
    """The texts chosen from ``spec``'s source (empty for random-token prompts).

    n_available: non-empty prompts in the source (``n_prompts`` for random tokens);
    location: the file read, the dataset id, or ``random tokens``.
    """

    spec: PromptSpec
    texts: tuple[str, ...]
    n_available: int
    location: str


@dataclass(frozen=True)
class PromptSummary:
    """What an audit ran on; recorded in every result. texts_sha256: a digest of the
    prompt texts used (empty for random tokens, which the spec's seed fixes, and in audits
    written before it was recorded)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_available": COUNT,
        "n_prompts": COUNT,
        "n_truncated": COUNT,
        "n_tokens": COUNT,
        "min_tokens": COUNT,
        "max_tokens": COUNT,
    }

    spec: PromptSpec
    location: str
    n_available: int
    n_prompts: int
    n_truncated: int
    n_tokens: int
    min_tokens: int
    max_tokens: int
    anchor_token: str
    texts_sha256: str = ""
    anchor_how: str = ""  # one of interp.anchors.ANCHOR_HOWS; empty in audits written before it was recorded

    def inconsistencies(self) -> Iterator[Problem]:
        """Truncated prompts among those used, used among those available, lengths in order."""
        yield from at_most("n_truncated", self.n_truncated, self.n_prompts, "n_prompts")
        yield from at_most("n_prompts", self.n_prompts, self.n_available, "n_available")
        yield from at_most("min_tokens", self.min_tokens, self.max_tokens, "max_tokens")

    def same_prompts(self, other: PromptSummary) -> bool:
        """Whether two audits ran on the same prompts. Where both recorded their texts'
        digest: the same texts, cut to the same length, with the same BOS convention
        (wherever they were read from: a list in Python, a file on another machine);
        otherwise (random tokens, older audits) the same spec."""
        if self.texts_sha256 and other.texts_sha256:
            return (self.texts_sha256, self.spec.max_len, self.spec.prepend_bos, self.spec.parse_special_tokens) == (
                other.texts_sha256,
                other.spec.max_len,
                other.spec.prepend_bos,
                other.spec.parse_special_tokens,
            )
        return self.spec == other.spec


def texts_digest(texts: Sequence[str]) -> str:
    """sha256 of the texts in order (NUL-separated, so no two lists share a digest by
    joining differently)."""
    return hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest() if texts else ""


@dataclass(frozen=True)
class TokenizedPrompts:
    """tokens: ``[n, pos]`` long, right-padded; attention_mask: ``[n, pos]`` bool, True at
    real tokens; texts: the source texts (decoded tokens for random prompts); notes: what
    the audit should say about the tokenization (special-token text)."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    texts: tuple[str, ...]
    summary: PromptSummary
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``start:stop`` trimmed to their longest prompt: tokens and mask ``[b, pos_b]``."""
        mask = self.attention_mask[start:stop]
        width = int(mask.sum(dim=1).max())
        return self.tokens[start:stop, :width], mask[:, :width]


def check_context(spec: PromptSpec, n_ctx: int, model_label: str) -> None:
    """Raise ``PromptError`` when T = ``spec.max_len`` exceeds the model's context."""
    if spec.max_len > n_ctx:
        raise PromptError(
            f"max_len {spec.max_len} exceeds the context of {model_label} ({n_ctx} tokens); use max_len {n_ctx} or less",
            field="max_len",
        )


def _read_hub(spec: PromptSpec) -> list[Any]:
    import datasets

    from sinkscope.pretrained_analysis.loading import hub_offline

    datasets.disable_progress_bars()
    dataset_id, _, config = spec.source.partition(":")
    try:
        dataset = datasets.load_dataset(dataset_id, config or None, split=spec.split)
    except (ConnectionError, FileNotFoundError) as error:
        cached = cache_error(error)
        if cached is not None:
            raise cached from error
        where = "the hub is offline" if hub_offline() else f"the hub could not be reached ({type(error).__name__})"
        raise PromptError(
            f"dataset {spec.source} is not in the local datasets cache and {where}; pass a local "
            ".txt/.jsonl/.csv/.parquet file, the default prompts, or connect so it downloads once",
            field="source",
        ) from error
    except OSError as error:  # datasets keeps its cache under HOME
        cached = cache_error(error)
        if cached is None:
            raise
        raise cached from error
    except ValueError as error:  # unknown split or config
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PromptError(f"cannot load dataset {spec.source} split {spec.split!r}: {reason}", field="split") from error
    return column_values(dataset, spec.text_column, spec.source)


def _texts(values: list[Any], column: str, where: str) -> list[str]:
    bad = next((value for value in values if value is not None and not isinstance(value, str)), None)
    if bad is not None:
        raise PromptError(
            f"column {column!r} of {where} holds {type(bad).__name__} values, not text; set text_column to a text column",
            field="text_column",
        )
    return [value.strip() for value in values if isinstance(value, str) and value.strip()]


def prompt_texts(texts: Any, name: str = "prompts") -> list[str]:
    """``texts`` as a list of strings; an ``InputError`` naming ``name`` and the first item
    that is not a ``str`` (bytes, None, a number would otherwise be audited as their repr)."""
    return check_items(texts, str, name, "prompt strings")


def prompt_set(
    texts: Sequence[str], max_len: int = DEFAULT_MAX_LEN, prepend_bos: bool = True, parse_special_tokens: bool = False
) -> PromptSet:
    """A list of strings as a prompt set, every one used (empty ones are skipped);
    ``parse_special_tokens`` as ``PromptSpec``'s."""
    kept = tuple(text for text in prompt_texts(texts) if text.strip())
    if not kept:
        raise PromptError("the prompt list holds no non-empty prompt; pass at least one", field="prompts")
    spec = PromptSpec(
        source=TEXTS_SOURCE,
        max_len=max_len,
        n_prompts=len(kept),
        prepend_bos=prepend_bos,
        parse_special_tokens=parse_special_tokens,
    )
    return PromptSet(
        spec=spec, texts=kept, n_available=len(kept), location=f"{plural(len(kept), 'prompt')} given in Python"
    )


def load_prompt_set(spec: PromptSpec) -> PromptSet:
    """Read and select the prompts of ``spec`` (nothing is tokenized yet)."""
    if spec.kind == "texts":
        raise PromptError("a list of strings is a prompt set already: pass it to prompt_set(texts)", field="prompts")
    if spec.kind == "random":
        return PromptSet(spec=spec, texts=(), n_available=spec.n_prompts, location="random tokens")
    if spec.kind == "hub":
        location, column, values = spec.source, spec.text_column, _read_hub(spec)
    else:
        path = BUILTIN_PROMPTS if spec.kind == "builtin" else Path(spec.source).expanduser()
        values, column = read_file(path, spec.text_column)
        location = "built-in default prompts" if spec.kind == "builtin" else str(path)
    texts = _texts(values, column, location)
    if not texts:
        raise PromptError(f"{location} holds no prompts (empty texts are skipped); add non-empty prompts")
    if len(texts) > spec.n_prompts:
        chosen = sorted(random.Random(spec.seed).sample(range(len(texts)), spec.n_prompts))
        selected = tuple(texts[index] for index in chosen)
    else:
        selected = tuple(texts)
    return PromptSet(spec=spec, texts=selected, n_available=len(texts), location=location)


TextRows = tuple[list[list[int]], list[int], tuple[str, ...]]


def ordinary_tokens(model: LoadedModel) -> torch.Tensor:
    """The ids random prompts draw from: every token of the tokenizer and the model's
    vocabulary that is not a special token."""
    import torch

    tokenizer = model.bridge.tokenizer
    special = set(tokenizer.all_special_ids)
    vocab = min(len(tokenizer), int(model.bridge.cfg.d_vocab))
    return torch.tensor([token for token in range(vocab) if token not in special], dtype=torch.long)


def _random_rows(prompt_set: PromptSet, model: LoadedModel, how: str) -> list[list[int]]:
    import torch

    spec = prompt_set.spec
    candidates = ordinary_tokens(model)
    prepend = how in ANCHOR_PREFIXED
    n_body = spec.max_len - int(prepend)
    generator = torch.Generator().manual_seed(spec.seed)
    body = candidates[torch.randint(len(candidates), (spec.n_prompts, n_body), generator=generator)]
    prefix = [anchor_token_id(model.bridge.tokenizer, model.info.causal, model.info.name)] if prepend else []
    return [prefix + row for row in body.tolist()]


def _text_rows(prompt_set: PromptSet, model: LoadedModel, how: str) -> TextRows:
    """The prompts' token ids cut to T, their full lengths, and notes on special-token text
    (a tokenizer without a BOS token gets none, where TransformerLens would prepend its EOS)."""
    spec, bridge = prompt_set.spec, model.bridge
    if prepend := how in ANCHOR_PREFIXED:
        anchor_token_id(model.bridge.tokenizer, model.info.causal, model.info.name)
    specials = special_texts(bridge.tokenizer)
    rows, full_lengths = [], []
    for text in prompt_set.texts:
        ids = text_ids(bridge, text, prepend, spec.parse_special_tokens, specials)
        full_lengths.append(len(ids))
        rows.append(ids[: spec.max_len])
    note = special_text_note(prompt_set.texts, specials, spec.parse_special_tokens)
    return rows, full_lengths, () if note is None else (note,)


def tokenize_prompts(prompt_set: PromptSet, model: LoadedModel) -> TokenizedPrompts:
    """Tokens ``[n, pos]`` (pos <= T), right-padded, with the attention mask and a summary;
    refused when the tokenizer is not the model's (``check_vocabulary``)."""
    import torch

    spec = prompt_set.spec
    check_context(spec, model.info.n_ctx, model.info.label)
    bridge = model.bridge
    d_vocab = int(bridge.cfg.d_vocab)
    check_vocabulary(bridge.tokenizer, d_vocab, model.info.label)
    notes: tuple[str, ...] = ()
    how = anchor_how(bridge.tokenizer, model.info.causal, spec.prepend_bos)
    if spec.kind == "random":
        rows = _random_rows(prompt_set, model, how)
        full_lengths = [len(row) for row in rows]
    else:
        rows, full_lengths, notes = _text_rows(prompt_set, model, how)
    check_token_ids(rows, d_vocab, model.info.label)
    lengths = [len(row) for row in rows]
    width = max(lengths)
    tokenizer = bridge.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(rows), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for index, row in enumerate(rows):
        tokens[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[index, : len(row)] = True
    texts = prompt_set.texts or tuple(tokenizer.decode(row) for row in rows)
    summary = PromptSummary(
        spec=spec,
        location=prompt_set.location,
        n_available=prompt_set.n_available,
        n_prompts=len(rows),
        n_truncated=sum(full > spec.max_len for full in full_lengths),
        n_tokens=sum(lengths),
        min_tokens=min(lengths),
        max_tokens=width,
        anchor_token=str(tokenizer.convert_ids_to_tokens(rows[0][0])),
        anchor_how=how,
        texts_sha256=texts_digest(prompt_set.texts),
    )
    return TokenizedPrompts(tokens=tokens, attention_mask=mask, texts=texts, summary=summary, notes=notes)
