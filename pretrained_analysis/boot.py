"""Booting a ``TransformerBridge`` (raw Hugging Face weights, eager attention), placing
it on its device, and reading off what was loaded (``ModelInfo``).

The bridge is booted without ``enable_compatibility_mode`` processing, so value and
residual norms stay meaningful. A failure to boot is an ``InputError`` only when it is
one (files that cannot be read, an architecture TransformerLens does not support); out
of memory propagates as itself, since it says nothing about the model's architecture.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from safetensors import SafetensorError

from sinkscope.infra.bounds import COUNT, POSITIVE, Bound
from sinkscope.infra.devices import is_out_of_memory, resolve_device
from sinkscope.infra.errors import SUPPORTED_FAMILIES_DOC, InputError
from sinkscope.pretrained_analysis.gguf_files import gguf_quantization, load_gguf
from sinkscope.pretrained_analysis.resolve import (
    OFFLINE_FIX,
    ModelLoadError,
    ModelNotAvailableError,
    ResolvedModel,
    first_line,
)
from sinkscope.pretrained_analysis.weight_shapes import weight_mismatch

if TYPE_CHECKING:
    from sinkscope.interp.model_spec import ModelSpec
    from sinkscope.pretrained_analysis.loading import LoadSpec


@dataclass(frozen=True)
class ModelInfo:
    """What was loaded. ``causal``: False for bidirectional encoders (BERT family),
    which are audited with their first token ([CLS]) as the anchor and no loss.
    ``n_kv_heads``: key/value heads (fewer than ``n_heads`` under grouped-query
    attention); ``source_file`` / ``quantization``: the GGUF file and its quantisation
    type (e.g. ``Q4_1``) when the weights were dequantised from one, else None."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "d_model": POSITIVE,
        "d_head": POSITIVE,
        "n_ctx": POSITIVE,
        "n_params": COUNT,
        "n_kv_heads": POSITIVE,
    }

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
    def model_name(self) -> str:
        """The label without its ``@revision`` (the ``model`` column of ``heads.csv``, beside
        its ``revision`` column)."""
        suffix = f"@{self.revision}"
        return self.label.removesuffix(suffix) if self.revision is not None else self.label

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


# what TransformerBridge says when a model's attention has a QK-norm its adapter cannot hook
UNDECLARED_QK_NORM = "but adapter did not declare"


def boot_bridge(spec: LoadSpec, resolved: ResolvedModel, progress: bool) -> LoadedModel:
    """The bridge over ``resolved``, placed as ``spec`` asks (its device resolved by
    ``sinkscope.infra.devices``), and what it is."""
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    from sinkscope.interp.hooked_model import HookedModel

    if not progress:
        _hide_download_bars()
    if spec.device is not None:
        spec = dataclasses.replace(spec, device=str(resolve_device(spec.device)))
    placement, quantization = _placement(spec, resolved, progress)
    if progress and "hf_model" in placement:  # the weights are read; wrapping them takes seconds more, with no bar
        print("wrapping the model in a TransformerLens bridge ...", file=sys.stderr, flush=True)
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
        ) from error
    except SafetensorError as error:
        raise ModelLoadError(
            f"the weights of {spec.label} in {resolved.location} cannot be read ({first_line(error)}); "
            "restore them (save_pretrained writes them)"
        ) from error
    except (ValueError, NotImplementedError) as error:  # what transformers and TransformerBridge raise for it
        if is_out_of_memory(error):
            raise
        raise ModelLoadError(
            unsupported_family(error, spec.label)
            or f"TransformerBridge could not load {spec.label} ({resolved.location}): {first_line(error)}; "
            "pass a Hugging Face model of an architecture TransformerLens supports"
        ) from error
    except RuntimeError as error:  # after NotImplementedError, which is one
        if UNDECLARED_QK_NORM in str(error):  # TransformerLens 4.3's Phi adapter and qk_layernorm
            raise ModelLoadError(
                f"TransformerBridge cannot hook the QK-norm of {spec.label} ({first_line(error)}); "
                "TransformerLens does not support this configuration of its architecture yet"
            ) from error
        if is_out_of_memory(error) or not _is_state_dict_mismatch(error):
            raise  # the machine's limit, or a bug: not the model's architecture
        raise _misfit(spec, resolved, error) from error
    bridge.eval()
    hooked = HookedModel(bridge).spec  # the probes' own reading of the bridge (causal, kv heads)
    return LoadedModel(bridge=bridge, info=_model_info(spec, resolved, bridge, hooked, quantization))


