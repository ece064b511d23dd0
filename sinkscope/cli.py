"""The ``sinkscope`` command line. The only module that imports from every package.

Exit codes: 0 ok, 1 the run failed (``RunFailed``, e.g. training diverged), 2 bad usage
or input (``InputError``, argparse's own errors, out of memory). Any other exception is a
bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import sinkscope
from sinkscope.execution.units import UnitsFailed
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError, RunFailed, SinkscopeError

if TYPE_CHECKING:  # toy loads torch; the command line checks its arguments first
    from sinkscope.toy.tracking import TrackingConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

TOY_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # the paper's six models, quick preset
  sinkscope toy train --attention relu --out runs/relu-1x1         # one model
  sinkscope toy probe runs/relu-1x1                                # sink probes + default-state test
  sinkscope toy tradeoff --run runs/softmax-1x1 --out out/tradeoff # Theorem 1's trade-off
  sinkscope toy TOY_COMMAND --help                                 # options and more examples
"""

TOY_TRAIN_EXAMPLES = """examples:
  sinkscope toy train --out runs/softmax-1x1
  sinkscope toy train --attention relu --layers 2 --heads 2 --seed 1 --out runs/relu-2x2
  sinkscope toy train --attention sigmoid --layer-norm --mlp --out runs/sigmoid-ln-mlp
  sinkscope toy train --out runs/softmax-1x1 --resume      # continue an interrupted run
  sinkscope toy train --out runs/softmax-1x1 --tensorboard tb   # log to TensorBoard: tensorboard --logdir tb
"""

TOY_REPRODUCE_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # ~4 min on 2 cores
  sinkscope toy reproduce --seeds 1 --out sinkscope-out/toy       # the paper's six models
  sinkscope toy reproduce --seeds 3 --out sinkscope-out/toy3      # three seeds each
  WANDB_MODE=offline sinkscope toy reproduce --quick --out sinkscope-out/toy-quick --wandb sinks  # W&B, no network
"""

TOY_PROBE_EXAMPLES = """examples:
  sinkscope toy probe sinkscope-out/toy-quick/softmax-2x2-seed0
  sinkscope toy probe runs/relu-1x1 --out probes/relu-1x1 --sequences 500 --json
"""

TOY_PATCH_EXAMPLES = """examples:
  sinkscope toy patch sinkscope-out/toy-quick/softmax-2x2-seed0
  sinkscope toy patch runs/softmax-1x1 --out patches/softmax-1x1 --inputs 128 --json
"""

TOY_SWEEP_EXAMPLES = """examples:
  sinkscope toy sweep --out sinkscope-out/sweep      # seq_len 8,16,32 x d_model 8,16,32, softmax+relu, 3 seeds
  sinkscope toy sweep --layers 1,2 --heads 1,2 --seq-len 16 --d-model 16 --seeds 5 --out sinkscope-out/sweep-arch
  sinkscope toy sweep --attention softmax,relu,relu_prefix,sigmoid --seq-len 16 --d-model 16 --out sinkscope-out/kinds
"""

TOY_TRADEOFF_EXAMPLES = """examples:
  sinkscope toy tradeoff --out sinkscope-out/tradeoff
  sinkscope toy tradeoff --run sinkscope-out/toy/softmax-1x1-seed0 --out sinkscope-out/tradeoff
"""

AUDIT_EXAMPLES = """examples:
  sinkscope audit gpt2 --out sinkscope-out/audit/gpt2
  sinkscope audit gpt2 --prompts random --n-prompts 100 --ablate --out sinkscope-out/audit/gpt2-random
  sinkscope audit gpt2 gpt2-medium distilgpt2 --prompts my_prompts.txt --out sinkscope-out/audit/gpt2-family
  sinkscope audit pythia-160m --revision step0 --revision step1000 --revision step143000 \\
      --out sinkscope-out/audit/pythia-160m-sweep
  sinkscope audit ./my-checkpoint --prompts data.csv --text-column body --no-prepend-bos --out out/mine
  sinkscope audit EleutherAI/pythia-1b --dtype bfloat16 --device-map auto \\
      --prompts Salesforce/wikitext:wikitext-2-raw-v1 --split "test[:2000]" --out out/pythia-1b
  sinkscope audit ./SmolLM2-135M-Instruct.Q4_1.gguf --ablate --ablate-prompts 16 --out out/smollm2

