"""What an audit and its report write into an audit's directory is what their writers
declare (``AUDIT_OUTPUTS``, ``REPORT_OUTPUTS``), and ``sinkscope demo`` reads that
declaration.

The demo refuses to replace an audit directory holding anything an audit and its report
do not write. Its own list of those files once lacked the key-geometry figure, so a second
``sinkscope demo`` refused the directory the first had written (issue 32). This audit runs
every measurement that writes a file of its own (two attention examples, the key geometry,
the ablation, the sink experiments), so each declared name must appear and nothing
undeclared may.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sinkscope.cli import demo, main
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AUDIT_OUTPUTS
from sinkscope.reports.write import REPORT_OUTPUTS
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

N_EXAMPLES = 2


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    """A tiny GPT-2 audited with every file-writing measurement on, then reported."""
    root = tmp_path_factory.mktemp("audit-outputs")
    model = build_tiny_gpt2(root / "tiny-gpt2", bos_sink_head=(1, 0))
    out = root / "audit"
    prompts = [arg for text in TINY_GPT2_PROMPTS for arg in ("--prompt", text)]
    argv = ["audit", str(model), "--max-len", "16", "--examples", str(N_EXAMPLES), "--ablate", "--no-progress"]
    argv += ["--input-types", "prompts,random", "--eps-curve", "0.1,0.5", "--lengths", "4,8", *prompts]
    assert main([*argv, "--out", str(out)]) == 0
    assert main(["report", str(out), "--no-progress"]) == 0
    return out


def test_everything_an_audit_and_its_report_write_is_declared(audited):
    assert (AUDIT_OUTPUTS | REPORT_OUTPUTS).undeclared(audited) == []


def test_every_name_the_declarations_hold_is_written(audited):
    """No stale name either: each fixed name is written, and each numbered name once per example."""
    written = {path.name for path in audited.iterdir()}
    assert set(AUDIT_OUTPUTS.names) | set(REPORT_OUTPUTS.names) <= written
    for numbered in AUDIT_OUTPUTS.numbered:
        assert {numbered.format(index=k) for k in range(N_EXAMPLES)} <= written
        assert numbered.format(index=N_EXAMPLES) not in written


def test_the_demo_replaces_a_directory_an_audit_wrote_and_refuses_one_with_a_users_file(
    audited, tmp_path, monkeypatch, capsys
):
    """``sinkscope demo --steps 2`` over the audit directory a first demo left: accepted.
    The audit itself is stood in for (its argv recorded); the check before it is real."""
    out = tmp_path / "demo-out"
    shutil.copytree(audited, out / "audit-minilm")
    monkeypatch.setattr(demo, "packaged_models", lambda: (Path("/models/minilm"), Path("/models/smollm2")))
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "run_command", lambda argv, options, runner: ran.append(argv) or 0)
    assert main(["demo", "--out", str(out), "--steps", "2,3"]) == 0
    assert [argv[0] for argv in ran] == ["audit", "audit"]

    (out / "audit-minilm" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"audit-minilm holds notes\.txt, which neither an audit nor its report"):
        demo.check_outputs(out, demo.main_job(out, Path("/models/minilm"), Path("/models/smollm2")))
