"""The writing commands of the registry as the fault-injection suite runs them: each with
tiny settings (a run takes seconds), the flag a second run over its result needs, and how
its result is read back whole through the library's own readers."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEED = 20261206  # the random moments (kills, free space) of the whole suite; printed in every assertion


@dataclass(frozen=True)
class Inputs:
    """What the commands read, all under ``root``: tiny models, texts, a finished toy run,
    its probe and two audits."""

    root: Path
    model: Path
    circuit_model: Path
    prompts: Path
    book: Path
    run: Path
    probe: Path
    audits: tuple[Path, Path]


def run_is_whole(out: Path) -> None:
    from sinkscope.toy.run_dir import load_model, read_train_result, unfinished_reason

    assert unfinished_reason(out) is None, unfinished_reason(out)
    read_train_result(out)
    load_model(out)


def result_is_whole(out: Path) -> None:
    """The result's report is built: every file the report reads goes through its reader."""
    from sinkscope.reporting import detect_kind

    with tempfile.TemporaryDirectory() as figures:
        detect_kind(out).build(out, Path(figures))


def audit_is_whole(out: Path) -> None:
    import sinkscope

    sinkscope.read_audit(out)
    result_is_whole(out)


def comparison_is_whole(out: Path) -> None:
    import sinkscope

    sinkscope.read_comparison(out)
    result_is_whole(out)


def report_is_whole(out: Path) -> None:
    assert (out / "report.html").read_text(encoding="utf-8").rstrip().endswith("</html>")
    assert (out / "report.md").read_text(encoding="utf-8").strip()


@dataclass(frozen=True)
class Case:
    """argv: the command line for ``--out OUT`` (no --overwrite/--resume); again: the flags
    of a run over an existing result; heavy: whether a run takes tens of seconds (fewer
    kills, no older result made first: the first run is the one killed); size: about the
    bytes its result takes (where the free space is drawn from); in_place: whether it writes
    its result where it stands, step by step (toy train: a stopped run is resumed, not
    replaced), so that a failed write may leave what a resume continues."""

    name: str
    argv: Callable[[Inputs, Path], list[str]]
    again: tuple[str, ...]
    whole: Callable[[Path], None]
    size: int
    heavy: bool = False
    in_place: bool = False


def _trained(*flags: str) -> list[str]:
    return ["--max-steps", "4", "--sequences", "4", "--seeds", "1", "--workers", "1", *flags, "--no-progress"]


QUIET = "--no-progress"
CASES: tuple[Case, ...] = (
    Case(
        "toy train",
        lambda i, out: ["toy", "train", "--out", str(out), "--max-steps", "40", "--checkpoint-every", "10", QUIET],
        ("--resume",),
        run_is_whole,
        62_000,
        in_place=True,
    ),
    Case(
        "toy reproduce",
        lambda i, out: ["toy", "reproduce", "--quick", "--out", str(out), *_trained()],
        (),
        result_is_whole,
        400_000,
        heavy=True,
    ),
    Case(
        "toy mitigations",
        lambda i, out: ["toy", "mitigations", "--kinds", "softmax", "--out", str(out), *_trained()],
        (),
        result_is_whole,
        100_000,
        heavy=True,
    ),
    Case(
        "toy sweep",
        lambda i, out: [
            *("toy", "sweep", "--attention", "softmax", "--seq-len", "8", "--d-model", "8", "--layers", "1"),
            *("--heads", "1", "--out", str(out), *_trained()),
        ],
        (),
        result_is_whole,
        120_000,
        heavy=True,
    ),
    Case(
        "toy probe",
        lambda i, out: ["toy", "probe", str(i.run), "--sequences", "8", "--out", str(out), QUIET],
        ("--overwrite",),
        result_is_whole,
        96_000,
    ),
    Case(
        "toy patch",
        lambda i, out: ["toy", "patch", str(i.run), "--inputs", "8", "--out", str(out), QUIET],
        ("--overwrite",),
        result_is_whole,
        75_000,
    ),
    Case(
        "toy tradeoff",
        lambda i, out: ["toy", "tradeoff", "--run", str(i.run), "--out", str(out), QUIET],
        ("--overwrite",),
        result_is_whole,
        66_000,
    ),
    Case(
        "audit",
        lambda i, out: [
            *("audit", str(i.model), "--prompts", str(i.prompts), "--max-len", "16", "--examples", "0"),
            *("--out", str(out), QUIET),
        ],
        ("--overwrite",),
        audit_is_whole,
        107_000,
    ),
    Case(
        "report",
        lambda i, out: ["report", str(i.probe), "--out", str(out), QUIET],
        ("--overwrite",),
        report_is_whole,
        150_000,
    ),
    Case(
        "compare",
        lambda i, out: ["compare", *map(str, i.audits), "--out", str(out), QUIET],
        ("--overwrite",),
        comparison_is_whole,
        250_000,
    ),
    Case(
        "window-test",
        lambda i, out: [
            *("window-test", str(i.model), "--text", str(i.book), "--chunk-tokens", "64", "--max-chunks", "2"),
            *("--windows", "8,16", "--sinks", "1,2", "--out", str(out), QUIET),
        ],
        ("--overwrite",),
        result_is_whole,
        100_000,
    ),
    Case(
        "circuit",
        lambda i, out: [
            *("circuit", str(i.circuit_model), "--n-prompts", "8", "--max-len", "24"),
            *("--out", str(out), QUIET),
        ],
        ("--overwrite",),
        result_is_whole,
        230_000,
    ),
)
# demo is left out: it runs the commands above (each covered here) on the packaged MiniLM and
# SmolLM2, whose full run takes minutes, beyond this suite's budget.
LEFT_OUT = {"demo"}
