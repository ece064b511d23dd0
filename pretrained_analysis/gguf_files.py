"""GGUF checkpoints (llama.cpp's format): their metadata, and the dequantised model.

transformers' GGUF support (the optional ``gguf`` package, ``pip install
'sinkscope[gguf]'``) dequantises every tensor to ``LoadSpec.dtype``; the model and its
tokenizer (from the file's metadata) are then handed to the bridge, and ``ModelInfo``
records the file and its quantisation type.

transformers' GGUF reader leaves ``config.architectures`` empty for most families, and
TransformerBridge picks its adapter from that field (or from a model-type table of its own
that lacks some, such as ``gemma3_text``): ``name_architecture`` fills it in from the
config's model type through transformers' own causal-LM auto mapping, the class
``AutoModelForCausalLM`` itself chose.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinkscope.infra.devices import is_out_of_memory
from sinkscope.infra.errors import SUPPORTED_FAMILIES_DOC
from sinkscope.pretrained_analysis.resolve import (
    GGUF_INSTALL,
    ModelLoadError,
    ResolvedModel,
    first_line,
)

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.loading import LoadSpec


def gguf_reader(resolved: ResolvedModel):
    """A memory-mapped ``gguf.GGUFReader`` over the checkpoint (reads metadata only)."""
    try:
        import gguf
    except ImportError as error:
        raise ModelLoadError(f"reading {resolved.gguf_file} needs the gguf package; {GGUF_INSTALL}") from error
    if not hasattr(gguf.ReaderField, "contents"):
        raise ModelLoadError(
            f"reading {resolved.gguf_file} needs gguf >= 0.16 (found an older one); {GGUF_INSTALL} --upgrade"
        )
    try:
        return gguf.GGUFReader(Path(resolved.location) / str(resolved.gguf_file))
    except (ValueError, OSError, KeyError, IndexError) as error:
        raise ModelLoadError(
            f"{resolved.gguf_file} is not a readable GGUF file ({first_line(error)}); pass an intact .gguf checkpoint"
        ) from error


def gguf_field(reader: Any, key: str) -> Any:
    """A metadata value of a GGUF file (None when absent)."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


# metadata key prefixes that belong to no model family
SHARED_PREFIXES = frozenset({"GGUF", "general", "tokenizer", "split", "adapter", "quantize"})


def gguf_architecture(reader: Any, resolved: ResolvedModel) -> str:
    """``general.architecture``, checked against the family its own metadata keys name
    (``llama.block_count``...): an edited field would load the weights as another family."""
    architecture = gguf_field(reader, "general.architecture")
    families = sorted({key.split(".")[0] for key in reader.fields if "." in key} - SHARED_PREFIXES)
    if not isinstance(architecture, str) or not architecture:
        raise ModelLoadError(
            f"{resolved.gguf_file} records no general.architecture; pass an intact .gguf checkpoint "
            "(download or convert it again)"
        )
    if families and architecture not in families:
        raise ModelLoadError(
            f"{resolved.gguf_file} says architecture {architecture} but its metadata is for {' and '.join(families)} "
            f"({families[0]}.block_count ...), so the field was edited or the file is damaged; pass an intact "
            ".gguf checkpoint (download or convert it again)"
        )
    check_gguf_shapes(reader, architecture, resolved)
    return architecture


BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")


def check_gguf_shapes(reader: Any, architecture: str, resolved: ResolvedModel) -> None:
    """The layer and head counts in a GGUF file's metadata, checked against its tensors before
    anything is built: a count of 0, or more blocks than the file holds tensors for, is a
    damaged file (it was a traceback, or "this family is not supported" for a supported one)."""
    blocks = gguf_field(reader, f"{architecture}.block_count")
    heads = gguf_field(reader, f"{architecture}.attention.head_count")
    held = 1 + max((int(m.group(1)) for t in reader.tensors if (m := BLOCK_TENSOR.match(t.name))), default=-1)
    problem = None
    if not isinstance(blocks, int) or blocks < 1:
        problem = f"{architecture}.block_count is {blocks!r}, not a positive count"
    elif blocks > held:
        problem = f"{architecture}.block_count is {blocks} but it holds tensors for {held} blocks"
    elif heads is not None and any(
        not isinstance(h, int) or h < 1 for h in (heads if isinstance(heads, list) else [heads])
    ):
        problem = f"{architecture}.attention.head_count is {heads!r}, not a positive count"
    if problem is not None:
        raise ModelLoadError(
            f"{resolved.gguf_file} is damaged: {problem}; pass an intact .gguf checkpoint (download or convert it again)"
        )


