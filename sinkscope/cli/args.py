"""What every command shares: argument types checked while parsing (before torch loads,
so a bad value is one line in a fraction of a second), the common flags (output,
device, executor, tracking) and the parser class that makes usage errors one line."""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import TYPE_CHECKING, Any

from sinkscope.infra.bounds import COUNT, EPS, POSITIVE_NUMBER, SAMPLES, Bound
from sinkscope.infra.bounds import POSITIVE as POSITIVE_RANGE
from sinkscope.infra.devices import check_device_name
from sinkscope.infra.errors import InputError

if TYPE_CHECKING:  # toy loads torch; the command line checks its arguments first
    from sinkscope.toy.tracking import TrackingConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEBUG_VARIABLE = "SINKSCOPE_DEBUG"


def add_common_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_debug(parser, default=argparse.SUPPRESS)  # accepted after the command too


def add_debug(parser: argparse.ArgumentParser, default: object = False) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="on an error, print the full traceback with its chained causes instead of one line "
        "(or set SINKSCOPE_DEBUG=1)",
    )


def debugging(args: argparse.Namespace) -> bool:
    """Whether errors show their full chained traceback: ``--debug`` or ``SINKSCOPE_DEBUG=1``."""
    from_environment = os.environ.get(DEBUG_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}
    return bool(getattr(args, "debug", False)) or from_environment


def list_items(text: str) -> list[str]:
    """The items of a comma-separated list, stripped; an empty item (``8,``, ``8,,16``) is
    refused rather than dropped, since it is usually a value left out by mistake."""
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; remove the extra comma or fill in the value")
    return parts


def int_list(text: str, bound: Bound = POSITIVE_RANGE, example: str = "8,16,32") -> tuple[int, ...]:
    """Comma-separated integers, each within ``bound`` (a setting's declared range)."""
    parts = list_items(text)
    try:
        values = tuple(int(part) for part in parts)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as {example}, got {text!r}"
        ) from error
    outside = [value for value in values if not bound.admits(value)]
    if outside:
        raise argparse.ArgumentTypeError(
            f"{outside[0]} is out of range: each item must be {bound.as_setting(True)}, e.g. {example}"
        )
    return values


int_list.bound = POSITIVE_RANGE  # type: ignore[attr-defined]


LAYERS_EXAMPLE = "0,3,5 or 0-3 or 0-3,7"
MAX_LAYER = 9999  # beyond any model's depth; a range this long would only fill memory


def layer_list(text: str) -> tuple[int, ...]:
    """``--layers``: layer indices counted from 0, as a list (``0,3,5``), a range
    (``0-3``, both ends included) or both (``0-3,7``), sorted without repeats. Whether the
    model has these layers is checked once its size is known."""
    chosen: set[int] = set()
    for item in list_items(text):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item, re.ASCII)
        if match is None:
            raise argparse.ArgumentTypeError(f"expected layer indices such as {LAYERS_EXAMPLE}, got {item!r}")
        first, last = int(match[1]), int(match[2] or match[1])
        if first > last:
            raise argparse.ArgumentTypeError(f"the range {item} runs backwards; write it low to high, {last}-{first}")
        if last > MAX_LAYER:
            raise argparse.ArgumentTypeError(
                f"layer {last} is beyond any model's depth; choose layers up to {MAX_LAYER}"
            )
        chosen.update(range(first, last + 1))
    return tuple(sorted(chosen))


layer_list.bound = Bound(0, MAX_LAYER)  # type: ignore[attr-defined]  # read by tests


def prompt_text(text: str) -> str:
    """``--prompt``: one prompt's text, which must hold more than whitespace."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; type the prompt's text, e.g. --prompt 'The cat sat on the mat.'")
    return text


class OnlyOnce(argparse.Action):
    """A flag that may be given once: a second value would silently replace the first."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "was given twice; give one list, e.g. " + LAYERS_EXAMPLE)
        setattr(namespace, self.dest, values)


def add_layers(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--layers",
        type=layer_list,
        action=OnlyOnce,
        default=None,
        metavar="LAYERS",
        help=f"probe these layers only, counted from 0: a list, a range or both, e.g. {LAYERS_EXAMPLE}; "
        f"{what} (default: every layer)",
    )


def within(bound: Bound):
    """An argparse type: an integer within ``bound``, the declared range of the setting the
    flag sets (``sinkscope.infra.bounds``: what its config, and the reader of the file it is
    written to, accept), checked while parsing, before torch loads, so a bad count is one
    line in a fraction of a second. ``bound`` is kept on the type for tests to read."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from error
        if not bound.admits(value):
            shown = text if len(text) <= 24 else f"an integer of {len(text)} digits"
            raise argparse.ArgumentTypeError(f"must be {bound.as_setting(True)}, got {shown}")
        return value

    parse.__name__, parse.bound = f"integer in {bound}", bound  # type: ignore[attr-defined]
    return parse


POSITIVE, NON_NEGATIVE = within(POSITIVE_RANGE), within(COUNT)


def real_within(bound: Bound):
    """An argparse type: a finite number within ``bound`` (NaN and infinities refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from error
        if math.isnan(value) or not bound.admits(value):
            raise argparse.ArgumentTypeError(f"must be {bound.as_setting(False)}, got {text}")
        return value

    parse.__name__, parse.bound = f"number in {bound}", bound  # type: ignore[attr-defined]
    return parse


positive_float, fraction = real_within(POSITIVE_NUMBER), real_within(EPS)


def device_name(text: str) -> str:
    """A device name of ``sinkscope.infra.devices``' vocabulary, checked while parsing
    (whether this machine has the device is checked once torch loads, before anything is
    written)."""
    try:
        return check_device_name(text)
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        type=device_name,
        default="cpu",
        help="where the models train: cpu, cuda, cuda:N, mps, or auto (cuda, else mps, when available) (default cpu)",
    )


