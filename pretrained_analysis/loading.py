"""Load pretrained models through TransformerLens ``TransformerBridge``, failing fast: the
public face of ``resolve`` (a name -> where its files are), ``gguf_files`` (GGUF
checkpoints) and ``boot`` (the bridge, its device, ``ModelInfo``).

``load_model`` resolves a ``LoadSpec`` (unless given the ``ResolvedModel``), boots the
bridge with raw Hugging Face weights and records what was loaded in a ``ModelInfo``;
``wrap_model`` does the same for a model already in memory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sinkscope.infra.arguments import check_argument, check_number, check_path
from sinkscope.infra.bounds import POSITIVE, Bound
from sinkscope.infra.devices import check_device_name
from sinkscope.infra.errors import InputError
from sinkscope.infra.heartbeat import heartbeat
from sinkscope.pretrained_analysis.boot import (
    LoadedModel,
    ModelInfo,
    boot_bridge,
    boot_in_memory,
    describe_bridge,
)
from sinkscope.pretrained_analysis.gguf_files import gguf_context_length, gguf_quantization
from sinkscope.pretrained_analysis.resolve import (
    CONFIG_FILE,
    CONTEXT_FIELDS,
    GGUF_SUFFIX,
    SHORT_NAMES,
    ModelLoadError,
    ModelNotAvailableError,
    ResolvedModel,
    UnknownModelError,
    cached_file,
    directory_label,
    first_line,
    hub_offline,
    resolve_model,
)

__all__ = [
    "DTYPES",
    "GGUF_SUFFIX",
    "SHORT_NAMES",
    "LoadSpec",
    "LoadedModel",
    "ModelInfo",
    "ModelLoadError",
    "ModelNotAvailableError",
    "ResolvedModel",
    "UnknownModelError",
    "context_length",
    "describe_bridge",
    "directory_label",
    "first_line",
    "gguf_quantization",
    "hub_offline",
    "load_model",
    "loading_announced",
    "masked_lm_from_encoder",
    "resolve_model",
    "wrap_model",
]

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
# the logger of transformers' load report, and the records of it that a missing head explains
TRANSFORMERS_LOAD_LOGGER = "transformers.modeling_utils"
LOAD_REPORT_SIGNS = ("seem corrupted", "LOAD REPORT")
# a BERT encoder checkpoint (what sentence-transformers ships) lacks the masked-LM head and
# carries a pooler: the only keys a masked-LM load may miss, and the only ones it may not use
ENCODER_HEAD_PREFIX, ENCODER_POOLER_PREFIX = "cls.", "pooler."
# what transformers' from_pretrained accepts as a string device_map
DEVICE_MAP_PATTERN = r"auto|balanced|balanced_low_0|sequential|cpu|disk|mps|cuda(:\d+)?|\d+"


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how.

    name: short name, Hugging Face id or local directory; revision: hub branch/tag/commit
    (Pythia training checkpoints are ``step0`` ... ``step143000``); device: ``cpu``, ``cuda``,
    ``cuda:N``, ``mps`` or ``auto`` (``sinkscope.infra.devices``; None: TransformerLens
    picks); dtype: one of ``DTYPES``; device_map /
    n_devices: passed through to ``boot_transformers`` to split a large model across
    devices (exclusive with ``device``).
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {"n_devices": POSITIVE}

    name: str
    revision: str | None = None
    device: str | None = None
    dtype: str = "float32"
    device_map: str | None = None
    n_devices: int | None = None

    def __post_init__(self) -> None:
        check_path(self.name, "name", "a model name, Hugging Face id or local path")
        object.__setattr__(self, "name", os.fspath(self.name))  # accept a pathlib.Path for local directories
        if not self.name.strip():
            raise UnknownModelError(
                "the model name is empty; pass e.g. gpt2, pythia-70m, org/name or a local directory"
            )
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}", field="dtype")
        if self.device is not None:
            check_device_name(str(self.device))  # the spelling now; whether this machine has it, at load
        if self.device is not None and (self.device_map is not None or self.n_devices is not None):
            raise InputError("device is exclusive with device_map and n_devices; pass one placement", field="device")
        check_number(self.n_devices, self.BOUNDS["n_devices"], "n_devices", none=True)
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


def context_length(resolved: ResolvedModel) -> int | None:
    """The context length in the model's config.json (or a GGUF file's metadata) when it is
    on disk (None otherwise)."""
    if resolved.gguf_file is not None:
        return gguf_context_length(resolved)
    if resolved.is_local:
        config_path: str | None = str(Path(resolved.location) / CONFIG_FILE)
    else:
        config_path = cached_file(resolved.location, CONFIG_FILE, resolved.revision)
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
        raise ModelLoadError(f"{config_path} is not valid JSON ({error}); {fix}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} is not a model config (a JSON object); {fix}")
    for field_name in CONTEXT_FIELDS:
        value = config.get(field_name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_model(spec: LoadSpec, resolved: ResolvedModel | None = None, progress: bool = True) -> LoadedModel:
    """Boot ``spec`` through ``TransformerBridge.boot_transformers`` (raw weights, eager attention)."""
    check_argument(spec, LoadSpec, "spec", "a LoadSpec, e.g. LoadSpec('gpt2')")
    check_argument(resolved, (ResolvedModel, type(None)), "resolved", "a ResolvedModel or None")
    resolved = resolved or resolve_model(spec.name, spec.revision)
    return boot_bridge(spec, resolved, progress)


@contextmanager
def loading_announced(label: str, enabled: bool = True) -> Iterator[None]:
    """``loading LABEL ...`` on stderr before the block (importing TransformerLens and
    reading the weights: ten seconds and more on two busy cores), a ``still loading`` line
    every few seconds while it lasts (``heartbeat``) and ``loaded LABEL in N s`` after it,
    so no stretch of a run is silent."""
    started = time.monotonic()
    if enabled:
        print(f"loading {label} (TransformerLens, the weights) ...", file=sys.stderr, flush=True)
    with heartbeat(f"loading {label}", enabled):
        yield
    if enabled:
        print(f"loaded {label} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


class _HeldLoadReport(logging.Filter):
    """Holds transformers' load-report records (``LOAD_REPORT_SIGNS``) back; others pass."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if any(sign in record.getMessage() for sign in LOAD_REPORT_SIGNS):
            self.held.append(record)
            return False
        return True


