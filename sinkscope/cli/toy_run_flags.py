"""A toy run's settings as the `toy train` flags that set them, so that a resume asked
with other flags is told which flags and values to repeat (not to delete the run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.infra.errors import InputError

if TYPE_CHECKING:
    from sinkscope.toy.run_dir import RunConfig

_VALUED = {
    "model.attention": "--attention",
    "model.n_layers": "--layers",
    "model.n_heads": "--heads",
    "model.d_model": "--d-model",
    "task.d_model": "--d-model",
    "model.seq_len": "--seq-len",
    "task.seq_len": "--seq-len",
    "task.eval_trigger_position": "--seq-len",  # toy train derives it from --seq-len
    "train.seed": "--seed",
    "train.lr": "--lr",
}
_SWITCHES = {
    "model.layer_norm": "--layer-norm",
    "model.mlp": "--mlp",
    "model.positional_embedding": "--pos-embed",
    "model.scale_scores": "--scale-scores",
}
_RESIDUAL = {None: "auto", True: "yes", False: "no"}


def _value(config: RunConfig, dotted: str) -> object:
    section, key = dotted.split(".", 1)
    return getattr(getattr(config, section), key)


def setting_as_flag(config: RunConfig, dotted: str) -> str:
    """The flag (and value) that gives ``config`` its setting ``dotted``, e.g. ``--layers 2``;
    a setting no flag sets is named as ``name=value``."""
    if dotted in ("task.seq_len", "task.eval_trigger_position"):
        dotted = "model.seq_len"
    if dotted == "task.d_model":
        dotted = "model.d_model"
    value = _value(config, dotted)
    if dotted == "model.residual":
        return f"--residual {_RESIDUAL[value]}"  # type: ignore[index]
    if dotted in _SWITCHES:
        return _SWITCHES[dotted] if value else f"no {_SWITCHES[dotted]}"
    if dotted in _VALUED:
        return f"no {_VALUED[dotted]}" if value is None else f"{_VALUED[dotted]} {value}"
    return f"{dotted}={value} (no toy train flag sets it: resume it from Python)"


def refuse_other_settings(run_dir: Path, existing: RunConfig, wanted: RunConfig) -> None:
    """One line naming the flags and values to repeat when ``--resume`` asks for settings
    that change the numbers and differ from the run's own."""
    from sinkscope.toy.run_member import config_differences

    order = [*_VALUED, "model.residual", *_SWITCHES]  # toy train's own flag order
    differing = sorted(config_differences(existing, wanted), key=lambda n: order.index(n) if n in order else len(order))
    if not differing:
        return
    theirs = list(dict.fromkeys(setting_as_flag(existing, name) for name in differing))
    asked = list(dict.fromkeys(setting_as_flag(wanted, name) for name in differing))
    raise InputError(
        f"{run_dir} was trained with {' '.join(theirs)} but this command says {' '.join(asked)}; "
        f"repeat the run's own flags ({' '.join(theirs)}) with --resume to continue it, "
        "train the new settings into another --out, or retrain the run with them (--overwrite)"
    )
