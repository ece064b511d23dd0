"""Checkpoint and atomic-output primitives, and config loading errors."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.infra.atomic_io import atomic_directory, atomic_path, atomic_write_json, atomic_write_text, read_json
from sinkscope.infra.errors import InputError
from sinkscope.toy.checkpoint import load_tensors, optimizer_from_tensors, optimizer_to_tensors, save_tensors
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.run_dir import RunConfig, TrainConfig, load_model, read_config, write_config
from sinkscope.toy.task import TaskConfig


def _leftovers(directory):
    return sorted(p.name for p in directory.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp"))


def test_atomic_writes_leave_only_the_target(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "hello")
    atomic_write_json(tmp_path / "sub" / "b.json", {"x": [1, 2]})
    with pytest.raises(ValueError, match="not JSON compliant"):  # NaN goes through sinkscope.infra.codec as null
        atomic_write_json(tmp_path / "sub" / "nan.json", {"nan": float("nan")})
    save_tensors(tmp_path / "c.safetensors", {"w": torch.arange(6.0).view(2, 3)})
    with atomic_directory(tmp_path / "d") as tmp:
        (tmp / "inner.txt").write_text("inner")
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert read_json(tmp_path / "sub" / "b.json")["x"] == [1, 2]
    assert torch.equal(load_tensors(tmp_path / "c.safetensors")["w"], torch.arange(6.0).view(2, 3))
    assert (tmp_path / "d" / "inner.txt").read_text() == "inner"
    assert _leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "c.safetensors", "d", "sub"]


def test_failed_writes_keep_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"version": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"version": 2, "half')
            raise RuntimeError("interrupted")
    assert read_json(target) == {"version": 1}
    # an unserialisable object fails before anything replaces the old file
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert read_json(target) == {"version": 1}
    # a directory build that fails leaves the previous directory intact
    with atomic_directory(tmp_path / "ckpt") as tmp:
        (tmp / "weights").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "ckpt") as tmp:
            (tmp / "weights").write_text("new, half written")
            raise RuntimeError("interrupted")
    assert (tmp_path / "ckpt" / "weights").read_text() == "old"
    # and a complete rebuild replaces it
    with atomic_directory(tmp_path / "ckpt") as tmp:
        (tmp / "weights").write_text("new")
    assert (tmp_path / "ckpt" / "weights").read_text() == "new"
    assert _leftovers(tmp_path) == []


def test_read_json_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="delete or regenerate it"):
        read_json(tmp_path / "broken.json")
    with pytest.raises(InputError, match="does not exist"):
        load_tensors(tmp_path / "missing.safetensors")


def test_safetensors_round_trip_of_a_model(tmp_path):
    torch.manual_seed(0)
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, d_model=8, layer_norm=True, mlp=True))
    save_tensors(tmp_path / "m.safetensors", model.state_dict())
    other = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, d_model=8, layer_norm=True, mlp=True))
    other.load_state_dict(load_tensors(tmp_path / "m.safetensors"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name


def _adam_steps(model, optimizer, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = torch.randn(4, 6, 8, generator=generator)
        loss = model(tokens).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_optimizer_state_round_trip(tmp_path):
    torch.manual_seed(0)
    config = ToyModelConfig(n_layers=2, n_heads=2, d_model=8, init_std=0.3)
    model = ToyTransformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    _adam_steps(model, optimizer, 3, seed=0)

    tensors, groups = optimizer_to_tensors(optimizer)
    json.dumps(groups)  # the param groups are plain JSON
    save_tensors(tmp_path / "opt.safetensors", tensors)
    save_tensors(tmp_path / "model.safetensors", model.state_dict())

    clone = ToyTransformer(config)
    clone.load_state_dict(load_tensors(tmp_path / "model.safetensors"))
    clone_optimizer = torch.optim.Adam(clone.parameters(), lr=1.0)  # settings come from the groups
    optimizer_from_tensors(clone_optimizer, load_tensors(tmp_path / "opt.safetensors"), json.loads(json.dumps(groups)))

    original, restored = optimizer.state_dict(), clone_optimizer.state_dict()
    assert restored["param_groups"] == original["param_groups"]
    assert restored["param_groups"][0]["betas"] == (0.9, 0.95)
    assert original["state"].keys() == restored["state"].keys()
    for param_id, state in original["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(restored["state"][param_id][key])), (
                param_id,
                key,
            )

    # continuing from the restored state gives bitwise the same parameters
    _adam_steps(model, optimizer, 3, seed=1)
    _adam_steps(clone, clone_optimizer, 3, seed=1)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, clone.state_dict()[name]), name


def _run_config() -> RunConfig:
    return RunConfig(ToyModelConfig(d_model=8), TaskConfig(d_model=8), TrainConfig(max_steps=10))


def test_config_round_trip(tmp_path):
    write_config(tmp_path, _run_config())
    assert read_config(tmp_path) == _run_config()


@pytest.mark.parametrize(
    "section, key, message",
    [
        ("model", "n_experts", "config.json: model has unknown fields"),
        ("task", "n_triggers", "config.json: task has unknown fields"),
        ("train", "warmup", "config.json: train has unknown fields"),
    ],
)
def test_unknown_config_key_is_a_clear_error(tmp_path, section, key, message):
    write_config(tmp_path, _run_config())
    data = json.loads((tmp_path / "config.json").read_text())
    data[section][key] = 1
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"{message} \\['{key}'\\]; known: .*; restore it"):
        read_config(tmp_path)


def test_config_without_sections_or_mismatched_width(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ValueError, match="lacks the field 'task'"):
        read_config(tmp_path)
    with pytest.raises(ValueError, match="set both to the same width"):
        RunConfig(ToyModelConfig(d_model=8), TaskConfig(d_model=16), TrainConfig())


def test_read_config_on_a_non_run_directory(tmp_path):
    with pytest.raises(InputError, match="not a toy run directory .*sinkscope toy train"):
        read_config(tmp_path)
    with pytest.raises(InputError, match="not a toy run directory .*sinkscope toy train"):
        load_model(tmp_path / "nowhere")


def test_load_model_without_weights(tmp_path):
    write_config(tmp_path, _run_config())
    with pytest.raises(InputError, match="holds no weights yet"):
        load_model(tmp_path)


@pytest.mark.parametrize("bad", [dict(lr=0.0), dict(batch_size=0), dict(stop_linf=0.0), dict(keep_checkpoints=0)])
def test_bad_train_config(bad):
    with pytest.raises(ValueError, match="must be"):
        TrainConfig(**bad)


def test_atomic_outputs_are_readable_like_normal_files(tmp_path):
    """Results are shared: not mkstemp's private 0600 / mkdtemp's 0700."""
    import os

    from sinkscope.infra.atomic_io import atomic_directory, atomic_write_text

    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "f").write_text("y")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
