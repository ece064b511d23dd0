"""Trimming a run's ``metrics.jsonl`` on resume, one line at a time.

A resume keeps the metrics lines logged before its checkpoint's step and drops the rest
(those steps are trained again). The file is read line by line and only up to that step,
so its size never decides the memory a resume needs; a line longer than any metrics line
(``MAX_LINE_BYTES``: a damaged file, e.g. one filled with NUL bytes) is refused in one line
before anything is changed.
"""

from __future__ import annotations

import json
from pathlib import Path

from sinkscope.infra.errors import InputError
from sinkscope.toy.run_dir import METRICS_FILE

MAX_LINE_BYTES = 1 << 20  # a metrics line holds a few numbers per head: kilobytes, never a megabyte


def metrics_before(run_dir: Path, step: int) -> str:
    """The lines of ``run_dir``'s metrics.jsonl logged before ``step``, as the text to
    write back. A last line that is not JSON was cut by an interruption and is dropped
    (everything before it is intact); one with lines after it is damage, refused before
    anything changes, so no intact line is lost; a line with no step (edited by hand) is
    dropped."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return ""
    kept: list[str] = []
    number = 0
    with open(path, "rb") as handle:
        while line := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise InputError(
                    f"{path} has a line longer than {MAX_LINE_BYTES // (1 << 20)} MB, which no metrics line is (the "
                    "file is damaged); delete it or cut it back to its last complete line (it only holds the logged "
                    "curves; the checkpoints resume without it), then resume",
                    field="run_dir",
                )
            try:
                record = json.loads(line)
            except ValueError:  # not JSON, or not UTF-8: cut short, or blank
                if not line.strip():
                    continue
                if _more_lines(handle):  # damage in the middle: the lines after it are intact and kept
                    raise InputError(
                        f"{path} line {number} is not a metrics line (the file is damaged in the middle); "
                        "delete or repair that line, then resume (nothing was changed)",
                        field="run_dir",
                    ) from None
                break  # the last line, cut short by an interruption
            logged = logged_step(record)
            if logged >= step and logged != float("inf"):
                break  # steps only grow: the rest of the file is trained again
            if logged < step:
                kept.append(json.dumps(record) + "\n")
    return "".join(kept)


def _more_lines(handle) -> bool:
    """Whether anything but blank lines follows in ``handle`` (read to the end)."""
    return any(rest.strip() for rest in iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""))


def logged_step(record: object) -> float:
    """A metrics line's step; a line that has none (edited by hand) sorts after every step,
    so it is dropped with the steps that will be redone rather than stopping the resume."""
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else float("inf")