def gguf_quantization(resolved: ResolvedModel) -> str:
    """The checkpoint's quantisation type as llama.cpp names it (``Q4_1``, ``Q8_0``, ``F16``, ...),
    from ``general.file_type``; when that is absent, the most common tensor type. The
    architecture is checked on the way (``gguf_architecture``)."""
    reader = gguf_reader(resolved)  # names the install command when gguf is missing
    gguf_architecture(reader, resolved)
    import gguf

    file_type = gguf_field(reader, "general.file_type")
    if file_type is not None:
        try:
            return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
    return max(counts, key=lambda name: counts[name]) if counts else "unknown"


def gguf_context_length(resolved: ResolvedModel) -> int | None:
    """The context length in a GGUF file's metadata (None when it records none)."""
    reader = gguf_reader(resolved)
    architecture = gguf_architecture(reader, resolved)
    value = gguf_field(reader, f"{architecture}.context_length")
    return int(value) if isinstance(value, int) and value > 0 else None


def load_gguf(resolved: ResolvedModel, spec: LoadSpec, progress: bool) -> dict[str, Any]:
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
        # with output_loading_info, a (model, loading report) pair, which transformers' stub omits
        pair: Any = AutoModelForCausalLM.from_pretrained(
            resolved.location,
            gguf_file=resolved.gguf_file,
            dtype=getattr(torch, spec.dtype),
            attn_implementation="eager",
            device_map=spec.device_map,
            output_loading_info=True,
        )
        hf_model, loading = pair
        tokenizer = AutoTokenizer.from_pretrained(resolved.location, gguf_file=resolved.gguf_file)
    except ImportError as error:  # transformers checks the gguf version itself
        raise ModelLoadError(
            f"transformers could not read {resolved.gguf_file}: {first_line(error)}; {GGUF_INSTALL}"
        ) from error
    except (ValueError, KeyError, NotImplementedError, OSError) as error:
        raise _unreadable(resolved, error) from error
    except RuntimeError as error:  # torch's refusal of tensors that do not fit the metadata's shapes
        if is_out_of_memory(error):
            raise
        raise ModelLoadError(
            f"the tensors of {resolved.gguf_file} do not fit the model its metadata describes "
            f"({first_line(error)}); pass an intact .gguf checkpoint (download or convert it again)"
        ) from error
    finally:
        gguf_utils.tqdm = bar
    refuse_unread_weights(resolved, hf_model.config, loading.get("missing_keys") or ())
    name_architecture(hf_model.config)
    if spec.device is not None:
        hf_model = hf_model.to(spec.device)
    return {"hf_model": hf_model.eval(), "tokenizer": tokenizer}


def refuse_unread_weights(resolved: ResolvedModel, config: Any, missing: Any) -> None:
    """Refuse a model some of whose weights transformers' GGUF reader did not find in the file
    (it names them in a log and starts them at random): an audit of it would measure random
    weights. gpt-oss files as llama.cpp writes them are one such family (experts, sinks)."""
    if not missing:
        return
    example = sorted(missing)[0]
    raise ModelLoadError(
        f"transformers' GGUF reader does not read {len(missing)} weights of the "
        f"{getattr(config, 'model_type', '?')} family from {resolved.gguf_file} (such as {example}); "
        f"the supported families are listed in {SUPPORTED_FAMILIES_DOC}"
    )


def name_architecture(config: Any) -> None:
    """Give a config that names no architecture the causal-LM class transformers' own auto
    mapping gives its model type (``gemma3_text`` -> ``Gemma3ForCausalLM``)."""
    if getattr(config, "architectures", None):
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(getattr(config, "model_type", "")))
    if class_name is not None:
        config.architectures = [class_name]


# transformers' words for a family its GGUF reader does not have, and where they name it
GGUF_REFUSALS = (r"GGUF model with architecture (\S+) is not supported", r"Unknown gguf model_type: (\S+)")


def _unreadable(resolved: ResolvedModel, error: Exception) -> ModelLoadError:
    """One line for transformers' refusal of a GGUF file: the family and where the supported
    ones are listed when the family is what it lacks, else its own first line."""
    said = first_line(error)
    family = next((found.group(1) for pattern in GGUF_REFUSALS if (found := re.search(pattern, said))), None)
    if family is not None:
        return ModelLoadError(
            f"transformers' GGUF reader does not support the {family} family ({resolved.gguf_file}); "
            f"the supported families are listed in {SUPPORTED_FAMILIES_DOC}"
        )
    return ModelLoadError(
        f"transformers could not read {resolved.gguf_file}: {said}; pass an intact .gguf checkpoint "
        f"of a family listed in {SUPPORTED_FAMILIES_DOC}"
    )
