"""Tests run the same in the foreground and the background: a process a test starts takes
the test's Ctrl-C (SIGINT) even when the suite was started as a background job, which a
shell starts with SIGINT ignored (``tests/conftest.py`` gives its children the default)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_reaches_a_process_the_test_started():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=10)
    finally:
        child.kill()  # an ignored Ctrl-C leaves it sleeping
    assert child.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, (child.returncode, err)


def test_ctrl_c_reaches_a_process_the_test_started_when_the_suite_runs_in_the_background():
    """The test above in a suite started as ``pytest &`` does it: SIGINT ignored."""

    def as_a_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    test = f"{Path(__file__).relative_to(ROOT)}::test_ctrl_c_reaches_a_process_the_test_started"
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        preexec_fn=as_a_background_job,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
