"""Shared test setup: offline hubs, one CPU thread (the suite shares small machines)."""

from __future__ import annotations

import os

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
