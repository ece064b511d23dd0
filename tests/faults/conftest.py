"""The inputs every fault-injection test reads, built once per session."""

from __future__ import annotations

import pytest
from fault_cases import Inputs

from circuit_models import build_position_sink_gpt2
from sinkscope.cli import main
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="session")
def inputs(tmp_path_factory) -> Inputs:
    root = tmp_path_factory.mktemp("inputs")
    prompts, book = root / "prompts.txt", root / "book.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    book.write_text(" ".join(TINY_GPT2_PROMPTS * 40) + "\n", encoding="utf-8")
    model = build_tiny_gpt2(root / "tiny-gpt2")
    run, probe = root / "run", root / "probe"
    assert (
        main(["toy", "train", "--out", str(run), "--max-steps", "40", "--checkpoint-every", "10", "--no-progress"]) == 0
    )
    assert main(["toy", "probe", str(run), "--sequences", "8", "--out", str(probe), "--no-progress"]) == 0
    audits = (root / "audit-a", root / "audit-b")
    for seed, audit in enumerate(audits):
        argv = ["audit", str(model), "--prompts", str(prompts), "--max-len", "16", "--examples", "0"]
        assert main([*argv, "--seed", str(seed), "--n-prompts", "3", "--out", str(audit), "--no-progress"]) == 0
    return Inputs(root, model, build_position_sink_gpt2(root / "position-sink"), prompts, book, run, probe, audits)