# how TransformerBridge starts its refusal of a config it has no adapter for; the rest of
# that line lists every architecture it has (about 5,000 characters)
BRIDGE_REFUSAL = "Could not determine supported architecture"


def unsupported_family(error: Exception, label: str) -> str | None:
    """One short line for TransformerBridge's refusal of a model family, naming the family
    (the config's model type, which the refusal ends with) and where the supported ones
    are listed; None for any other error."""
    said = first_line(error)
    if not said.startswith(BRIDGE_REFUSAL):
        return None
    model_type = re.search(r"Model type: (\S+)$", said)
    family = f"the {model_type.group(1)} family" if model_type else "this model family"
    return f"TransformerBridge does not support {family} ({label}); the supported families are listed in {SUPPORTED_FAMILIES_DOC}"


def _is_state_dict_mismatch(error: RuntimeError) -> bool:
    """torch's or transformers' refusal of weights whose shapes or names do not fit the model
    built from the config (transformers 5 says only ``ignore_mismatched_sizes``)."""
    text = str(error)
    return any(sign in text for sign in ("Error(s) in loading state_dict", "size mismatch", "ignore_mismatched_sizes"))


def _misfit(spec: LoadSpec, resolved: ResolvedModel, error: RuntimeError) -> ModelLoadError:
    """Weights that do not fit config.json, in one line naming the tensor and both shapes when it can."""
    said = first_line(error)
    if "above report" in said:  # transformers points at a report it logged, which is silenced
        said = "some tensors have other shapes than the model config.json describes"
    detail = weight_mismatch(resolved) or said
    return ModelLoadError(
        f"the weights of {spec.label} in {resolved.location} do not fit its config.json: {detail}; restore the "
        "config.json saved with these weights (save_pretrained writes both together), or the weights it was saved with"
    )


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
    return load_gguf(resolved, spec, progress), quantization


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


def tokenizer_with_files(tokenizer: Any) -> Any:
    """``tokenizer``, or where it was built in memory with a BOS token, the same tokenizer
    reloaded from files of its own: TransformerLens reloads a tokenizer from its files to
    make it add BOS, and one without files stops it (``KeyError: 'name_or_path'``). The
    files stay in a temporary folder until the process ends, because the anchor decision
    (``sinkscope.interp.anchors.own_tokenizer``) reads them again."""
    init = getattr(tokenizer, "init_kwargs", None)
    if not isinstance(init, dict) or init.get("name_or_path") or getattr(tokenizer, "bos_token", None) is None:
        return tokenizer
    import atexit
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    folder = tempfile.mkdtemp(prefix="sinkscope-tokenizer-")
    atexit.register(shutil.rmtree, folder, True)
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def boot_in_memory(model: Any, tokenizer: Any) -> Any:
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
    if not callable(tokenizer) or not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise InputError(
            f"tokenizer must be a Hugging Face tokenizer object, got {type(tokenizer).__name__}; load it with "
            "transformers.AutoTokenizer.from_pretrained(path)",
            field="tokenizer",
        )
    parameter = next(model.parameters())
    try:
        return TransformerBridge.boot_transformers(
            str(getattr(model.config, "name_or_path", "") or type(model).__name__),
            hf_model=model,
            tokenizer=tokenizer_with_files(tokenizer),
            device=parameter.device,
            dtype=parameter.dtype,
        )
    except (ValueError, NotImplementedError) as error:
        raise ModelLoadError(
            unsupported_family(error, type(model).__name__)
            or f"TransformerBridge cannot wrap {type(model).__name__}: {first_line(error)}; "
            "pass a model of an architecture TransformerLens supports"
        ) from error
    except AttributeError as error:  # a headless model (AutoModel) where the adapter expects its head class
        raise ModelLoadError(
            f"TransformerBridge cannot wrap a {type(model).__name__} ({first_line(error)}); load it with the class "
            "TransformerLens uses, e.g. AutoModelForCausalLM for decoders or AutoModelForMaskedLM for BERT, "
            "or pass a TransformerBridge"
        ) from error
