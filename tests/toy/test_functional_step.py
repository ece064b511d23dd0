"""The compiled training step is one graph (issue 38), checked on the CPU: no graph break at
K = 1 or 8, the only tensors the graph writes are static inputs (what CUDA graphs need to
replay it rather than skip it: "skipping cudagraphs due to mutated inputs"), and the
captured step replays to eager's weights, Adam state and stop steps within 1e-5.
Dynamo and AOTAutograd only, no inductor: seconds, not the minute a CPU compile takes."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop

import sinkscope.toy.compiled_step as compiled_step
from sinkscope.toy.device_stop import DeviceStop, device_step
from sinkscope.toy.functional_step import AdamSettings, functional_step, state_tensors
from sinkscope.toy.interrupt import StepBoundaryInterrupt
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.run_member import RunMember, open_run
from sinkscope.toy.seed_stack import StackTraining
from sinkscope.toy.task import TaskConfig

NEVER = 10**9
TOLERANCE = 1e-5  # after 40 steps; measured about 1e-7 at K = 1 and 3e-6 at K = 4 after 200


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Each test from dynamo's empty cache: variants of the step compiled by earlier tests in
    this process would count towards the recompile limit."""
    torch._dynamo.reset()


def _training(tmp_path, k: int, name: str, stop_linf: float) -> StackTraining:
    """A stack of ``k`` seeds after its first (host) step, which makes Adam's state."""
    members = []
    for seed in range(k):
        settings = {"max_steps": NEVER, "log_every": NEVER, "checkpoint_every": NEVER, "stop_linf": stop_linf}
        config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(seed=seed, **settings))
        member = open_run(config, tmp_path / f"{name}{seed}", False, torch.device("cpu"))
        assert isinstance(member, RunMember)
        members.append(member)
    training = StackTraining(members, False, None, True, False)
    training.train_step(StepBoundaryInterrupt())
    return training


def _functional(training: StackTraining, stop: DeviceStop):
    stack = training.stack
    assert stack is not None
    return functional_step(stack.functional_forward, stack.parameters(), stack.optimizer, stop)


@pytest.mark.parametrize("k", [1, 8])
def test_the_compiled_step_is_one_graph_with_no_break(tmp_path, k, monkeypatch):
    """What the trainer's compiled path (``device_step(..., compiled=True)``) hands to
    ``torch.compile``, explained by dynamo."""
    training = _training(tmp_path, k, "s", 1e-12)
    stack = training.stack
    assert stack is not None
    handed: list = []
    monkeypatch.setattr(compiled_step.torch, "compile", lambda step, mode=None: handed.append(step) or step)
    stop = DeviceStop(k, 1e-12, torch.device("cpu"))
    device_step(stack.forward, stack.functional_forward, stack.parameters(), stack.optimizer, stop, True)
    monkeypatch.undo()  # explain compiles through torch.compile's machinery
    _, tokens, targets = training._draw_batches()
    explained = torch._dynamo.explain(handed[0])(tokens, targets)
    assert [b.reason for b in explained.break_reasons] == []
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def _recording_backend(seen: dict):
    """AOTAutograd with no compiler, recording the graph's inputs (the real tensors), which
    of them the graph writes and which are static: inductor's CUDA-graph check compares
    exactly these two."""

    def forward_compiler(graph, example_inputs):
        metadata = torch._guards.TracingContext.get().fw_metadata
        seen["mutated"] = [i for i, info in enumerate(metadata.input_info) if info.mutates_data]
        seen["static"] = set(metadata.static_input_indices)
        seen["aot_inputs"] = len(metadata.input_info)
        return boxed_nop(graph, example_inputs)

    aot = aot_autograd(fw_compiler=forward_compiler)

    def backend(graph, example_inputs):
        seen["inputs"] = list(example_inputs)
        return aot(graph, example_inputs)

    return backend


