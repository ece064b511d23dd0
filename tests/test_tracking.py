"""Run tracking: ``on_log(step, record)``, and training runs, reproductions and sweeps
logged to TensorBoard and to Weights & Biases (offline, read back from its own files)."""

from __future__ import annotations

from pathlib import Path

from toy.model import ToyModelConfig
from toy.run_dir import RunConfig, TrainConfig, read_metrics
from toy.task import TaskConfig
from toy.train import train_seeds


def _config(seed: int = 0, **train_kwargs) -> RunConfig:
    # max_steps not a multiple of log_every: the last line is the run's last step, logged too
    settings = dict(seed=seed, max_steps=23, log_every=10, checkpoint_every=10, stop_linf=1e-12)
    settings.update(train_kwargs)
    return RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(**settings))


def test_on_log_gets_every_metrics_line_of_every_stacked_run_with_its_run_directory(tmp_path):
    runs = [tmp_path / "seed0", tmp_path / "seed1"]
    seen: list[tuple[int, dict]] = []
    train_seeds([_config(0), _config(1)], runs, progress=False, on_log=lambda step, record: seen.append((step, record)))
    for run in runs:
        mine = [(step, record) for step, record in seen if record["run"] == str(run)]
        lines = read_metrics(run)
        assert [step for step, _ in mine] == [line["step"] for line in lines] == [0, 10, 20, 23]
        assert [{k: v for k, v in record.items() if k != "run"} for _, record in mine] == lines
    assert len(seen) == 8 and {record["run"] for _, record in seen} == {str(Path(run)) for run in runs}
