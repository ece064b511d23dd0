"""Shared test setup: offline hubs, one CPU thread (the suite shares small machines)."""

from __future__ import annotations

import os
import signal

# A shell starts a background job (`pytest &`, `nohup pytest &`) with SIGINT ignored, and an
# ignored signal stays ignored through fork and exec: every process a test starts would
# ignore the test's Ctrl-C, and Python would give it no KeyboardInterrupt. A handled signal
# is reset to its default at exec, so with Python's own handler here each child starts with
# SIGINT's default, as from a terminal, however the suite was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["HF_HUB_OFFLINE"] = "1"
# processes the tests start (Ray's workers, spawned pool workers) import test modules
# such as ray_units by name, as the test process does
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(_TESTS), _TESTS, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)

from ray_cluster import cluster  # noqa: E402, F401  (the session's Ray cluster fixture)


def pytest_collection_modifyitems(config, items):
    """The suite runs on two xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml).
    Each test file stays on one worker, so that its module fixtures (a dequantised SmolLM2,
    trained toy runs) are built once; the files of tests/execution share one worker, so
    that only one Ray cluster or local Ray instance runs at a time on a two-core machine."""
    import pytest

    for item in items:
        group = "execution" if "execution" in item.path.parts else str(item.path)
        item.add_marker(pytest.mark.xdist_group(group))