def only_the_head_is_missing(info: dict[str, Any]) -> bool:
    """Whether a masked-LM load of an encoder checkpoint (``from_pretrained``'s
    ``output_loading_info``) missed only the masked-LM head and left only the pooler unused:
    every weight of the embeddings and the attention layers then came from the checkpoint."""
    missing, unexpected = info.get("missing_keys", ()), info.get("unexpected_keys", ())
    return (
        all(key.startswith(ENCODER_HEAD_PREFIX) for key in missing)
        and all(key.startswith(ENCODER_POOLER_PREFIX) for key in unexpected)
        and not info.get("mismatched_keys")
        and not info.get("error_msgs")
    )


def masked_lm_from_encoder(path: str | os.PathLike) -> tuple[Any, Any]:
    """(``AutoModelForMaskedLM``, its tokenizer) from a BERT encoder checkpoint such as
    all-MiniLM-L6-v2, the class TransformerLens wraps BERT with. The checkpoint has no
    masked-LM head, so transformers initialises one at random and logs a red "This checkpoint
    seem corrupted" load report; attention audits never read that head, so when the head
    (and the unused pooler) is all that differs, the report is dropped for this one load and
    one line says why. Any other difference keeps the report, as transformers wrote it."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    check_path(path, "path", "a local model directory")
    logger = logging.getLogger(TRANSFORMERS_LOAD_LOGGER)
    held = _HeldLoadReport()
    logger.addFilter(held)
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(os.fspath(path), output_loading_info=True)
    finally:
        logger.removeFilter(held)
    if held.held and only_the_head_is_missing(info):
        print(
            f"sinkscope: {directory_label(os.fspath(path))} is an encoder checkpoint without a masked-LM head; "
            "transformers gave the model a random head (and its load report calls that corrupted), but attention "
            "audits read only the encoder, whose every weight was loaded",
            file=sys.stderr,
        )
    else:
        for record in held.held:
            logger.handle(record)
    return model.eval(), AutoTokenizer.from_pretrained(os.fspath(path))


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

    bridge = model if hasattr(model, "original_model") and hasattr(model, "cfg") else boot_in_memory(model, tokenizer)
    bridge.eval()
    hf_config = bridge.original_model.config
    location = str(getattr(hf_config, "name_or_path", "") or "")
    label = name or (directory_label(location) if location else type(bridge.original_model).__name__)
    hooked = HookedModel(bridge).spec
    return LoadedModel(
        bridge, describe_bridge(bridge, hooked, name or location or label, label, location or "(in memory)")
    )