@pytest.mark.parametrize("k", [1, 8])
def test_the_captured_step_writes_only_static_state_and_replays_eager(tmp_path, k):
    """Seeds stop early (stop_linf 0.92), so the freeze is exercised inside the graph."""
    eager_training, captured_training = _training(tmp_path, k, "e", 0.92), _training(tmp_path, k, "c", 0.92)
    eager_stop, captured_stop = DeviceStop(k, 0.92, torch.device("cpu")), DeviceStop(k, 0.92, torch.device("cpu"))
    eager_stack = eager_training.stack
    assert eager_stack is not None
    eager = device_step(
        eager_stack.forward,
        eager_stack.functional_forward,
        eager_stack.parameters(),
        eager_stack.optimizer,
        eager_stop,
        False,
    )
    seen: dict = {}
    captured = torch.compile(_functional(captured_training, captured_stop), backend=_recording_backend(seen))
    for stop in (eager_stop, captured_stop):
        stop.step.fill_(1)
    for _ in range(40):
        for step, training in ((eager, eager_training), (captured, captured_training)):
            _, tokens, targets = training._draw_batches()
            step(tokens, targets)
    assert seen["mutated"] and set(seen["mutated"]) <= seen["static"]
    assert captured_stop.stopped.any() and torch.equal(captured_stop.stop_step, eager_stop.stop_step)
    captured_stack = captured_training.stack
    assert captured_stack is not None
    owned = state_tensors(captured_stack.optimizer, captured_stack.parameters(), captured_stop)
    assert seen["aot_inputs"] == len(seen["inputs"])  # no inputs lifted or merged: the indices agree
    written = [seen["inputs"][i] for i in seen["mutated"]]
    assert all(any(tensor is state for state in owned) for tensor in written)  # never the batch
    pairs = zip(
        state_tensors(eager_stack.optimizer, eager_stack.parameters(), eager_stop),
        owned,
    )
    assert max(float((a.detach().double() - b.detach().double()).abs().max()) for a, b in pairs) <= TOLERANCE


def test_adam_settings_refuse_what_the_functional_update_does_not_do():
    weights = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="without weight decay or amsgrad"):
        AdamSettings.of(torch.optim.Adam(weights, weight_decay=0.1))
    assert AdamSettings.of(torch.optim.Adam(weights, lr=0.01, betas=(0.9, 0.95))) == AdamSettings(0.01, 0.9, 0.95, 1e-8)


def test_more_stacks_than_dynamo_s_recompile_limit_all_compile(tmp_path, monkeypatch):
    """A process that trains many configurations (a sweep) compiles a variant of the one
    step function per stack shape; past dynamo's limit of 8 variants the rest would run
    uncompiled. Nine shapes, each through the trainer's compiled path: nine compiled."""
    compiled: list[int] = []

    def counting(graph, example_inputs):
        compiled.append(1)
        return graph.forward

    real_compile = torch.compile
    monkeypatch.setattr(compiled_step.torch, "compile", lambda step, mode=None: real_compile(step, backend=counting))
    for heads in range(1, 10):
        config = RunConfig(
            ToyModelConfig(n_heads=heads),
            TaskConfig(),
            TrainConfig(seed=0, max_steps=NEVER, log_every=NEVER, checkpoint_every=NEVER, stop_linf=1e-12),
        )
        member = open_run(config, tmp_path / f"h{heads}", False, torch.device("cpu"))
        assert isinstance(member, RunMember)
        training = StackTraining([member], False, None, True, False)
        training.train_step(StepBoundaryInterrupt())
        stack = training.stack
        assert stack is not None
        stop = DeviceStop(1, 1e-12, torch.device("cpu"))
        step = device_step(stack.forward, stack.functional_forward, stack.parameters(), stack.optimizer, stop, True)
        for _ in range(2):
            _, tokens, targets = training._draw_batches()
            step(tokens, targets)
        assert len(compiled) == heads


@pytest.mark.parametrize("k", [1, 2])
def test_a_step_that_meets_empty_attention_caches_still_compiles(tmp_path, k, monkeypatch, capsys):
    """A resumed stack whose first step is a device step has run no host forward, so its
    attention layers' mask caches are empty; filled inside grad_and_value's trace they failed
    AOTAutograd, and the stack trained eager with a "training eager" note."""
    training = _training(tmp_path, k, "r", 1e-12)
    stack = training.stack
    assert stack is not None
    emptied = 0
    model = stack._model if k == 1 else stack.base  # the module the step runs: the model, or the stack's template
    for module in model.modules():
        for cache in ("_mask_cache", "_bias_cache"):
            if isinstance(getattr(module, cache, None), dict):
                getattr(module, cache).clear()
                emptied += 1
    assert emptied, "the stack's attention caches were not found"
    real_compile = torch.compile
    monkeypatch.setattr(compiled_step.torch, "compile", lambda step, mode=None: real_compile(step, backend="aot_eager"))
    stop = DeviceStop(k, 1e-12, torch.device("cpu"))
    step = device_step(stack.forward, stack.functional_forward, stack.parameters(), stack.optimizer, stop, True)
    for _ in range(2):
        _, tokens, targets = training._draw_batches()
        step(tokens, targets)
    assert "training eager" not in capsys.readouterr().err
