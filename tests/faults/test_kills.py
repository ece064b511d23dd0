"""SIGKILL at seeded random moments, then the same command again: whatever existed before
(inputs, an older result) is unchanged or the previous result is whole; after the rerun the
result reads back whole and no staging directory, journal or temporary is left."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_cases import CASES, LEFT_OUT, SEED, Case, Inputs

from fault_checks import cli_command, cli_env, leftovers, run_cli, snapshot
from sinkscope.cli.commands import COMMANDS

pytestmark = pytest.mark.slow


def test_every_writing_command_has_a_case():
    assert {case.name for case in CASES} | LEFT_OUT == {command.name for command in COMMANDS}


def killed(argv: list[str], parent: Path, delay: float, at_journal: bool) -> int:
    """Start ``sinkscope ARGV`` and SIGKILL it after ``delay`` seconds or, with
    ``at_journal``, ``delay`` seconds after a swap journal appears in ``parent`` (between
    the staging and the renames). Its exit status (0 where it finished first)."""
    process = subprocess.Popen(cli_command(argv), env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.monotonic()
    while process.poll() is None and time.monotonic() - start < 300:
        if at_journal and any(parent.glob(".*.swap")):
            start, at_journal = time.monotonic(), False
        if not at_journal and time.monotonic() - start >= delay:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    return process.wait(timeout=60)


def moments(case: Case, rng: random.Random) -> list[tuple[float, bool]]:
    """(delay, at_journal) of each kill: one at start-up, one mid-run, one between the
    renames of the swap (cheap commands); heavy ones: two mid-run."""
    if case.heavy:
        return [(rng.uniform(4.0, 12.0), False), (rng.uniform(4.0, 20.0), False)]
    return [(rng.uniform(0.0, 0.5), False), (rng.uniform(2.0, 6.0), False), (rng.uniform(0.0, 0.02), True)]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_kill_at_any_moment_loses_nothing_and_the_rerun_is_whole(case: Case, inputs: Inputs, tmp_path):
    rng = random.Random(f"{SEED}-{case.name}")
    parent = tmp_path / "results"
    parent.mkdir()
    out = parent / "out"
    (parent / "keep.txt").write_text("the user's", encoding="utf-8")
    given = snapshot(inputs.root)
    if not case.heavy:  # an older result in --out, to be kept or replaced whole
        done = run_cli(case.argv(inputs, out))
        assert done.returncode == 0, done.stderr
    before = snapshot(out) if out.exists() else None
    for delay, at_journal in moments(case, rng):
        where = f"seed {SEED}, {case.name}, kill after {delay:.4f}s{' from the journal' if at_journal else ''}"
        code = killed([*case.argv(inputs, out), *case.again], parent, delay, at_journal)
        assert code in (0, -signal.SIGKILL), where
        assert snapshot(inputs.root) == given, where
        assert (parent / "keep.txt").read_text(encoding="utf-8") == "the user's", where
        if before is not None and snapshot(out) != before:
            case.whole(out)  # replaced: then whole, by the new result
            before = snapshot(out)
    where = f"seed {SEED}, {case.name}, the rerun"
    done = run_cli([*case.argv(inputs, out), *(case.again if out.exists() else ())])
    assert done.returncode == 0, f"{where}: {done.stderr}"
    case.whole(out)
    assert leftovers(parent) == [], where
    assert sorted(path.name for path in parent.iterdir()) == ["keep.txt", "out"], where
    assert snapshot(inputs.root) == given, where
