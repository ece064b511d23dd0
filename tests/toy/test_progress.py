"""Training progress a person can read: one line per running model, an honest estimate,
and a log that stays small when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import time

from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.progress import LOG_INTERVAL_S, ExperimentProgress, RunLine, duration_text
from sinkscope.toy.run_dir import METRICS_FILE, RESULT_FILE, RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig


def _config(max_steps: int) -> RunConfig:
    return RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=max_steps))


def test_a_line_says_step_error_threshold_speed_and_the_error_trends_estimate():
    line = RunLine("softmax-4x4-seed0", 12_400, 50_000, 0.0123, 5e-3, 61.0, 3_050).text()
    assert line == (
        "softmax-4x4-seed0: step 12,400/50,000, L-inf 1.2e-02 (stops below 0.005), 61 steps/s, "
        "about 50s more by the error's trend"
    )
    assert "no estimate yet" in RunLine("x", 500, 50_000, 0.9, 5e-3, 61.0, None).text()
    assert "at most" not in RunLine("x", 500, 50_000, 0.9, 5e-3, 61.0, None).text()
    assert "steps/s" not in RunLine("x", 0, 100, None, 5e-3, None).text()
    assert [duration_text(s) for s in (5, 65, 7325)] == ["5s", "1m05s", "2h02m"]


def test_snapshot_reads_running_and_finished_models_from_their_run_directories(tmp_path):
    import os

    jobs = [("done", _config(100)), ("running", _config(1000)), ("waiting", _config(1000)), ("stale", _config(1000))]
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / METRICS_FILE).write_text(json.dumps({"step": 700, "linf_error": 0.1}) + "\n")
    os.utime(tmp_path / "stale" / METRICS_FILE, (1_000_000, 1_000_000))  # an interrupted run from long ago
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / RESULT_FILE).write_text("{}")
    (tmp_path / "running").mkdir()
    metrics = tmp_path / "running" / METRICS_FILE
    metrics.write_text(json.dumps({"step": 100, "linf_error": 0.5}) + "\n")
    progress = ExperimentProgress(tmp_path, jobs, stream=io.StringIO())
    finished, lines = progress.snapshot()
    assert finished == 1 and [line.name for line in lines] == ["running"]
    assert lines[0].step == 100 and lines[0].steps_per_s is None
    with metrics.open("a") as handle:
        handle.write(json.dumps({"step": 300, "linf_error": 0.25}) + "\n")
    _, lines = progress.snapshot()
    assert lines[0].step == 300 and lines[0].linf_error == 0.25 and lines[0].steps_per_s > 0


def test_a_logged_reproduction_writes_a_few_lines_not_redraws(tmp_path):
    """The --quick reproduction cut to 300 steps a model, progress on, stderr a file: a
    block every LOG_INTERVAL_S seconds and the final count, no carriage-return redraws."""
    import subprocess
    import sys

    log = tmp_path / "stderr.log"
    started = time.monotonic()
    with log.open("w") as stderr:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sinkscope.cli",
                "toy",
                "reproduce",
                "--quick",
                "--max-steps",
                "300",
                "--sequences",
                "16",
                "--workers",
                "2",
                "--out",
                str(tmp_path / "out"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    elapsed = time.monotonic() - started
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text, text
    # a block at the start, one every LOG_INTERVAL_S (a line at least that often, never a redraw) and the last
    blocks = [line for line in text.splitlines() if line.startswith("models: ")]
    assert 2 <= len(blocks) <= elapsed / LOG_INTERVAL_S + 2, (len(blocks), elapsed, text)
    *_, final_count, closing = text.strip().splitlines()
    assert final_count.startswith("models: 6/6 finished"), text
    assert closing.startswith("every model trained and evaluated; measuring Theorem 1's trade-off"), text


def test_a_log_gets_a_block_every_interval_and_a_line_as_each_model_finishes(tmp_path):
    from sinkscope.toy.run_dir import TrainResult, write_train_result

    jobs = [("first", _config(1000)), ("second", _config(1000))]
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / METRICS_FILE).write_text(json.dumps({"step": 100, "linf_error": 0.5}) + "\n")
    log = io.StringIO()  # not a terminal
    progress = ExperimentProgress(tmp_path, jobs, stream=log)
    progress._draw()
    assert log.getvalue().startswith("models: 0/2 finished") and log.getvalue().count("\n") == 3
    progress._draw()  # within LOG_INTERVAL_S of the block, nothing finished: nothing written
    assert log.getvalue().count("\n") == 3
    write_train_result(
        tmp_path / "first", TrainResult(str(tmp_path / "first"), "converged", True, 808, 2.0, 1e-3, 1e-6)
    )
    progress._draw()
    assert log.getvalue().splitlines()[3:] == ["first: converged after 808 steps"]
    progress._draw(final=True)  # the last count, always; a finish is said once
    assert log.getvalue().splitlines()[4].startswith("models: 1/2 finished") and log.getvalue().count("\n") == 5
