"""`sinkscope window-test`: the streaming window test of a causal LM on a long text.

A command of its own rather than an audit flag: it reads one long text (not the audit's
prompts), has its own knobs (W, S, chunk length) and its own output, and runs every
setting over the whole text, which would multiply an audit's cost."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import (
    POSITIVE,
    add_common_output,
    device_name,
    int_list,
    out_path,
    say,
    within,
)
from sinkscope.cli.inputs import INPUTS_NAME, CommandPaths, existing_files, model_paths
from sinkscope.infra.bounds import SEED, TOKENS, Bound
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError

EXAMPLES = """examples:
  sinkscope window-test gpt2 --out sinkscope-out/window/gpt2
  sinkscope window-test ./SmolLM2-135M-Instruct.Q4_1.gguf --windows 32,256 --sinks 1,4 --out out/window-smollm2
  sinkscope window-test pythia-160m --text book.txt --chunk-tokens 2048 --windows 64,512 --sinks 4 --out out/w

Each query may attend to (a) every earlier key, (b) only the last W keys, (c) the first S tokens
plus the last W keys, (d) S random earlier tokens plus the last W keys (the control, --seed).
Masks keep every token's original position; StreamingLLM's rolling cache instead re-indexes the
kept keys to consecutive positions. The text (default: chapters 1-4 of Pride and Prejudice,
packaged, public domain) is cut into chunks of --chunk-tokens; intervals are over the chunks.
Writes window_test.json, report.html, report.md and report_figures/window_test_loss.png.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser(
        "window-test",
        help="the streaming window test: next-token loss with only the last W keys, plus the first or random S",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("model", metavar="MODEL", help="short name, Hugging Face id, local directory or GGUF file")
    command.add_argument("--text", metavar="FILE", default=None, help="a UTF-8 text file (default: the packaged text)")
    command.add_argument("--windows", type=int_list, default=(32, 256), help="W values, e.g. 32,256 (default 32,256)")
    command.add_argument("--sinks", type=int_list, default=(1, 4), help="S values, e.g. 1,4 (default 1,4)")
    command.add_argument(
        "--chunk-tokens",
        type=within(Bound(64, TOKENS.high)),
        default=1024,
        help="tokens per chunk, BOS included (default 1024)",
    )
    command.add_argument("--max-chunks", type=POSITIVE, default=None, help="use at most this many chunks")
    command.add_argument("--seed", type=within(SEED), default=0, help="the random control's and bootstrap's seed")
    command.add_argument("--device", type=device_name, default=None, help="cpu, cuda, cuda:N, mps or auto")
    command.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default="float32",
        help="weights' dtype (default float32)",
    )
    command.add_argument("--out", type=out_path, dest="out_dir", default=None, help="output directory")
    command.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_common_output(command)


def _text(path: str | None) -> str | None:
    if path is None:
        return None
    if Path(path).exists() and not Path(path).is_file():  # a pipe or device is read forever, or never
        raise InputError(f"--text {path} is not a regular file; pass a text file", field="text")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read --text {path}: {error}; pass a UTF-8 text file", field="text") from error
    if "\x00" in text:  # valid UTF-8, yet binary: audit's prompt files refuse it the same way
        raise InputError(
            f"--text {path} holds NUL bytes, so it is binary, not text; pass a UTF-8 text file", field="text"
        )
    if not text.strip():
        raise InputError(f"--text {path} holds no text; pass a long text file, or drop --text for the packaged one")
    return text


def paths(args: argparse.Namespace) -> CommandPaths:
    """The model (or the hub's cache) and the text; the default output is checked when the
    command places it."""
    return CommandPaths(
        Path(args.out_dir) if args.out_dir else None, (*model_paths([args.model]), *existing_files(args.text))
    )


def run(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
    from sinkscope.infra.codec import write_result
    from sinkscope.pretrained_analysis.loading import LoadSpec
    from sinkscope.pretrained_analysis.window_test import window_test
    from sinkscope.probes.window_report import RESULT_FILE, window_document, window_finding
    from sinkscope.reports.write import write_report

    text = _text(args.text)
    spec = LoadSpec(args.model, device=args.device, dtype=args.dtype)
    out = Path(args.out_dir or Path("sinkscope-out") / "window-test" / Path(args.model).name)
    with claim_output_directory(out, args.overwrite, paths(args).reads, INPUTS_NAME):
        result = window_test(
            spec,
            text,
            args.windows,
            args.sinks,
            args.chunk_tokens,
            args.max_chunks,
            args.seed,
            progress=not args.no_progress,
            source=None if args.text is None else Path(args.text).name,
        )
        # a whole new directory: --overwrite of another result's directory leaves none of it behind
        with atomic_directory(out, replace=args.overwrite) as tmp:
            write_result(tmp / RESULT_FILE, result)
    # the report takes the directory's lock itself, so it runs once the claim is released
    write_report(lambda figure_dir: window_document(result, figure_dir), out, overwrite=True)
    if not args.json:
        say(window_finding(result))
        say(f"wrote {out / RESULT_FILE}, {out / 'report.html'} and {out / 'report.md'}")
    return {"out": str(out), "window_test": encode(result)}
