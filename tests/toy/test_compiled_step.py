"""--compile: auto's choice per device, the one-line fallback to eager when compiling is
impossible (simulated), and the compiled step on CUDA (marked ``cuda``)."""

from __future__ import annotations

import pytest
import torch

import sinkscope.toy.compiled_step as compiled_step
from sinkscope.cli import main
from sinkscope.toy.checkpoint import load_tensors
from sinkscope.toy.compiled_step import compile_wanted
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train_seeds

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _configs(seeds=(0, 1), **settings) -> list[RunConfig]:
    settings = {"max_steps": 120, "stop_linf": 1e-12, "log_every": 50, "checkpoint_every": 100, **settings}
    return [RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(seed=s, **settings)) for s in seeds]


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return load_tensors(run_dir / FINAL_WEIGHTS)


def test_auto_compiles_on_cuda_only():
    assert compile_wanted("auto", torch.device("cuda")) and not compile_wanted("auto", torch.device("cpu"))
    assert compile_wanted("on", torch.device("cpu")) and not compile_wanted("off", torch.device("cuda"))
    with pytest.raises(ValueError, match="compile must be one of auto, on, off"):
        compile_wanted("yes", torch.device("cpu"))


def _eager_reference(tmp_path) -> list[dict[str, torch.Tensor]]:
    dirs = [tmp_path / f"eager{k}" for k in range(2)]
    train_seeds(_configs(), dirs, progress=False, compile="off")
    return [_weights(d) for d in dirs]


def _assert_same(reference, dirs) -> None:
    for expected, run_dir in zip(reference, dirs):
        got = _weights(run_dir)
        assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_no_cpp_compiler_trains_eager_with_one_note_line(tmp_path, monkeypatch, capsys):
    reference = _eager_reference(tmp_path)
    monkeypatch.setattr(compiled_step.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiled_step.torch, "compile", lambda *a, **k: pytest.fail("compiled without a compiler"))
    dirs = [tmp_path / f"on{k}" for k in range(2)]
    capsys.readouterr()
    train_seeds(_configs(), dirs, progress=False, compile="on")
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinkscope:")]
    assert notes == ["sinkscope: training eager: no C++ compiler (c++ not found; install one or set CXX)"]
    _assert_same(reference, dirs)


def test_a_compile_failure_mid_step_reruns_that_step_eager(tmp_path, monkeypatch, capsys):
    """The failing 'compiled' step runs the whole step, then fails (as inductor would on
    its last graph): the state is put back and the step rerun eager, so the numbers are
    eager's exactly."""
    reference = _eager_reference(tmp_path)

    def failing_compile(step, mode=None):
        def compiled(*args):
            step(*args)
            raise RuntimeError("simulated inductor failure\nwith a second line")

        return compiled

    monkeypatch.setattr(compiled_step.torch, "compile", failing_compile)
    dirs = [tmp_path / f"on{k}" for k in range(2)]
    capsys.readouterr()
    train_seeds(_configs(), dirs, progress=False, compile="on")
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinkscope:")]
    assert notes == [
        "sinkscope: compiling the training step (torch.compile) ...",
        "sinkscope: training eager: torch.compile failed (RuntimeError: simulated inductor failure)",
    ]
    _assert_same(reference, dirs)


@pytest.mark.cuda
@needs_cuda
def test_compiled_cuda_step_tracks_eager_and_stops_on_the_device(tmp_path, capsys):
    """Compiled (CUDA graphs) against eager on the GPU: the same data, numbers within
    rounding after 120 steps, and seeds that converge stop where the rule says. The
    compiled run must have compiled: a fallback to eager would match eager trivially."""
    eager = [tmp_path / f"e{k}" for k in range(2)]
    compiled = [tmp_path / f"c{k}" for k in range(2)]
    train_seeds(_configs(), eager, progress=False, device="cuda", compile="off")
    capsys.readouterr()
    train_seeds(_configs(), compiled, progress=False, device="cuda", compile="on")
    assert "training eager" not in capsys.readouterr().err
    for a, b in zip(eager, compiled):
        wa, wb = _weights(a), _weights(b)
        assert max(float((wa[n] - wb[n]).abs().max()) for n in wa) <= 1e-4
    results = train_seeds(
        _configs(max_steps=3000, stop_linf=2e-2),
        [tmp_path / "s0", tmp_path / "s1"],
        progress=False,
        device="cuda",
        compile="on",
    )
    assert all(r.converged and r.linf_error < 2e-2 for r in results)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("seeds", [(0,), (0, 1)])
