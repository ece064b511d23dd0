"""The ``sinkscope`` command line. The only module that imports from every package.

Exit codes: 0 ok, 1 the run failed (e.g. training diverged), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

TOY_TRAIN_EXAMPLES = """examples:
  sinkscope toy train --out runs/softmax-1x1
  sinkscope toy train --attention relu --layers 2 --heads 2 --seed 1 --out runs/relu-2x2
  sinkscope toy train --attention sigmoid --layer-norm --mlp --out runs/sigmoid-ln-mlp
  sinkscope toy train --out runs/softmax-1x1 --resume      # continue an interrupted run
"""

TOY_REPRODUCE_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # ~3 min on 2 cores
  sinkscope toy reproduce --seeds 1 --out sinkscope-out/toy       # the paper's six models
  sinkscope toy reproduce --seeds 3 --out sinkscope-out/toy3      # three seeds each
"""

TOY_PROBE_EXAMPLES = """examples:
  sinkscope toy probe sinkscope-out/toy-quick/softmax-2x2-seed0
  sinkscope toy probe runs/relu-1x1 --out probes/relu-1x1 --sequences 500 --json
"""

TOY_TRADEOFF_EXAMPLES = """examples:
  sinkscope toy tradeoff --out sinkscope-out/tradeoff
  sinkscope toy tradeoff --run sinkscope-out/toy/softmax-1x1-seed0 --out sinkscope-out/tradeoff
"""