def add_compile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="compile each training step with torch.compile (CUDA: as CUDA graphs): on, off, or auto "
        "(on with CUDA, off on a CPU, where eager is the bit-identical reference and compiling costs "
        "about a minute per model shape) (default auto)",
    )


def add_executor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where the units run: local processes, or Ray (pip install 'sinkscope[ray]') (default local)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="with --executor ray: auto (join the running cluster) or HOST:PORT of its head "
        "(default: a local Ray instance started for this run)",
    )


def add_tracking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wandb",
        dest="wandb_project",
        metavar="PROJECT",
        default=None,
        help="log every model trained to this Weights & Biases project (pip install 'sinkscope[tracking]'; "
        "WANDB_MODE=offline logs without a network)",
    )
    parser.add_argument(
        "--tensorboard",
        dest="tensorboard_dir",
        metavar="DIR",
        default=None,
        help="log every model trained to TensorBoard, one subdirectory of DIR per model",
    )


def tracking_config(args: argparse.Namespace) -> TrackingConfig | None:
    """``--wandb``/``--tensorboard`` as a ``TrackingConfig`` (None without either), its
    packages checked before anything is trained or written."""
    if args.wandb_project is None and args.tensorboard_dir is None:
        return None
    from sinkscope.toy.tracking import TrackingConfig

    tracking = TrackingConfig(wandb_project=args.wandb_project, tensorboard_dir=args.tensorboard_dir)
    tracking.check()
    return tracking


def experiment_options(args: argparse.Namespace) -> dict:
    """How ``toy reproduce`` and ``toy sweep`` run: overwrite, progress, device, compile,
    executor, tracking."""
    return {
        "overwrite": args.overwrite,
        "progress": not args.no_progress,
        "device": args.device,
        "compile": args.compile,
        "executor": args.executor,
        "ray_address": args.ray_address,
        "tracking": tracking_config(args),
    }


def check_executor(args: argparse.Namespace) -> None:
    """A Ray address without the Ray executor, or the Ray executor without Ray: one line,
    before anything is loaded or written."""
    if args.ray_address is not None and args.executor != "ray":
        raise InputError("--ray-address is for --executor ray; pass both or neither")
    if args.executor == "ray":
        from sinkscope.execution.executors import check_ray_address, import_ray

        import_ray()
        if args.ray_address is not None:
            check_ray_address(args.ray_address)


def out_path(text: str) -> str:
    """An output directory's path: an empty one would silently mean the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; pass the directory to write, e.g. --out results/run")
    return text


def switch_list(text: str) -> tuple[bool, ...]:
    values = {"off": False, "on": True}
    parts = list_items(text)
    if any(part not in values for part in parts):
        raise argparse.ArgumentTypeError(f"expected off, on or off,on, got {text!r}")
    return tuple(dict.fromkeys(values[part] for part in parts))


def str_list(text: str) -> tuple[str, ...]:
    return tuple(list_items(text))


class Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line naming ``--help`` (exit 2), not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def units_bar(total: int, what: str, enabled: bool):
    """One overall bar: units done of ``total`` (finished ones from an earlier run count
    once the run reads them back)."""
    from sinkscope.infra.heartbeat import progress_bar

    return progress_bar(total, what, enabled, unit="unit")


def add_experiment(parser: argparse.ArgumentParser, sequences_default: int, sequences_help: str) -> None:
    """The flags of a command that trains and evaluates many toy models (reproduce, sweep):
    test sequences, workers, executor, --overwrite, device, tracking and output."""
    parser.add_argument(
        "--sequences",
        dest="n_sequences",
        metavar="SEQUENCES",
        type=within(SAMPLES),
        default=sequences_default,
        help=sequences_help,
    )
    parser.add_argument("--workers", type=POSITIVE, default=2, help="parallel training processes (default 2)")
    add_executor(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, different --out")
    add_device(parser)
    add_compile(parser)
    add_tracking(parser)
    add_common_output(parser)


def say(*parts: object) -> None:
    """Print a command's human-readable output with ``print``'s spacing, through the
    terminal's one escaper: a control character in a model's, a run's or a file's name is
    shown as its escape, never sent to the terminal."""
    from sinkscope.reports.text import terminal_text

    print(terminal_text(" ".join(str(part) for part in parts)))