def test_the_compiled_cuda_step_is_not_skipped_by_cuda_graphs(tmp_path, seeds, capsys):
    """Issue 38: inductor skipped CUDA graphs for the step ("skipping cudagraphs due to
    mutated inputs"), so every step launched its kernels one by one; now it skips none,
    and the step did compile (a fallback to eager skips no CUDA graph either)."""
    from torch._dynamo.utils import counters

    counters["inductor"]["cudagraph_skips"] = 0
    dirs = [tmp_path / f"c{k}" for k in seeds]
    capsys.readouterr()
    train_seeds(_configs(seeds, max_steps=60), dirs, progress=False, device="cuda", compile="on")
    assert "training eager" not in capsys.readouterr().err
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.cuda
@needs_cuda
def test_toy_train_compile_on_cuda_cli(tmp_path):
    out = tmp_path / "run"
    code = main(
        ["toy", "train", "--max-steps", "50", "--device", "cuda", "--compile", "on", "--out", str(out), "--no-progress"]
    )
    assert code == 0 and (out / FINAL_WEIGHTS).is_file()


@pytest.mark.slow
def test_compiled_cpu_step_tracks_eager_within_rounding(tmp_path):
    """torch.compile on the CPU (about a minute to compile here): the same data, weights
    within 1e-4 of eager after 120 steps, and seeds converging within 10% of eager's steps."""
    eager = [tmp_path / f"e{k}" for k in range(2)]
    compiled = [tmp_path / f"c{k}" for k in range(2)]
    train_seeds(_configs(), eager, progress=False, compile="off")
    train_seeds(_configs(), compiled, progress=False, compile="on")
    for a, b in zip(eager, compiled):
        wa, wb = _weights(a), _weights(b)
        assert max(float((wa[n] - wb[n]).abs().max()) for n in wa) <= 1e-4
    settings = {"max_steps": 3000, "stop_linf": 3e-2}
    on = train_seeds(_configs(**settings), [tmp_path / "on0", tmp_path / "on1"], progress=False, compile="on")
    off = train_seeds(_configs(**settings), [tmp_path / "off0", tmp_path / "off1"], progress=False, compile="off")
    for a, b in zip(on, off):
        assert a.converged and b.converged and abs(a.steps - b.steps) <= 0.1 * b.steps


def test_dynamo_s_note_about_adam_s_profiler_range_is_not_shown():
    """Compiling Adam's step logs "Profiler record function ... will be ignored" on that
    logger (torch 2.13); the filter drops that note and nothing else."""
    import logging

    compiled_step.quiet_profiler_notes()
    compiled_step.quiet_profiler_notes()  # once per process, however many runs compile
    logger = logging.getLogger(compiled_step.DYNAMO_CONTEXT_LOGGER)
    assert logger.filters.count(compiled_step._not_the_profiler_note) == 1
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)  # torch's loggers need not propagate to the root
    try:
        logger.warning("Profiler record function %s will be ignored", "<class 'record_function'>")
        logger.warning("a graph break that matters")
    finally:
        logger.removeHandler(handler)
    assert seen == ["a graph break that matters"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["learned_sink", "kv_bias", "softpick", "gated_element", "value_gated"])
def test_the_mitigation_kinds_compile_and_track_eager(tmp_path, kind):
    """Each mitigation kind through the compiled CPU step (two seeds, one vmapped stack):
    weights within 1e-4 of eager after 60 steps. Softpick's ReLU(e^s - 1) has a kink at
    s = 0: near step 100 a rounding-level difference (1e-6 at step 60) moves one score
    across it in one run only, and from then on the runs differ by 2e-3, as two seeds would."""
    configs = [
        RunConfig(ToyModelConfig(attention=kind), TaskConfig(), TrainConfig(seed=s, max_steps=60, stop_linf=1e-12))
        for s in (0, 1)
    ]
    eager = [tmp_path / f"e{k}" for k in range(2)]
    compiled = [tmp_path / f"c{k}" for k in range(2)]
    train_seeds(configs, eager, progress=False, compile="off")
    train_seeds(configs, compiled, progress=False, compile="on")
    for a, b in zip(eager, compiled):
        wa, wb = _weights(a), _weights(b)
        assert set(wa) == set(wb) and any("W_gate" in n or "null" in n or "sinks" in n for n in wa) == (
            kind != "softpick"
        )
        assert max(float((wa[n] - wb[n]).abs().max()) for n in wa) <= 1e-4