MODEL: a short name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2, pythia-14m ... pythia-12b,
pythia-70m-deduped ...), a Hugging Face id (org/name), a directory written by save_pretrained, or
a GGUF file (or a directory holding exactly one; needs pip install 'sinkscope[gguf]').
Several models, or several --revision values of one model, also write comparison.json/.md and
plots. Offline (HF_HUB_OFFLINE=1), hub models must already be in the local Hugging Face cache.
"""

COMPARE_EXAMPLES = """examples:
  sinkscope compare runs/a/pythia-70m-step1000 runs/b/pythia-70m-step143000 --out sinkscope-out/pythia-70m-steps
  sinkscope compare cluster-out/*/ --out sinkscope-out/all --overwrite && sinkscope report sinkscope-out/all

  sinkscope compare sinkscope-out/toy-quick sinkscope-out/audit/minilm --sink-eps 0.5 --out sinkscope-out/toy-vs-minilm
  sinkscope compare sinkscope-out/audit/gpt2 sinkscope-out/audit/pythia-70m --mechanism --out sinkscope-out/mech

When every DIR is an audit directory (audit.json), they must share their prompts and --sink-eps;
the audits are copied into --out (comparison.json), so the comparison and its report stand alone.
With a toy directory among them (a run, `toy probe` output, reproduction or sweep), an audit
comparison directory, or --mechanism, --out gets mechanism.json instead: every sink head of every
model with the shared probes (anchor mass, value-weighted anchor share, anchor value norm, dormant,
layer output norms and cancellation); --sink-eps implies it. A toy run without probe/probe.json
is probed here (nothing is written into it).
"""

REPORT_EXAMPLES = """examples:
  sinkscope report sinkscope-out/toy-quick                     # a reproduction: writes report.html, report.md there
  sinkscope report sinkscope-out/toy-quick/softmax-2x2-seed0/probe
  sinkscope report sinkscope-out/audit/minilm --out reports/minilm --overwrite
  sinkscope report sinkscope-out/audit/gpt2-family --json      # a comparison; print what was written as JSON

DIR: a directory written by `sinkscope toy reproduce`, `toy probe`, `toy tradeoff` or `audit`
(one model, or a comparison of several). report.html is one self-contained page (figures
embedded, no network needed); report.md has the same findings and tables.
"""

MAIN_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick && sinkscope report sinkscope-out/toy-quick
  sinkscope audit gpt2 --ablate --out sinkscope-out/audit/gpt2 && sinkscope report sinkscope-out/audit/gpt2
  sinkscope COMMAND --help                                      # every command's options and examples

exit codes: 0 ok, 1 run failed, 2 bad usage or input (one line naming the fix)
"""


def _add_common_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 8,16,32, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as 8,16,32, got {text!r}")
    return values


def _at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``, checked while parsing, before torch
    loads, so a bad count is one line in a fraction of a second."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


POSITIVE, NON_NEGATIVE = _at_least(1), _at_least(0)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text}")
    return value


def _toy_device(text: str) -> str:
    """cpu, cuda, cuda:N or auto, checked while parsing (whether this machine has the
    device is checked once torch loads, before anything is written)."""
    if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, got {text!r}")
    return text


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        type=_toy_device,
        default="cpu",
        help="where the models train: cpu, cuda, cuda:N, or auto (cuda when available) (default cpu)",
    )


def _add_executor(parser: argparse.ArgumentParser) -> None:
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


def _add_tracking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wandb",
        metavar="PROJECT",
        default=None,
        help="log every model trained to this Weights & Biases project (pip install 'sinkscope[tracking]'; "
        "WANDB_MODE=offline logs without a network)",
    )
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="log every model trained to TensorBoard, one subdirectory of DIR per model",
    )


def _tracking(args: argparse.Namespace) -> TrackingConfig | None:
    """``--wandb``/``--tensorboard`` as a ``TrackingConfig`` (None without either), its
    packages checked before anything is trained or written."""
    if args.wandb is None and args.tensorboard is None:
        return None
    from sinkscope.toy.tracking import TrackingConfig

    tracking = TrackingConfig(wandb_project=args.wandb, tensorboard_dir=args.tensorboard)
    tracking.check()
    return tracking


def _experiment_options(args: argparse.Namespace) -> dict:
    """How ``toy reproduce`` and ``toy sweep`` run: overwrite, progress, device, executor,
    tracking."""
    return {
        "overwrite": args.overwrite,
        "progress": not args.no_progress,
        "device": args.device,
        "executor": args.executor,
        "ray_address": args.ray_address,
        "tracking": _tracking(args),
    }


def _check_executor(args: argparse.Namespace) -> None:
    """A Ray address without the Ray executor, or the Ray executor without Ray: one line,
    before anything is loaded or written."""
    if args.ray_address is not None and args.executor != "ray":
        raise InputError("--ray-address is for --executor ray; pass both or neither")
    if args.executor == "ray":
        from sinkscope.execution.executors import check_ray_address, import_ray

        import_ray()
        if args.ray_address is not None:
            check_ray_address(args.ray_address)


def _switch_list(text: str) -> tuple[bool, ...]:
    values = {"off": False, "on": True}
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or any(part not in values for part in parts):
        raise argparse.ArgumentTypeError(f"expected off, on or off,on, got {text!r}")
    return tuple(dict.fromkeys(values[part] for part in parts))


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line naming ``--help`` (exit 2), not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sinkscope",
        description="Measure attention sinks: toy trigger-task models, probes, interventions, reports.",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sinkscope {sinkscope.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    toy = commands.add_parser(
        "toy",
        help="toy trigger-conditional models (the paper's experiments)",
        epilog=TOY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    toy_commands = toy.add_subparsers(dest="toy_command", required=True, metavar="TOY_COMMAND", parser_class=_Parser)

    train = toy_commands.add_parser(
        "train",
        help="train one toy model into a run directory",
        epilog=TOY_TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--out", required=True, help="run directory to create (or resume with --resume)")
    train.add_argument(
        "--attention", default="softmax", help="softmax | relu | relu_prefix | sigmoid (default softmax)"
    )
    train.add_argument("--layers", type=POSITIVE, default=1, help="number of layers (default 1)")
    train.add_argument("--heads", type=POSITIVE, default=1, help="heads per layer (default 1)")
    train.add_argument("--seed", type=NON_NEGATIVE, default=0)
    train.add_argument("--d-model", type=POSITIVE, default=16, help="token width n (default 16)")
    train.add_argument("--seq-len", type=POSITIVE, default=16, help="sequence length L (default 16)")
    train.add_argument(
        "--max-steps",
        type=POSITIVE,
        default=None,
        help="step cap (default 50,000; with --resume: the run's own, so a finished run stays finished "
        "unless you raise it)",
    )
    train.add_argument("--lr", type=_positive_float, default=None, help="default: 1e-3 for one layer, 1e-4 for several")
    train.add_argument(
        "--residual",
        choices=("auto", "yes", "no"),
        default="auto",
        help="residual stream (auto: none for one layer, as the paper)",
    )
    train.add_argument("--layer-norm", action="store_true", help="pre-LayerNorm (beyond the paper)")
    train.add_argument("--mlp", action="store_true", help="add an MLP per layer (beyond the paper)")
    train.add_argument("--pos-embed", action="store_true", help="learned positional embeddings (beyond the paper)")
    train.add_argument("--scale-scores", action="store_true", help="divide scores by sqrt(d_head) (beyond the paper)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument(
        "--checkpoint-every",
        type=POSITIVE,
        default=2_000,
        help="steps between checkpoints; an interrupted run resumes from the last one (default 2000)",
    )
    _add_device(train)
    _add_tracking(train)
    _add_common_output(train)

    reproduce = toy_commands.add_parser(
        "reproduce",
        help="train and evaluate the paper's six models; write summary.json/.md and heatmaps",
        epilog=TOY_REPRODUCE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reproduce.add_argument("--out", required=True, help="output directory (re-running resumes it)")
    reproduce.add_argument("--seeds", type=POSITIVE, default=None, help="seeds per model (default 3; --quick: 1)")
    reproduce.add_argument("--quick", action="store_true", help="reduced preset: one seed, at most 8,000 steps")
    reproduce.add_argument("--max-steps", type=POSITIVE, default=None, help="step cap per model (default 50,000)")
    reproduce.add_argument("--sequences", type=POSITIVE, default=1000, help="test sequences for heatmaps and tables")
    reproduce.add_argument("--workers", type=POSITIVE, default=2, help="parallel training processes (default 2)")
    _add_executor(reproduce)
    reproduce.add_argument("--overwrite", action="store_true", help="replace an existing, different --out")
    _add_device(reproduce)
    _add_tracking(reproduce)
    _add_common_output(reproduce)

    probe = toy_commands.add_parser(
        "probe",
        help="sink probes and the default-state test on a trained toy run",
        epilog=TOY_PROBE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by toy train/reproduce")
    probe.add_argument("--out", default=None, help="output directory (default RUN_DIR/probe)")
    probe.add_argument("--sequences", type=POSITIVE, default=1000, help="test sequences (default 1000)")
    probe.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    probe.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="probe an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    _add_common_output(probe)

    patch = toy_commands.add_parser(
        "patch",
        help="activation patching: triggered -> untriggered inputs, per head and per position",
        epilog=TOY_PATCH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    patch.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by toy train/reproduce")
    patch.add_argument("--out", default=None, help="output directory (default RUN_DIR/patch)")
    patch.add_argument("--inputs", type=POSITIVE, default=256, help="paired inputs (default 256)")
    patch.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    patch.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="patch an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    _add_common_output(patch)

    sweep = toy_commands.add_parser(
        "sweep",
        help="the trigger task over a grid of seq_len, d_model, heads, layers and attention kinds",
        epilog=TOY_SWEEP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("--out", required=True, help="output directory (re-running resumes it)")
    sweep.add_argument(
        "--preset",
        choices=("phase",),
        default=None,
        help="phase: the sink phase diagram, every attention kind x layers x heads x LayerNorm x MLP "
        "(1,024 models with --device cuda, 64 on a CPU); flags below narrow or widen it",
    )
    sweep.add_argument("--seq-len", type=_int_list, default=None, help="comma-separated (default 8,16,32)")
    sweep.add_argument("--d-model", type=_int_list, default=None, help="comma-separated (default 8,16,32)")
    sweep.add_argument("--heads", type=_int_list, default=None, help="comma-separated (default 1)")
    sweep.add_argument("--layers", type=_int_list, default=None, help="comma-separated (default 1)")
    sweep.add_argument("--attention", type=_str_list, default=None, help="comma-separated (default softmax,relu)")
    sweep.add_argument("--layer-norm", type=_switch_list, default=None, help="off, on or off,on (default off)")
    sweep.add_argument("--mlp", type=_switch_list, default=None, help="off, on or off,on (default off)")
    sweep.add_argument("--seeds", type=POSITIVE, default=None, help="seeds per configuration (default 3)")
    sweep.add_argument("--max-steps", type=POSITIVE, default=20_000, help="step cap per model (default 20,000)")
    sweep.add_argument("--sequences", type=POSITIVE, default=500, help="test sequences per model (default 500)")
    sweep.add_argument("--workers", type=POSITIVE, default=2, help="parallel training processes (default 2)")
    _add_executor(sweep)
    sweep.add_argument("--overwrite", action="store_true", help="replace an existing, different --out")
    _add_device(sweep)
    _add_tracking(sweep)
    _add_common_output(sweep)

    tradeoff = toy_commands.add_parser(
        "tradeoff",
        help="Theorem 1 made visible: off-trigger BOS mass vs default-position error",
        epilog=TOY_TRADEOFF_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tradeoff.add_argument("--out", required=True, help="directory for tradeoff.json and tradeoff.png")
    tradeoff.add_argument(
        "--run", action="append", default=[], help="a trained single-layer run directory to add (repeatable)"
    )
    tradeoff.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    _add_common_output(tradeoff)
    _add_audit_parser(commands)
    _add_report_parser(commands)
    _add_compare_parser(commands)
    return parser


def _add_report_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report",
        help="turn a result directory into report.html (self-contained) and report.md",
        epilog=REPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("result_dir", metavar="DIR", help="a directory written by sinkscope toy or audit")
    report.add_argument("--out", default=None, help="where to write the report (default DIR itself)")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report in --out")
    _add_common_output(report)


def _add_compare_parser(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        help="compare audits written separately, or toy runs and audits side by side (shared probes per sink head)",
        epilog=COMPARE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument(
        "directories",
        nargs="+",
        metavar="DIR",
        help="audit directories (audit.json), audit comparisons, toy runs, toy probes, reproductions or sweeps",
    )
    compare.add_argument("--out", required=True, help="the comparison directory to write")
    compare.add_argument(
        "--mechanism",
        action="store_true",
        help="write the toy-vs-pretrained sink-head comparison (mechanism.json) even when every DIR is an audit",
    )
    compare.add_argument(
        "--sequences",
        type=POSITIVE,
        default=1000,
        help="figure-set sequences for a toy run probed here (no probe/probe.json; default 1000)",
    )
    compare.add_argument(
        "--sink-eps",
        type=float,
        default=None,
        help="sink heads have anchor mass >= 1 - EPS in every model (implies --mechanism; default: each "
        "probe's own, 0.1 unless audited otherwise; real LMs' heads rarely reach 0.9)",
    )
    compare.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="probe toy runs that are still training or diverged (noted in the comparison) instead of refusing them",
    )
    compare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    _add_common_output(compare)


def _add_audit_parser(commands: argparse._SubParsersAction) -> None:
    from sinkscope.pretrained_analysis.loading import DTYPES
    from sinkscope.pretrained_analysis.prompts import DEFAULT_MAX_LEN, DEFAULT_N_PROMPTS

    audit = commands.add_parser(
        "audit",
        help="audit pretrained models (GPT-2, Pythia, any Hugging Face model) for attention sinks",
        epilog=AUDIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="short name, Hugging Face id, local directory, or a GGUF file (or a directory holding one)",
    )
    audit.add_argument(
        "--prompts",
        default="default",
        help="default (built-in English prompts), random (random tokens), a .txt (one prompt per "
        "line)/.jsonl/.csv/.parquet file, or a Hugging Face dataset ID[:CONFIG] (default: default)",
    )
    audit.add_argument(
        "--out",
        default=None,
        help="output directory (default sinkscope-out/audit/<model>); refused if it exists and is not "
        "empty, unless --overwrite",
    )
    audit.add_argument(
        "--revision",
        action="append",
        default=None,
        help="hub revision, e.g. a Pythia checkpoint step1000 (repeatable: a checkpoint sweep)",
    )
    audit.add_argument(
        "--max-len",
        type=_at_least(2),
        default=DEFAULT_MAX_LEN,
        help=f"T: most tokens per prompt, BOS included; longer prompts are truncated (default {DEFAULT_MAX_LEN})",
    )
    audit.add_argument(
        "--n-prompts",
        type=POSITIVE,
        default=DEFAULT_N_PROMPTS,
        help=f"number of prompts; a seeded subset when the source holds more (default {DEFAULT_N_PROMPTS})",
    )
    audit.add_argument(
        "--seed", type=NON_NEGATIVE, default=0, help="seed for random prompts, subsets and ablation controls"
    )
    audit.add_argument("--batch-size", type=POSITIVE, default=16, help="prompts per forward pass (default 16)")
    audit.add_argument(
        "--prepend-bos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put the tokenizer's BOS ([CLS] for encoders) first; it is the anchor (default: yes)",
    )
    audit.add_argument("--text-column", default="text", help="text column of .jsonl/.csv/.parquet files and datasets")
    audit.add_argument(
        "--split", default="train", help="dataset split, slicing allowed, e.g. 'test[:500]' (default train)"
    )
    audit.add_argument(
        "--ablate",
        action="store_true",
        help="loss change when each sink head's sink is removed, all together, and the anchor evicted",
    )
    audit.add_argument(
        "--ablate-heads",
        type=NON_NEGATIVE,
        default=16,
        help="sink heads ablated one by one, strongest first; all are ablated together too (default 16)",
    )
    audit.add_argument(
        "--ablate-prompts",
        type=POSITIVE,
        default=None,
        help="run the ablations on the first N prompts only (default: all)",
    )
    audit.add_argument(
        "--sink-eps", type=_fraction, default=0.1, help="sink head: anchor mass >= 1 - eps (default 0.1)"
    )
    audit.add_argument(
        "--examples", type=NON_NEGATIVE, default=2, help="prompts drawn as attention heatmaps (default 2)"
    )
    audit.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: TransformerLens picks)")
    audit.add_argument(
        "--workers",
        type=POSITIVE,
        default=1,
        help="with several models or revisions: audits at once (local processes, or the CPUs of a local Ray "
        "instance) (default 1)",
    )
    _add_executor(audit)
    audit.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weights dtype; for GGUF files, the dtype they are dequantised to (default float32)",
    )
    audit.add_argument("--device-map", default=None, help="split a large model across devices, e.g. auto")
    audit.add_argument("--n-devices", type=POSITIVE, default=None, help="split a large model across this many GPUs")
    audit.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    _add_common_output(audit)


def _toy_train(args: argparse.Namespace) -> dict:
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    tracking = _tracking(args)
    residual = {"auto": None, "yes": True, "no": False}[args.residual]
    max_steps = args.max_steps
    if max_steps is None:
        from sinkscope.toy.run_dir import CONFIG_FILE, read_config

        resuming = args.resume and (Path(args.out) / CONFIG_FILE).is_file()
        max_steps = read_config(args.out).train.max_steps if resuming else 50_000
    config = RunConfig(
        model=ToyModelConfig(
            n_layers=args.layers,
            n_heads=args.heads,
            d_model=args.d_model,
            seq_len=args.seq_len,
            attention=args.attention,
            residual=residual,
            layer_norm=args.layer_norm,
            mlp=args.mlp,
            positional_embedding=args.pos_embed,
            scale_scores=args.scale_scores,
        ),
        task=TaskConfig(d_model=args.d_model, seq_len=args.seq_len, eval_trigger_position=min(7, args.seq_len - 1)),
        train=TrainConfig(seed=args.seed, lr=args.lr, max_steps=max_steps, checkpoint_every=args.checkpoint_every),
    )
    from sinkscope.infra.atomic_io import holds_files

    out = Path(args.out)
    if holds_files(out) and not args.resume:
        raise InputError(f"{out} already exists; pass --resume to continue it or choose another --out")
    result = train(config, out, resume=True, progress=not args.no_progress, device=args.device, tracking=tracking)
    if not args.json:
        print(
            f"{result.status} after {result.steps} steps ({result.wall_seconds:.1f} s), "
            f"batch L-inf error {result.linf_error:.2e}; run directory: {out}"
        )
    return encode(result)


def _toy_reproduce(args: argparse.Namespace) -> dict:
    _check_executor(args)
    from sinkscope.toy.reproduce import ReproduceConfig, reproduce

    overrides = {"n_sequences": args.sequences, "workers": args.workers}
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    config = ReproduceConfig.quick(**overrides) if args.quick else ReproduceConfig(**overrides)
    summary = reproduce(config, args.out, **_experiment_options(args))
    if not args.json:
        from sinkscope.reports.text import table_terminal
        from sinkscope.toy.tables import MODEL_TABLE

        print(table_terminal(MODEL_TABLE.table(summary.models)))
        failed = [c for c in summary.checks if not c.passed]
        print(
            f"{len(summary.checks) - len(failed)} of {len(summary.checks)} checks against the paper pass"
            + (": failing: " + "; ".join(c.claim for c in failed) if failed else "")
        )
        print(f"wrote {Path(args.out) / 'summary.json'}; `sinkscope report {args.out}` writes its report")
    return encode(summary)


def _toy_probe(args: argparse.Namespace) -> dict:
    from sinkscope.toy.probe_run import probe_run

    report = probe_run(
        args.run_dir, args.out, args.sequences, overwrite=args.overwrite, allow_unfinished=args.allow_unfinished
    )
    if not args.json:
        state = report.default_state
        print(
            f"sink heads: {len(report.probe.sink_heads())} of {len(report.probe.heads)}; "
            f"layer outputs: norm of sum {report.probe.attn_out_norm_of_sum:.3g} vs sum of norms "
            f"{report.probe.attn_out_sum_of_norms:.3g}"
        )
        if state.default_error_before is not None:
            print(
                f"default-state test: default-position MSE {state.default_error_before:.2e} -> "
                f"{state.default_error_after_remove:.2e} with the sinks removed, "
                f"{state.default_error_after_control:.2e} with the matched control"
            )
        else:
            print(f"default-state test: {state.note}")
        print(f"wrote {', '.join(report.files)} in {report.out_dir}")
    return encode(report)


def _toy_patch(args: argparse.Namespace) -> dict:
    from sinkscope.toy.patching import patch_run

    result, files = patch_run(
        args.run_dir, args.out, args.inputs, overwrite=args.overwrite, allow_unfinished=args.allow_unfinished
    )
    if not args.json:
        heads = result.heads.matrix()
        print("z patched per (layer, head), normalised effect (1 = carries the trigger):")
        for layer, row in enumerate(heads.tolist()):
            print(f"  layer {layer}: " + "  ".join(f"{value:+.2f}" for value in row))
        positions = result.positions.matrix()
        strongest = int(positions.nan_to_num().abs().amax(dim=0).argmax())
        print(f"resid_pre: the trigger lives at position {strongest} (trigger at {result.trigger_position})")
        out = args.out or str(Path(args.run_dir) / "patch")
        print(f"wrote {', '.join(files)} in {out}")
    return encode(result)


def _toy_sweep(args: argparse.Namespace) -> dict:
    _check_executor(args)
    from sinkscope.toy.sweep import sweep

    result = sweep(_sweep_config(args), args.out, **_experiment_options(args))
    if not args.json:
        from sinkscope.reports.text import table_terminal
        from sinkscope.toy.tables import SWEEP_TABLE

        print(table_terminal(SWEEP_TABLE.table(result.rows)))
        print(
            f"wrote {Path(args.out) / 'summary.json'} and plots ({result.wall_seconds:.0f} s); "
            f"`sinkscope report {args.out}` writes its report"
        )
    return encode(result)


def _sweep_config(args: argparse.Namespace):
    """The grid the flags ask for: the axes given, over the defaults or the phase preset."""
    from sinkscope.toy.sweep import SweepConfig, phase_diagram

    axes = {
        "seq_lens": args.seq_len,
        "d_models": args.d_model,
        "heads": args.heads,
        "layers": args.layers,
        "attentions": args.attention,
        "layer_norms": args.layer_norm,
        "mlps": args.mlp,
        "seeds": args.seeds,
    }
    chosen = {name: value for name, value in axes.items() if value is not None}
    common = {"max_steps": args.max_steps, "n_sequences": args.sequences, "workers": args.workers}
    if args.preset == "phase":
        from sinkscope.toy.train import resolve_device

        device_type = "cuda" if args.executor == "ray" and args.device.startswith("cuda") else None
        preset = phase_diagram(device_type or resolve_device(args.device).type, **common)
        return dataclasses.replace(preset, **chosen)
    return SweepConfig(**chosen, **common)


def _toy_tradeoff(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
    from sinkscope.toy.tradeoff import write_tradeoff

    with claim_output_directory(args.out, args.overwrite, args.run, "the run"):
        with atomic_directory(args.out, replace=args.overwrite) as tmp:
            result = write_tradeoff(tmp, args.run)
    if not args.json:
        print(f"wrote {Path(args.out) / 'tradeoff.png'} and {Path(args.out) / 'tradeoff.json'}")
    return encode(result)


def _report(args: argparse.Namespace) -> dict:
    from sinkscope.reporting import report

    result = report(args.result_dir, args.out, overwrite=args.overwrite)
    if not args.json:
        print(f"{result.kind} report:")
        print("\n".join(f"- {finding}" for finding in result.findings))
        print(f"wrote {result.html} and {result.markdown}")
    return encode(result)


def _compare(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import claim_output_directory
    from sinkscope.mechanism import is_audit_directory

    out = Path(args.out)
    # --sink-eps only means something side by side, so it asks for that comparison too
    mechanism = args.mechanism or args.sink_eps is not None
    if mechanism or not all(is_audit_directory(d) for d in args.directories):
        return _compare_mechanism(args, out)
    with claim_output_directory(out, args.overwrite, [Path(d) for d in args.directories], "an audit to compare"):
        from sinkscope.pretrained_analysis.suite import compare_directories

        comparison = compare_directories(args.directories, out, overwrite=args.overwrite)
    if not args.json:
        print(comparison.to_markdown())
        print(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'} and a copy of each audit")
    return {"out": str(out), "comparison": encode(comparison)}


def _compare_mechanism(args: argparse.Namespace, out: Path) -> dict:
    """Toy and pretrained side by side (``sinkscope.mechanism``): mechanism.json in ``out``."""
    from sinkscope.infra.atomic_io import claim_output_directory
    from sinkscope.mechanism import compare_mechanism, write_mechanism

    with claim_output_directory(out, args.overwrite, [Path(d) for d in args.directories], "an input to compare"):
        comparison = compare_mechanism(
            args.directories,
            n_sequences=args.sequences,
            sink_eps=args.sink_eps,
            allow_unfinished=args.allow_unfinished,
        )
        write_mechanism(comparison, out, overwrite=args.overwrite)
    if not args.json:
        from sinkscope.probes.mechanism_report import mechanism_markdown

        print(mechanism_markdown(comparison))
        print(f"wrote {out / 'mechanism.md'}, {out / 'mechanism.json'} and {out / 'mechanism.png'}")
    return {"out": str(out), "mechanism": encode(comparison)}


def _audit_line(result) -> str:
    line = (
        f"{result.model.label}: {result.model.n_layers} layers x {result.model.heads_text}; sink rate "
        + ", ".join(f"{rate.percent:.1f}% (eps {rate.eps})" for rate in result.sink_rates)
        + f"; {len(result.sink_heads())} sink heads (anchor mass >= {1 - result.config.sink_eps:g})"
    )
    if result.ablation is not None:
        ablation = result.ablation
        line += f"; loss {ablation.base_loss:.3f}, anchor evicted {ablation.evict_anchor_delta:+.3f}"
    return line


def _audit(args: argparse.Namespace) -> dict:
    _check_executor(args)
    from sinkscope.pretrained_analysis.loading import LoadSpec, context_length, resolve_model
    from sinkscope.pretrained_analysis.prompts import PromptSpec, check_context

    revisions = args.revision or [None]
    if len(args.models) > 1 and len(revisions) > 1:
        raise InputError(
            "pass several models or several --revision values, not both (one --revision applies to every model)"
        )
    specs = [
        LoadSpec(name, revision, args.device, args.dtype, args.device_map, args.n_devices)
        for name in args.models
        for revision in revisions
    ]
    resolved = [resolve_model(spec.name, spec.revision) for spec in specs]
    prompt_spec = PromptSpec(
        source=args.prompts,
        max_len=args.max_len,
        n_prompts=args.n_prompts,
        seed=args.seed,
        prepend_bos=args.prepend_bos,
        text_column=args.text_column,
        split=args.split,
    )
    for where in resolved:
        n_ctx = context_length(where)
        if n_ctx is not None:
            check_context(prompt_spec, n_ctx, where.label)
    from sinkscope.pretrained_analysis.suite import unique_slugs

    slugs = unique_slugs([where.label for where in resolved])
    out = Path(args.out or f"sinkscope-out/audit/{slugs[0]}{'-comparison' if len(specs) > 1 else ''}")
    inputs = [Path(where.location) for where in resolved if where.is_local]
    if prompt_spec.kind == "file":
        inputs.append(Path(prompt_spec.source))
    if len(specs) > 1:
        return _audit_suite(args, out, specs, resolved, slugs, prompt_spec, inputs)
    from sinkscope.infra.atomic_io import claim_output_directory

    with claim_output_directory(out, args.overwrite, inputs, "this audit's own input"):
        return _audit_one(args, out, specs[0], resolved[0], prompt_spec)


def _audit_config(args: argparse.Namespace):
    from sinkscope.pretrained_analysis.audit import AuditConfig

    return AuditConfig(
        batch_size=args.batch_size,
        sink_eps=args.sink_eps,
        ablate=args.ablate,
        ablate_heads=args.ablate_heads,
        ablate_prompts=args.ablate_prompts,
        n_examples=args.examples,
        seed=args.seed,
    )


def _audit_one(args: argparse.Namespace, out: Path, spec, resolved, prompt_spec) -> dict:
    """One model into ``out``, once it is checked and locked."""
    from sinkscope.pretrained_analysis.prompts import load_prompt_set

    prompt_set = load_prompt_set(prompt_spec)  # before torch loads: a bad prompt file fails in about a second

    from sinkscope.infra.atomic_io import atomic_directory
    from sinkscope.pretrained_analysis.audit import audit, write_audit
    from sinkscope.pretrained_analysis.loading import load_model

    progress = not args.no_progress
    if args.executor == "ray":  # one unit, written by the Ray worker (out must be on a disk the node shares)
        from sinkscope.execution import run_units, units_failed
        from sinkscope.pretrained_analysis.suite import unit_of

        unit = unit_of(_absolute(spec, resolved), _absolute_prompts(prompt_spec), _audit_config(args), out.resolve())
        report = run_units([unit], "ray", 1, args.ray_address)
        if report.failed:
            raise units_failed(report.failed, 1, "audit")
        (result,) = report.finished.values()
    else:
        with atomic_directory(out, replace=args.overwrite) as tmp:
            loaded = load_model(spec, resolved, progress=progress)
            result = audit(loaded, prompt_set, _audit_config(args), progress=progress)
            del loaded
            write_audit(result, tmp)
    if not args.json:
        print(_audit_line(result))
        print(f"wrote {out / 'audit.json'} and figures")
    return encode(result)


def _audit_suite(
    args: argparse.Namespace, out: Path, specs: list, resolved: list, slugs: tuple[str, ...], prompt_spec, inputs
) -> dict:
    """Several models or revisions: one unit each, resumable (``sinkscope.pretrained_analysis.suite``)."""
    from sinkscope.pretrained_analysis.prompts import load_prompt_set

    load_prompt_set(prompt_spec)  # a bad prompt file fails here, in about a second, before any unit

    from sinkscope.infra.atomic_io import refuse_output_directory
    from sinkscope.pretrained_analysis.suite import AuditSuite, audit_suite

    refuse_output_directory(out, True, inputs, "this audit's own input")  # overwriting out would delete an input
    suite = AuditSuite(
        tuple(_absolute(spec, where) for spec, where in zip(specs, resolved)),
        slugs,
        _absolute_prompts(prompt_spec),
        _audit_config(args),
    )
    bar = _units_bar(len(specs), "audits", not args.no_progress)
    if not args.json:
        bar.write(f"{len(specs)} audits into {out}: " + ", ".join(slugs))

    def done(result) -> None:
        bar.update(1)
        if not args.json:
            bar.write(_audit_line(result))

    with bar:
        comparison = audit_suite(suite, out, args.overwrite, done, args.executor, args.workers, args.ray_address)
    if not args.json:
        print(comparison.to_markdown())
        print(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'} and one audit directory per model")
    return {"out": str(out), "comparison": encode(comparison)}


def _absolute(spec, where):
    """A local model by its absolute path (a unit may run in another working directory)."""
    if not where.is_local:
        return spec
    location = Path(where.location) / where.gguf_file if where.gguf_file else Path(where.location)
    return dataclasses.replace(spec, name=str(location))


def _absolute_prompts(prompt_spec):
    if prompt_spec.kind != "file":
        return prompt_spec
    return dataclasses.replace(prompt_spec, source=str(Path(prompt_spec.source).expanduser().resolve()))


def _units_bar(total: int, what: str, enabled: bool):
    """One overall bar: units done of ``total`` (finished ones from an earlier run count
    once the run reads them back)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="unit", disable=not enabled, leave=False)


HANDLERS = {
    ("audit", None): _audit,
    ("toy", "train"): _toy_train,
    ("toy", "reproduce"): _toy_reproduce,
    ("toy", "probe"): _toy_probe,
    ("toy", "patch"): _toy_patch,
    ("toy", "sweep"): _toy_sweep,
    ("toy", "tradeoff"): _toy_tradeoff,
    ("report", None): _report,
    ("compare", None): _compare,
}


INTERRUPTED = {
    "toy": "training checkpointed the step it stopped at: re-run toy train with --resume, or reproduce "
    "and sweep with the same settings, to continue; an --overwrite run (and probe, patch, tradeoff) "
    "left the old result as it was",
    "audit": "one model: nothing was written; several: the finished audits are kept, run the same command to "
    "continue; any old result is as it was",
    "report": "files already replaced are complete; re-run with --overwrite",
    "compare": "nothing was written; any old comparison is as it was",
}


# library settings whose command-line flag has another name: field -> argparse dest
FIELD_DESTS = {
    "n_examples": "examples",
    "n_sequences": "sequences",
    "n_inputs": "inputs",
    "source": "prompts",
    "seq_lens": "seq_len",
    "d_models": "d_model",
    "attentions": "attention",
    "layer_norms": "layer_norm",
    "mlps": "mlp",
    "n_layers": "layers",
    "n_heads": "heads",
    "out_dir": "out",
    "run_dir": "out",  # toy train's run directory; probe and patch take RUN_DIR as an argument
    "wandb_project": "wandb",
    "tensorboard_dir": "tensorboard",
}


def _active_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command that ran, e.g. ``toy train``'s."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return _active_parser(action.choices[getattr(args, action.dest)], args)
    return parser


def _with_flag(error: SinkscopeError, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``error``'s one line, with the flag of the setting it names (its ``field``) appended:
    library messages name settings (``max_len``), the command line names flags (``--max-len``)."""
    message = str(error)
    if error.field is None:
        return message
    actions = {action.dest: action for action in _active_parser(parser, args)._actions}
    action = actions.get(error.field) or actions.get(FIELD_DESTS.get(error.field, ""))
    if action is None or not action.option_strings:  # no such flag on this command, or a positional
        return message
    return f"{message} ({'/'.join(action.option_strings)})"


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler or ``kill``) ends a run as Ctrl-C does: temporaries removed,
    finished checkpoints and results kept."""
    raise KeyboardInterrupt


def _terminated_after_the_work(signum: int, frame: object) -> None:
    """SIGTERM once the result is complete (printing it, or the interpreter shutting down):
    one line and exit 1 at once, instead of the default silent death (exit 143)."""
    try:
        sys.stdout.flush()  # what was printed (a --json result, a table) still reaches its reader
    finally:
        sys.stderr.write("sinkscope: interrupted after the result was complete; it is kept\n")
        sys.stderr.flush()
        os._exit(EXIT_FAILED)


def _out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error) or "out of memory" in str(error)


def main(argv: list[str] | None = None) -> int:
    """The console script (``argv=None``: the process's arguments) or an in-process call
    (tests); an in-process caller gets its own SIGTERM handler back at the end."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = HANDLERS[(args.command, getattr(args, f"{args.command}_command", None))]
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main_thread else None
    try:
        result = handler(args)
        if args.json:
            print(json.dumps(result, indent=2))
    except UnitsFailed as error:
        for failure in error.failures:  # a bug in a unit shows its traceback, as it would here
            if failure.kind == "bug":
                print(f"sinkscope: unit {failure.name} raised:\n{failure.traceback.rstrip()}", file=sys.stderr)
        if error.field is not None:  # every unit failed on the same bad setting: bad input
            print(f"sinkscope: error: {_with_flag(error, parser, args)}", file=sys.stderr)
            return EXIT_USAGE
        print(f"sinkscope: run failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    except InputError as error:
        print(f"sinkscope: error: {_with_flag(error, parser, args)}", file=sys.stderr)
        return EXIT_USAGE
    except RunFailed as error:
        print(f"sinkscope: run failed: {_with_flag(error, parser, args)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"sinkscope: interrupted; {INTERRUPTED[args.command]}", file=sys.stderr)
        return EXIT_FAILED
    except (RuntimeError, MemoryError) as error:
        if not _out_of_memory(error):
            raise  # any other exception is a bug in sinkscope or below it: its traceback shows
        # a count too large for this machine: the input, not the code
        from sinkscope.pretrained_analysis.loading import first_line

        print(
            f"sinkscope: error: out of memory ({first_line(error)}); lower the sizes and counts "
            "(--sequences, --inputs, --heads, --d-model, --batch-size, --n-prompts, --max-len)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    finally:
        if in_main_thread:
            # the console script keeps a SIGTERM handler through the interpreter's shutdown;
            # an in-process caller (tests) gets its own back
            signal.signal(signal.SIGTERM, _terminated_after_the_work if argv is None else previous)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
