"""Which tensor of a checkpoint does not fit its config.json, named for the error message.

transformers refuses weights whose shapes differ from the model its config builds, but
says only "look at the above report" (a report it logs, which sinkscope silences). This
module reads the shapes again, cheaply: the checkpoint's from the safetensors headers,
the config's from the model built on torch's ``meta`` device (no memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from sinkscope.pretrained_analysis.resolve import ResolvedModel, cached_file

# a diagnosis is a courtesy on the way to an error; any of these means "cannot say"
DIAGNOSIS_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    KeyError,
    AttributeError,
    TypeError,
    ImportError,
    RuntimeError,
    SafetensorError,
)


def _safetensors_files(resolved: ResolvedModel) -> list[Path]:
    if resolved.is_local:
        return sorted(Path(resolved.location).glob("*.safetensors"))
    found = cached_file(resolved.location, "model.safetensors", resolved.revision)
    return [Path(found)] if found else []


def _expected_shapes(resolved: ResolvedModel) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape in the model that config.json builds (on the meta device)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(resolved.location, revision=resolved.revision)
    architecture = (getattr(config, "architectures", None) or [""])[0]
    model_class: Any = getattr(transformers, architecture, None)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config) if model_class is None else model_class(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _match(key: str, expected: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The expected shape of checkpoint tensor ``key`` (names may differ by a prefix such as ``transformer.``)."""
    if key in expected:
        return expected[key]
    for name, shape in expected.items():
        if name.endswith("." + key) or key.endswith("." + name):
            return shape
    return None


def weight_mismatch(resolved: ResolvedModel) -> str | None:
    """``"NAME is [a, b] in FILE but [c, d] by config.json (and N more tensors)"`` for the
    first misfitting tensor (by name), or None when it cannot be said."""
    try:
        expected = _expected_shapes(resolved)
        mismatches = _mismatches(resolved, expected)
    except DIAGNOSIS_ERRORS:
        return None
    if not mismatches:
        return None
    first = mismatches[0]
    more = f" (and {len(mismatches) - 1} more tensors)" if len(mismatches) > 1 else ""
    return first + more


def _mismatches(resolved: ResolvedModel, expected: dict[str, tuple[int, ...]]) -> list[str]:
    from safetensors import safe_open

    found: list[str] = []
    for path in _safetensors_files(resolved):
        with safe_open(str(path), framework="pt") as checkpoint:
            for key in sorted(checkpoint.keys()):
                shape = tuple(checkpoint.get_slice(key).get_shape())
                wanted = _match(key, expected)
                if wanted is not None and wanted != shape:
                    found.append(f"{key} is {list(shape)} in {path.name} but {list(wanted)} by config.json")
    return found
