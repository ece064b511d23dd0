"""`sinkscope toy train`: one toy model into a run directory."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.cli.args import (
    POSITIVE,
    add_common_output,
    add_compile,
    add_device,
    add_tracking,
    out_path,
    positive_float,
    say,
    tracking_config,
    within,
)
from sinkscope.cli.inputs import CommandPaths, training_paths
from sinkscope.cli.toy_run_flags import refuse_other_settings
from sinkscope.infra.bounds import SEED
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError

if TYPE_CHECKING:
    from sinkscope.toy.run_dir import RunConfig

EXAMPLES = """examples:
  sinkscope toy train --out runs/softmax-1x1
  sinkscope toy train --attention relu --layers 2 --heads 2 --seed 1 --out runs/relu-2x2
  sinkscope toy train --attention sigmoid --layer-norm --mlp --out runs/sigmoid-ln-mlp
  sinkscope toy train --out runs/softmax-1x1 --resume      # continue an interrupted run
  sinkscope toy train --attention relu --layers 2 --heads 2 --seed 1 --out runs/relu-2x2 --resume
                                                           # resume repeats the run's own flags
  sinkscope toy train --out runs/softmax-1x1 --overwrite   # retrain from step 0; the old run stays until it ends
  sinkscope toy train --out runs/softmax-1x1 --tensorboard tb   # log to TensorBoard: tensorboard --logdir tb
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser(
        "train",
        help="train one toy model into a run directory",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument(
        "--out",
        type=out_path,
        dest="run_dir",
        metavar="OUT",
        required=True,
        help="run directory to create (or resume with --resume)",
    )
    train.add_argument(
        "--attention",
        default="softmax",
        help="softmax | relu | relu_prefix | sigmoid, or a sink mitigation: softmax1 | learned_sink | kv_bias | "
        "kv_bias_zero_value | softpick | gated_head | gated_element | value_gated (docs/toy-task.md; default softmax)",
    )
    train.add_argument(
        "--layers", dest="n_layers", metavar="LAYERS", type=POSITIVE, default=1, help="number of layers (default 1)"
    )
    train.add_argument(
        "--heads", dest="n_heads", metavar="HEADS", type=POSITIVE, default=1, help="heads per layer (default 1)"
    )
    train.add_argument("--seed", type=within(SEED), default=0, help="seed of the weights and training data (default 0)")
    train.add_argument("--d-model", type=POSITIVE, default=16, help="token width n (default 16)")
    train.add_argument("--seq-len", type=POSITIVE, default=16, help="sequence length L (default 16)")
    train.add_argument(
        "--max-steps",
        type=POSITIVE,
        default=None,
        help="step cap (default 50,000; with --resume: the run's own, so a finished run stays finished "
        "unless you raise it)",
    )
    train.add_argument("--lr", type=positive_float, default=None, help="default: 1e-3 for one layer, 1e-4 for several")
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
    _add_attempt_flags(train)
    add_device(train)
    add_compile(train)
    add_tracking(train)
    add_common_output(train)


def _add_attempt_flags(train: argparse.ArgumentParser) -> None:
    """Whether this command continues the run in --out, restarts it, and how often it checkpoints."""
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="retrain the run in --out from step 0 with these flags; the new run is built beside it and replaces "
        "it whole when training ends (interrupted or killed, the old run stays as it was)",
    )
    train.add_argument(
        "--checkpoint-every",
        type=POSITIVE,
        default=None,
        help="steps between checkpoints; an interrupted run resumes from the last one (default 2000; "
        "with --resume: the run's own, and it may differ)",
    )


def _resumed_config(args: argparse.Namespace) -> RunConfig | None:
    """The config of the run ``--resume`` continues (None without --resume or a run): its
    config.json, or when that was lost, what its checkpoints recorded."""
    from sinkscope.toy.resume import recorded_config
    from sinkscope.toy.run_dir import CONFIG_FILE, read_config

    if not args.resume:
        return None
    if (Path(args.run_dir) / CONFIG_FILE).is_file():
        return read_config(args.run_dir)
    return recorded_config(Path(args.run_dir))


def paths(args: argparse.Namespace) -> CommandPaths:
    return training_paths(args.run_dir, args.tensorboard_dir)


def run(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import followed
    from sinkscope.infra.swap import recover_swaps
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    if args.resume and args.overwrite:
        raise InputError("--resume continues the run and --overwrite retrains it from step 0; pass one of them")
    recover_swaps(followed(Path(args.run_dir)))  # a restart killed mid-swap: its old run back before it is read
    tracking = tracking_config(args)
    residual = {"auto": None, "yes": True, "no": False}[args.residual]
    existing = _resumed_config(args)
    max_steps = args.max_steps or (existing.train.max_steps if existing else 50_000)
    checkpoint_every = args.checkpoint_every or (existing.train.checkpoint_every if existing else 2_000)
    config = RunConfig(
        model=ToyModelConfig(
            n_layers=args.n_layers,
            n_heads=args.n_heads,
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
        train=TrainConfig(seed=args.seed, lr=args.lr, max_steps=max_steps, checkpoint_every=checkpoint_every),
    )
    if existing is not None:
        refuse_other_settings(Path(args.run_dir), existing, config)
    from sinkscope.infra.atomic_io import holds_files

    out = Path(args.run_dir)
    if holds_files(out) and not (args.resume or args.overwrite):
        raise InputError(
            f"{out} already exists; pass --resume to continue it, --overwrite to retrain it from step 0, "
            "or choose another --out"
        )
    result = train(
        config,
        out,
        resume=True,
        progress=not args.no_progress,
        device=args.device,
        tracking=tracking,
        compile=args.compile,
        overwrite=args.overwrite,
    )
    if not args.json:
        say(
            f"{result.status} after {result.steps} steps ({result.wall_seconds:.1f} s), "
            f"batch L-inf error {result.linf_error:.2e}; run directory: {out}"
        )
    return encode(result)