def _add_common_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinkscope",
        description="Measure attention sinks: toy trigger-task models, probes, interventions, reports.",
        epilog="exit codes: 0 ok, 1 run failed, 2 bad usage or input",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    toy = commands.add_parser("toy", help="toy trigger-conditional models (the paper's experiments)")
    toy_commands = toy.add_subparsers(dest="toy_command", required=True, metavar="TOY_COMMAND")

    train = toy_commands.add_parser(
        "train", help="train one toy model into a run directory",
        epilog=TOY_TRAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--out", required=True, help="run directory to create (or resume with --resume)")
    train.add_argument("--attention", default="softmax", help="softmax | relu | relu_prefix | sigmoid (default softmax)")
    train.add_argument("--layers", type=int, default=1, help="number of layers (default 1)")
    train.add_argument("--heads", type=int, default=1, help="heads per layer (default 1)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--d-model", type=int, default=16, help="token width n (default 16)")
    train.add_argument("--seq-len", type=int, default=16, help="sequence length L (default 16)")
    train.add_argument("--max-steps", type=int, default=50_000)
    train.add_argument("--lr", type=float, default=None, help="default: 1e-3 for one layer, 1e-4 for several")
    train.add_argument("--residual", choices=("auto", "yes", "no"), default="auto",
                       help="residual stream (auto: none for one layer, as the paper)")
    train.add_argument("--layer-norm", action="store_true", help="pre-LayerNorm (beyond the paper)")
    train.add_argument("--mlp", action="store_true", help="add an MLP per layer (beyond the paper)")
    train.add_argument("--pos-embed", action="store_true", help="learned positional embeddings (beyond the paper)")
    train.add_argument("--scale-scores", action="store_true", help="divide scores by sqrt(d_head) (beyond the paper)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    _add_common_output(train)

    reproduce = toy_commands.add_parser(
        "reproduce", help="train and evaluate the paper's six models; write summary.json/.md and heatmaps",
        epilog=TOY_REPRODUCE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reproduce.add_argument("--out", required=True, help="output directory (re-running resumes it)")
    reproduce.add_argument("--seeds", type=int, default=None, help="seeds per model (default 3; --quick: 1)")
    reproduce.add_argument("--quick", action="store_true", help="reduced preset: one seed, at most 8,000 steps")
    reproduce.add_argument("--max-steps", type=int, default=None, help="step cap per model (default 50,000)")
    reproduce.add_argument("--sequences", type=int, default=1000, help="test sequences for heatmaps and tables")
    reproduce.add_argument("--workers", type=int, default=2, help="parallel training processes (default 2)")
    reproduce.add_argument("--overwrite", action="store_true", help="replace an existing, different --out")
    _add_common_output(reproduce)

    probe = toy_commands.add_parser(
        "probe", help="sink probes and the default-state test on a trained toy run",
        epilog=TOY_PROBE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by toy train/reproduce")
    probe.add_argument("--out", default=None, help="output directory (default RUN_DIR/probe)")
    probe.add_argument("--sequences", type=int, default=1000, help="test sequences (default 1000)")
    probe.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    _add_common_output(probe)

    tradeoff = toy_commands.add_parser(
        "tradeoff", help="Theorem 1 made visible: off-trigger BOS mass vs default-position error",
        epilog=TOY_TRADEOFF_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tradeoff.add_argument("--out", required=True, help="directory for tradeoff.json and tradeoff.png")
    tradeoff.add_argument("--run", action="append", default=[],
                          help="a trained single-layer run directory to add (repeatable)")
    _add_common_output(tradeoff)
    return parser


def _toy_train(args: argparse.Namespace) -> dict:
    from toy.model import ToyModelConfig
    from toy.run_dir import RunConfig, TrainConfig
    from toy.task import TaskConfig
    from toy.train import train

    residual = {"auto": None, "yes": True, "no": False}[args.residual]
    config = RunConfig(
        model=ToyModelConfig(
            n_layers=args.layers, n_heads=args.heads, d_model=args.d_model, seq_len=args.seq_len,
            attention=args.attention, residual=residual, layer_norm=args.layer_norm, mlp=args.mlp,
            positional_embedding=args.pos_embed, scale_scores=args.scale_scores,
        ),
        task=TaskConfig(d_model=args.d_model, seq_len=args.seq_len,
                        eval_trigger_position=min(7, args.seq_len - 1)),
        train=TrainConfig(seed=args.seed, lr=args.lr, max_steps=args.max_steps),
    )
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise FileExistsError(f"{out} already exists; pass --resume to continue it or choose another --out")
    result = train(config, out, resume=True, progress=not args.no_progress)
    if not args.json:
        print(f"{result.status} after {result.steps} steps ({result.wall_seconds:.1f} s), "
              f"batch L-inf error {result.linf_error:.2e}; run directory: {out}")
    return result.to_dict()


def _toy_reproduce(args: argparse.Namespace) -> dict:
    from toy.reproduce import ReproduceConfig, reproduce

    overrides = {"n_sequences": args.sequences, "workers": args.workers}
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    config = ReproduceConfig.quick(**overrides) if args.quick else ReproduceConfig(**overrides)
    summary = reproduce(config, args.out, overwrite=args.overwrite, progress=not args.no_progress)
    if not args.json:
        from toy.reproduce import markdown_table, overview_rows

        print(markdown_table(
            ["model", "converged", "steps", "seconds", "batch L-inf", "held-out L-inf", "held-out MSE", "sink heads", "paper"],
            overview_rows(summary.models),
        ))
        failed = [c for c in summary.checks if not c.passed]
        print(f"{len(summary.checks) - len(failed)} of {len(summary.checks)} checks against the paper pass"
              + (": failing: " + "; ".join(c.claim for c in failed) if failed else ""))
        print(f"wrote {Path(args.out) / 'summary.md'} and {Path(args.out) / 'summary.json'}")
    return summary.to_dict()


def _toy_probe(args: argparse.Namespace) -> dict:
    from toy.probe_run import probe_run

    report = probe_run(args.run_dir, args.out, args.sequences, overwrite=args.overwrite)
    if not args.json:
        state = report.default_state
        print(f"sink heads: {len(report.probe.sink_heads())} of {len(report.probe.heads)}; "
              f"layer outputs: norm of sum {report.probe.attn_out_norm_of_sum:.3g} vs sum of norms "
              f"{report.probe.attn_out_sum_of_norms:.3g}")
        if state.default_error_before is not None:
            print(f"default-state test: default-position MSE {state.default_error_before:.2e} -> "
                  f"{state.default_error_after_remove:.2e} with the sinks removed, "
                  f"{state.default_error_after_control:.2e} with the matched control")
        else:
            print(f"default-state test: {state.note}")
        print(f"wrote {', '.join(report.files)} in {report.out_dir}")
    return report.to_dict()


def _toy_tradeoff(args: argparse.Namespace) -> dict:
    from toy.tradeoff import write_tradeoff

    report = write_tradeoff(args.out, args.run)
    if not args.json:
        print(f"wrote {Path(args.out) / 'tradeoff.png'} and {Path(args.out) / 'tradeoff.json'}")
    return report


HANDLERS = {
    ("toy", "train"): _toy_train,
    ("toy", "reproduce"): _toy_reproduce,
    ("toy", "probe"): _toy_probe,
    ("toy", "tradeoff"): _toy_tradeoff,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = HANDLERS[(args.command, getattr(args, f"{args.command}_command", None))]
    from toy.train import TrainingDiverged

    try:
        result = handler(args)
    except TrainingDiverged as error:
        print(f"sinkscope: run failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"sinkscope: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("sinkscope: interrupted; re-run the same command to resume", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result, indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
