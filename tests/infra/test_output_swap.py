"""The --overwrite swap survives a kill at any moment (issue 22, item 3): a real process is
SIGKILLed between the swap's steps, and the next command on that output restores the old
result and removes the dead writer's leftovers, and only those. Also: a symlinked output
is followed, and a legal long name is never made illegal by the staging names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sinkscope.infra import swap
from sinkscope.infra.atomic_io import atomic_directory, check_output_directory
from sinkscope.infra.swap import begin_staging, exchange, recover_swaps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from test_faults import one_line_exit_2, snapshot  # noqa: E402

# The writer runs in its own process and SIGKILLs itself at the named moment (monkeypatched
# there, so no test hook lives in sinkscope): "renamed-old" is between the two renames of the
# fallback swap (nothing at OUT), "exchanged" is after renameat2 but before the cleanup.
WRITER = """
import os, signal, sys
from pathlib import Path
from sinkscope.infra import swap
from sinkscope.infra.atomic_io import atomic_directory

out, moment = Path(sys.argv[1]), sys.argv[2]
real_rename, real_exchange = os.rename, swap.exchange

def rename(source, target):
    real_rename(source, target)
    if str(target).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)

def exchange(first, second):
    done = real_exchange(first, second)
    os.kill(os.getpid(), signal.SIGKILL)
    return done

if moment == "renamed-old":
    swap.exchange = lambda first, second: False  # as on a filesystem without RENAME_EXCHANGE
    os.rename = rename
else:
    swap.exchange = exchange
with atomic_directory(out, replace=True) as tmp:
    (tmp / "result.txt").write_text("new")
"""


def write(out: Path, text: str) -> None:
    with atomic_directory(out, replace=True) as tmp:
        (tmp / "result.txt").write_text(text)


def killed_writer(out: Path, moment: str) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITER), str(out), moment], timeout=120)
    assert done.returncode == -signal.SIGKILL


def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "from-a").write_text("a")
    if not exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this OS or filesystem has no RENAME_EXCHANGE (the two-step swap is tested below)")
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-a"] and not any((tmp_path / "a").iterdir())


def test_a_kill_between_the_two_renames_is_restored_by_the_next_command(tmp_path, capsys):
    out = tmp_path / "out"
    write(out, "old")
    before = snapshot(out)
    killed_writer(out, "renamed-old")
    assert not out.exists()  # the moment the issue describes: nothing at OUT, the old result aside
    assert any(p.name.endswith(".old") for p in tmp_path.iterdir())
    # the next command on that output, even one that is then refused, restores it first
    one_line_exit_2(capsys, ["toy", "tradeoff", "--out", str(out)], "exists and is not empty")
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # journal, trash and build all gone


def test_a_kill_after_the_exchange_leaves_the_new_result_and_the_next_command_cleans(tmp_path):
    out = tmp_path / "out"
    write(out, "old")
    if not exchange(out, out):  # probe: the same path twice is a no-op exchange where supported
        pytest.skip("no RENAME_EXCHANGE here")
    killed_writer(out, "exchanged")
    assert (out / "result.txt").read_text() == "new"
    assert len(list(tmp_path.iterdir())) == 3  # out, the dead writer's journal and its build (holding old)
    check_output_directory(out)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "result.txt").read_text() == "new"


def test_a_live_writers_leftovers_and_lookalike_siblings_are_left_alone(tmp_path):
    out = tmp_path / "out"
    write(out, "old")
    for name in (".out.abcd1234.old", ".out.abcd1234.xyz.tmp", ".out.abcd1234.swap"):  # not ours: no valid journal
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("k")
    staging, build = begin_staging(out)  # a writer that is alive (this process) in the middle of its swap
    os.rename(out, staging.old)
    recover_swaps(out)
    assert not out.exists() and staging.old.is_dir() and build.is_dir() and staging.journal.is_file()
    os.rename(staging.old, out)
    staging.remove_leftovers()
    write(out, "new")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".out.abcd1234.old", ".out.abcd1234.swap", ".out.abcd1234.xyz.tmp", "out"]


def test_a_journal_of_a_dead_process_with_a_reused_pid_counts_as_dead(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write(out, "old")
    staging, build = begin_staging(out)
    os.rename(out, staging.old)
    monkeypatch.setattr(swap, "_start_time", lambda pid: "another process's start")
    recover_swaps(out)
    assert (out / "result.txt").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_two_step_swap_puts_the_old_result_back_when_the_second_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write(out, "old")
    monkeypatch.setattr(swap, "exchange", lambda first, second: False)
    real_rename = os.rename

    def failing(source, target):
        if str(source).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError):
        write(out, "new")
    assert (out / "result.txt").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_symlinked_out_gets_the_result_in_its_target_and_the_link_stays(tmp_path):
    target = tmp_path / "scratch" / "results"
    target.mkdir(parents=True)
    link = tmp_path / "out"
    link.symlink_to(target)
    write(link, "old")
    write(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "result.txt").read_text() == "new"
    assert [p.name for p in (tmp_path / "scratch").iterdir()] == ["results"]


def test_a_legal_long_out_name_is_written_and_replaced(tmp_path):
    out = tmp_path / ("é" * 127)  # 254 bytes: legal, and far too long for ".NAME.XXXXXXXX.tmp" before
    write(out, "old")
    write(out, "new")
    assert (out / "result.txt").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_a_legal_long_out_name_is_accepted_by_a_command(tmp_path, capsys):
    """Refused before: "cannot write in DIR (File name too long)"; now the command gets as
    far as its own refusal of a non-empty output."""
    out = tmp_path / ("x" * 255)
    write(out, "old")
    one_line_exit_2(capsys, ["toy", "tradeoff", "--out", str(out)], "exists and is not empty")
