"""Each kind of damaged input handed to the commands that read it: one line on stderr that
names the fix, exit 2, no traceback, nothing written and the damaged input as it was."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_cases import Inputs

from fault_checks import leftovers, run_cli, snapshot

pytestmark = pytest.mark.slow


def truncated_audit(inputs: Inputs, scratch: Path) -> Path:
    audit = Path(shutil.copytree(inputs.audits[0], scratch / "audit"))
    text = (audit / "audit.json").read_bytes()
    (audit / "audit.json").write_bytes(text[: len(text) // 2])
    return audit


def zeroed_run_result(inputs: Inputs, scratch: Path) -> Path:
    run = Path(shutil.copytree(inputs.run, scratch / "run"))
    (run / "result.json").write_bytes(b"\0" * (run / "result.json").stat().st_size)
    return run


def cut_safetensors(inputs: Inputs, scratch: Path) -> Path:
    model = Path(shutil.copytree(inputs.model, scratch / "model"))
    weights = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(weights[: len(weights) * 2 // 3])
    return model


def flipped_gguf(inputs: Inputs, scratch: Path) -> Path:
    """A byte of the block count's value flipped: the metadata promises blocks the tensors lack."""
    from tiny_gguf import build_tiny_gguf

    path = build_tiny_gguf(scratch / "gguf", "llama")
    data = bytearray(path.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key) + 4  # after the key, its uint32 value type: the value's low byte
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def run_without_checkpoints(inputs: Inputs, scratch: Path) -> Path:
    """A run stopped before its end (no result.json) whose checkpoints were then removed."""
    run = Path(shutil.copytree(inputs.run, scratch / "run"))
    shutil.rmtree(run / "checkpoints")
    (run / "result.json").unlink()
    return run


def nul_text(inputs: Inputs, scratch: Path) -> Path:
    path = scratch / "book.txt"
    path.write_bytes(inputs.book.read_bytes()[:200] + b"\0" * 64 + inputs.book.read_bytes()[200:])
    return path


def prompts_directory(inputs: Inputs, scratch: Path) -> Path:
    (scratch / "prompts.txt").mkdir()
    return scratch / "prompts.txt"


def symlink_loop(inputs: Inputs, scratch: Path) -> Path:
    (scratch / "loop").symlink_to(scratch / "loop")
    return scratch / "loop"


AUDIT = ["--max-len", "16", "--examples", "0", "--no-progress"]
# id -> (the damaged input, the command line given it (with --out OUT), the fix its line names)
Damage = Callable[[Inputs, Path], Path]
CASES: dict[str, tuple[Damage, Callable[[Inputs, Path, Path], list[str]], str]] = {
    "truncated-audit-json-compare": (
        truncated_audit,
        lambda i, bad, out: ["compare", str(bad), str(i.audits[1]), "--out", str(out)],
        "regenerate",
    ),
    "truncated-audit-json-report": (truncated_audit, lambda i, bad, out: ["report", str(bad), "--out", str(out)], ""),
    "zeroed-result-json-probe": (
        zeroed_run_result,
        lambda i, bad, out: ["toy", "probe", str(bad), "--sequences", "8", "--out", str(out)],
        "",
    ),
    "safetensors-cut-short-audit": (
        cut_safetensors,
        lambda i, bad, out: ["audit", str(bad), "--prompts", str(i.prompts), *AUDIT, "--out", str(out)],
        "",
    ),
    "gguf-metadata-byte-flipped-audit": (
        flipped_gguf,
        lambda i, bad, out: ["audit", str(bad), "--prompts", str(i.prompts), *AUDIT, "--out", str(out)],
        "",
    ),
    "run-without-checkpoints-resume": (
        run_without_checkpoints,
        lambda i, bad, out: [
            "toy",
            "train",
            "--out",
            str(bad),
            "--max-steps",
            "40",
            "--checkpoint-every",
            "10",
            "--resume",
        ],
        "--overwrite",
    ),
    "nul-text-window-test": (
        nul_text,
        lambda i, bad, out: [
            "window-test",
            str(i.model),
            "--text",
            str(bad),
            "--chunk-tokens",
            "64",
            "--out",
            str(out),
        ],
        "",
    ),
    "nul-prompts-audit": (
        nul_text,
        lambda i, bad, out: ["audit", str(i.model), "--prompts", str(bad), *AUDIT, "--out", str(out)],
        "",
    ),
    "prompts-directory-audit": (
        prompts_directory,
        lambda i, bad, out: ["audit", str(i.model), "--prompts", str(bad), *AUDIT, "--out", str(out)],
        "",
    ),
    "prompts-directory-circuit": (
        prompts_directory,
        lambda i, bad, out: ["circuit", str(i.circuit_model), "--prompts", str(bad), "--out", str(out)],
        "",
    ),
    "symlink-loop-audit-model": (
        symlink_loop,
        lambda i, bad, out: ["audit", str(bad), "--prompts", str(i.prompts), *AUDIT, "--out", str(out)],
        "",
    ),
    "symlink-loop-probe-run": (symlink_loop, lambda i, bad, out: ["toy", "probe", str(bad), "--out", str(out)], ""),
    "symlink-loop-report": (symlink_loop, lambda i, bad, out: ["report", str(bad), "--out", str(out)], ""),
    "symlink-loop-window-text": (
        symlink_loop,
        lambda i, bad, out: ["window-test", str(i.model), "--text", str(bad), "--out", str(out)],
        "",
    ),
}


KNOWN_BUGS: dict[str, str] = {}  # none known; a case named here is expected to fail (strict)


def _marked(name: str):
    if name not in KNOWN_BUGS:
        return name
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name]))


@pytest.mark.parametrize("name", [_marked(name) for name in sorted(CASES)])
def test_a_damaged_input_is_one_line_and_nothing_is_written(name: str, inputs: Inputs, tmp_path):
    damage, argv, fix = CASES[name]
    scratch = tmp_path / "inputs"
    scratch.mkdir()
    bad = damage(inputs, scratch)
    before, given = snapshot(scratch), snapshot(inputs.root)
    out = tmp_path / "out"
    done = run_cli([*argv(inputs, bad, out), "--no-progress"])
    err = done.stderr.strip()
    assert done.returncode == 2, f"{name}: exit {done.returncode}: {err}"
    assert len(err.splitlines()) == 1 and "Traceback" not in err, f"{name}: {err}"
    assert fix in err, f"{name}: {err}"
    assert not out.exists(), name
    assert snapshot(scratch) == before and snapshot(inputs.root) == given, name
    assert leftovers(tmp_path) == [], name
