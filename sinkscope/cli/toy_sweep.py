"""`sinkscope toy sweep`: the trigger task over a grid of configurations."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from sinkscope.cli.args import (
    POSITIVE,
    add_experiment,
    check_executor,
    experiment_options,
    int_list,
    out_path,
    say,
    str_list,
    switch_list,
    within,
)
from sinkscope.cli.inputs import CommandPaths, training_paths
from sinkscope.infra.bounds import SEEDS
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy sweep --out sinkscope-out/sweep      # seq_len 8,16,32 x d_model 8,16,32, softmax+relu, 3 seeds
  sinkscope toy sweep --layers 1,2 --heads 1,2 --seq-len 16 --d-model 16 --seeds 5 --out sinkscope-out/sweep-arch
  sinkscope toy sweep --attention softmax,relu,relu_prefix,sigmoid --seq-len 16 --d-model 16 --out sinkscope-out/kinds
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="the trigger task over a grid of seq_len, d_model, heads, layers and attention kinds",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        required=True,
        help="output directory (re-running resumes it)",
    )
    sweep.add_argument(
        "--preset",
        choices=("phase",),
        default=None,
        help="phase: the sink phase diagram, every attention kind x layers x heads x LayerNorm x MLP "
        "(1,024 models with --device cuda, 64 on a CPU); flags below narrow or widen it",
    )
    _add_grid(sweep)
    sweep.add_argument("--seeds", type=within(SEEDS), default=None, help="seeds per configuration (default 3)")
    sweep.add_argument("--max-steps", type=POSITIVE, default=20_000, help="step cap per model (default 20,000)")
    add_experiment(sweep, 500, "test sequences per model (default 500)")


def _add_grid(sweep: argparse.ArgumentParser) -> None:
    """The grid's axes: each flag a comma-separated list of values of one setting."""
    sweep.add_argument(
        "--seq-len",
        dest="seq_lens",
        metavar="SEQ_LEN",
        type=int_list,
        default=None,
        help="sequence lengths L, comma-separated (default 8,16,32)",
    )
    sweep.add_argument(
        "--d-model",
        dest="d_models",
        metavar="D_MODEL",
        type=int_list,
        default=None,
        help="token widths n, comma-separated (default 8,16,32)",
    )
    sweep.add_argument("--heads", type=int_list, default=None, help="heads per layer, comma-separated (default 1)")
    sweep.add_argument(
        "--layers", type=int_list, default=None, help="model depths (numbers of layers), comma-separated (default 1)"
    )
    sweep.add_argument(
        "--attention",
        dest="attentions",
        metavar="ATTENTION",
        type=str_list,
        default=None,
        help="attention kinds (softmax, relu, relu_prefix, sigmoid, or a sink mitigation of docs/toy-task.md), "
        "comma-separated (default softmax,relu)",
    )
    sweep.add_argument(
        "--layer-norm",
        dest="layer_norms",
        metavar="LAYER_NORM",
        type=switch_list,
        default=None,
        help="LayerNorm in each block: off, on or off,on (default off)",
    )
    sweep.add_argument(
        "--mlp",
        dest="mlps",
        metavar="MLP",
        type=switch_list,
        default=None,
        help="MLP blocks: off, on or off,on (default off)",
    )


def paths(args: argparse.Namespace) -> CommandPaths:
    return training_paths(args.out_dir, args.tensorboard_dir)


def run(args: argparse.Namespace) -> dict:
    check_executor(args)
    from sinkscope.toy.sweep import sweep

    result = sweep(_sweep_config(args), args.out_dir, **experiment_options(args))
    if not args.json:
        from sinkscope.reports.text import table_terminal
        from sinkscope.toy.tables import sweep_tables

        for table in sweep_tables(result.rows):
            say(table_terminal(table))
        say(
            f"wrote {Path(args.out_dir) / 'summary.json'} and plots ({result.wall_seconds:.0f} s); "
            f"`sinkscope report {args.out_dir}` writes its report"
        )
    return encode(result)


def _sweep_config(args: argparse.Namespace):
    """The grid the flags ask for: the axes given, over the defaults or the phase preset."""
    from sinkscope.toy.sweep import SweepConfig, phase_diagram

    axes = {
        "seq_lens": args.seq_lens,
        "d_models": args.d_models,
        "heads": args.heads,
        "layers": args.layers,
        "attentions": args.attentions,
        "layer_norms": args.layer_norms,
        "mlps": args.mlps,
        "seeds": args.seeds,
    }
    chosen = {name: value for name, value in axes.items() if value is not None}
    common = {"max_steps": args.max_steps, "n_sequences": args.n_sequences, "workers": args.workers}
    if args.preset == "phase":
        from sinkscope.infra.devices import resolve_device

        device_type = "cuda" if args.executor == "ray" and args.device.startswith("cuda") else None
        preset = phase_diagram(device_type or resolve_device(args.device).type, **common)
        return dataclasses.replace(preset, **chosen)
    return SweepConfig(**chosen, **common)
