"""`sinkscope circuit`: the sink-circuit battery on one model, a pretrained LM or a trained
toy run: which part builds the sink (query bias, position embedding, a write into the
anchor, key dimensions, the anchor's token), each edit beside its matched control."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import (
    NON_NEGATIVE,
    POSITIVE,
    add_common_output,
    device_name,
    fraction,
    out_path,
    say,
    within,
)
from sinkscope.cli.inputs import INPUTS_NAME, CommandPaths, existing_files, model_paths
from sinkscope.infra.bounds import K_DIMS, SAMPLES, SEED, TOKENS, Bound
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope circuit gpt2 --out sinkscope-out/circuit/gpt2
  sinkscope circuit ./SmolLM2-135M-Instruct.Q4_1.gguf --n-prompts 32 --out sinkscope-out/circuit/smollm2
  sinkscope circuit sinkscope-out/toy-quick/softmax-1x1-seed0 --out sinkscope-out/circuit/toy

The sink heads are the heads whose anchor mass over the prompts is >= 1 - --sink-eps (a toy run:
at default positions). Each edit's readout is the share of their baseline anchor mass it leaves and
the change in next-token loss (a toy run: the error at default positions), with 95% paired bootstrap
intervals over the inputs. Edits a model has no part for (no query bias, rotary positions) are listed
as not applicable. Writes circuit.json, report.html, report.md and report_figures/circuit_share_left.png.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    from sinkscope.pretrained_analysis.prompts import DEFAULT_MAX_LEN, DEFAULT_N_PROMPTS, PromptSpec

    command = commands.add_parser(
        "circuit",
        help="the sink-circuit battery: which part builds the sink, each edit beside its control",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument(
        "model", metavar="MODEL", help="short name, Hugging Face id, local directory, GGUF file or toy run"
    )
    command.add_argument(
        "--prompts", dest="source", metavar="SOURCE", default="default", help="prompt source, as the audit's"
    )
    command.add_argument(
        "--n-prompts",
        type=within(PromptSpec.BOUNDS["n_prompts"]),
        default=DEFAULT_N_PROMPTS,
        help=f"prompts (default {DEFAULT_N_PROMPTS})",
    )
    command.add_argument(
        "--max-len",
        type=within(Bound(3, TOKENS.high)),
        default=DEFAULT_MAX_LEN,
        help=f"most tokens per prompt (default {DEFAULT_MAX_LEN})",
    )
    command.add_argument(
        "--sequences", type=within(SAMPLES), default=1000, help="a toy run's figure-set sequences (default 1000)"
    )
    command.add_argument(
        "--sink-eps", type=fraction, default=0.1, help="sink head: anchor mass >= 1 - eps (default 0.1)"
    )
    command.add_argument(
        "--write-layer", type=NON_NEGATIVE, default=0, help="layer whose writes into the anchor are zeroed (default 0)"
    )
    command.add_argument(
        "--k-dims", type=within(K_DIMS), default=3, help="key input dimensions zeroed per sink layer (default 3)"
    )
    command.add_argument(
        "--position",
        type=POSITIVE,
        default=None,
        help="the later position of the position edits (default: half the shortest input)",
    )
    command.add_argument(
        "--transplant-layers",
        type=POSITIVE,
        default=None,
        help="the first layers in which the transplant makes --position attend only to itself (default 2)",
    )
    command.add_argument(
        "--seed", type=within(SEED), default=0, help="seed of the prompts' subset, the controls and the bootstrap"
    )
    command.add_argument("--batch-size", type=POSITIVE, default=8, help="prompts per forward pass (default 8)")
    command.add_argument("--device", type=device_name, default=None, help="cpu, cuda, cuda:N, mps or auto")
    command.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), default="float32", help="weights' dtype"
    )
    _add_output_flags(command)


def _add_output_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument("--out", type=out_path, dest="out_dir", default=None, help="output directory")
    command.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    command.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="a toy run: take an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    add_common_output(command)


def _refuse_pretrained_flags(args: argparse.Namespace) -> None:
    """A toy run's sequences come from its task and its sink heads from its probe: the
    flags that choose a pretrained model's prompts and sink rule do not apply to it."""
    from sinkscope.infra.errors import InputError
    from sinkscope.pretrained_analysis.prompts import DEFAULT_MAX_LEN, DEFAULT_N_PROMPTS

    defaults = {"source": "default", "n_prompts": DEFAULT_N_PROMPTS, "max_len": DEFAULT_MAX_LEN, "sink_eps": 0.1}
    flags = {"source": "--prompts", "n_prompts": "--n-prompts", "max_len": "--max-len", "sink_eps": "--sink-eps"}
    for dest, default in defaults.items():
        if getattr(args, dest) != default:
            raise InputError(
                f"{flags[dest]} applies to pretrained models; drop it for a toy run (its task and probe decide)"
            )


def _is_toy_run(model: str) -> bool:
    from sinkscope.toy.run_dir import CONFIG_FILE

    return (
        Path(model).is_dir() and (Path(model) / CONFIG_FILE).is_file() and not (Path(model) / "tokenizer.json").exists()
    )


def _battery(args: argparse.Namespace):
    from sinkscope.probes.circuit_result import CircuitConfig

    config = CircuitConfig(
        write_layer=args.write_layer,
        k_dims=args.k_dims,
        position=args.position,
        transplant_layers=args.transplant_layers,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    if _is_toy_run(args.model):
        from sinkscope.toy.circuit_run import toy_circuit

        _refuse_pretrained_flags(args)

        return toy_circuit(args.model, args.sequences, config, allow_unfinished=args.allow_unfinished)
    from sinkscope.pretrained_analysis.circuit import circuit
    from sinkscope.pretrained_analysis.loading import LoadSpec
    from sinkscope.pretrained_analysis.prompts import PromptSpec

    prompts = PromptSpec(source=args.source, max_len=args.max_len, n_prompts=args.n_prompts, seed=args.seed)
    spec = LoadSpec(args.model, device=args.device, dtype=args.dtype)
    return circuit(spec, prompts, config, sink_eps=args.sink_eps, progress=not args.no_progress)


def paths(args: argparse.Namespace) -> CommandPaths:
    """A toy run or a model (or the hub's cache), and a prompt file; the default output is
    checked when the command places it."""
    return CommandPaths(
        Path(args.out_dir) if args.out_dir else None, (*model_paths([args.model]), *existing_files(args.source))
    )


def run(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
    from sinkscope.infra.codec import write_result
    from sinkscope.probes.circuit_report import RESULT_FILE, circuit_document, circuit_findings
    from sinkscope.reports.write import write_report

    out = Path(args.out_dir or Path("sinkscope-out") / "circuit" / Path(args.model).name)
    inputs = paths(args).reads
    with claim_output_directory(out, args.overwrite, inputs, INPUTS_NAME):
        result = _battery(args)
        with atomic_directory(out, replace=args.overwrite) as tmp:
            write_result(tmp / RESULT_FILE, result)
    write_report(lambda figure_dir: circuit_document(result, figure_dir), out, overwrite=True)
    if not args.json:
        for line in circuit_findings(result):
            say(line)
        say(f"wrote {out / RESULT_FILE}, {out / 'report.html'} and {out / 'report.md'}")
    return {"out": str(out), "circuit": encode(result)}
