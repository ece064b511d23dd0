"""Running many toy trainings as one experiment: the shared machinery of
``sinkscope toy reproduce`` and ``sinkscope toy sweep``.

Each job trains one model into its own run directory (resumable) and evaluates it the
way the paper's figures do. Jobs run in parallel worker processes with one thread
each: the models are tiny, so more processes beat more threads per process. Once fewer
jobs remain than workers, the idle workers' cores are lent to the jobs still running
(``torch.set_num_threads``, re-read every ``log_every`` steps), so the longest run, the
4x4 softmax model, finishes on two threads instead of waiting alone on one. Thread
count does not change the numbers: training is bit-identical on 1 or 2 threads
(``tests/test_experiment_threads.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from interp.atomic_io import atomic_write_json, read_json
from toy.batched_train import train_batched
from toy.evaluate import HeadRow, ToyDefaultState, evaluate_run
from toy.paper_reference import PAPER_SINK_HEADS, paper_reference
from toy.run_dir import RunConfig, TrainResult, read_metrics
from toy.train import train


@dataclass
class ModelSummary:
    """One trained and evaluated model of an experiment (a row of ``summary.json``)."""

    name: str
    layers: int
    heads: int
    attention: str
    seed: int
    converged: bool
    status: str
    steps: int
    wall_seconds: float
    linf_error: float
    heldout_linf_error: float
    heldout_mse: float
    n_sink_heads: int
    heads_table: list[HeadRow]
    default_state_test: ToyDefaultState | None
    paper: str
    paper_sink_heads: int | None
    figures: list[str]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelSummary":
        state = data["default_state_test"]
        return cls(**{
            **data,
            "heads_table": [HeadRow(**row) for row in data["heads_table"]],
            "default_state_test": None if state is None else ToyDefaultState.from_dict(state),
        })


# In a worker process: how many jobs are still unfinished (set by the parent) and how
# many cores the experiment may use. None in the parent process.
_UNFINISHED_JOBS: Any = None
_CORE_BUDGET = 1


def _init_worker(unfinished_jobs: Any, core_budget: int) -> None:
    global _UNFINISHED_JOBS, _CORE_BUDGET
    _UNFINISHED_JOBS, _CORE_BUDGET = unfinished_jobs, core_budget


def lent_threads(unfinished_jobs: int, core_budget: int) -> int:
    """Threads for one job when ``unfinished_jobs`` share ``core_budget`` cores: 1 while
    every worker is busy, the idle workers' cores once jobs run out."""
    return max(1, core_budget // max(1, min(unfinished_jobs, core_budget)))


def _use_lent_threads(step: int | None = None) -> None:
    if _UNFINISHED_JOBS is None:
        return
    threads = lent_threads(_UNFINISHED_JOBS.value, _CORE_BUDGET)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)


def seed_groups(jobs: list[tuple[str, RunConfig]], workers: int) -> list[list[tuple[str, RunConfig]]]:
    """Jobs whose configs differ only in ``train.seed``, in groups trained as one batched
    computation (``toy.batched_train``): at most ceil(seeds / workers) seeds a group, so
    every worker gets a share of the costliest configuration. Order is kept (groups
    follow their first job), so costliest-first stays costliest-first."""
    by_key: dict[str, list[tuple[str, RunConfig]]] = {}
    for name, config in jobs:
        key = config.to_dict()
        key["train"] = {k: v for k, v in key["train"].items() if k != "seed"}
        by_key.setdefault(repr(key), []).append((name, config))
    groups = []
    for members in by_key.values():
        size = -(-len(members) // max(1, workers))
        groups += [members[start:start + size] for start in range(0, len(members), size)]
    return groups


def train_and_evaluate(group: list[tuple[str, RunConfig]], out_dir: str, n_sequences: int) -> list[ModelSummary]:
    """Train (or resume) ``out_dir/name`` for each job of ``group`` (one config, or seeds of
    one config trained together) and evaluate each; runs inside a worker process."""
    torch.set_num_threads(1)
    _use_lent_threads()
    names, configs = [name for name, _ in group], [config for _, config in group]
    run_dirs = [Path(out_dir) / name for name in names]
    if len(group) == 1:
        results = [train(configs[0], run_dirs[0], resume=True, progress=False, on_log=_use_lent_threads)]
    else:
        results = train_batched(configs, run_dirs, progress=False, on_log=_use_lent_threads)
    _use_lent_threads()
    return [_evaluate(name, config, result, Path(out_dir), n_sequences) for name, config, result in zip(names, configs, results)]


def _evaluate(name: str, config: RunConfig, result: TrainResult, out_dir: Path, n_sequences: int) -> ModelSummary:
    evaluation = evaluate_run(out_dir / name, n_sequences)
    key = (config.model.attention, config.model.n_layers, config.model.n_heads)
    return ModelSummary(
        name=name,
        layers=config.model.n_layers,
        heads=config.model.n_heads,
        attention=config.model.attention,
        seed=config.train.seed,
        converged=result.converged,
        status=result.status,
        steps=result.steps,
        wall_seconds=round(result.wall_seconds, 2),
        linf_error=result.linf_error,
        heldout_linf_error=evaluation.heldout_linf_error,
        heldout_mse=evaluation.heldout_mse,
        n_sink_heads=len(evaluation.sink_heads),
        heads_table=evaluation.heads_table,
        default_state_test=evaluation.default_state_test,
        paper=paper_reference(*key),
        paper_sink_heads=PAPER_SINK_HEADS.get(key),
        figures=[f"{name}/{figure}" for figure in evaluation.figures],
    )


def run_jobs(
    jobs: list[tuple[str, RunConfig]],
    out_dir: Path,
    workers: int,
    n_sequences: int,
    progress: bool = True,
) -> dict[str, ModelSummary]:
    """Train and evaluate every ``(run name, config)`` job; ``workers`` processes (1: in
    this process). Seeds of one config train together (``seed_groups``). Pass the
    costliest jobs first so the workers finish together."""
    by_name: dict[str, ModelSummary] = {}
    groups = seed_groups(jobs, workers)
    bar = tqdm(total=len(jobs), desc="models", disable=not progress)
    try:
        if workers == 1:
            for group in groups:
                for summary in train_and_evaluate(group, str(out_dir), n_sequences):
                    by_name[summary.name] = summary
                    bar.update(1)
            return by_name
        context = multiprocessing.get_context("spawn")
        unfinished = context.Value("i", len(groups), lock=False)  # one writer: this process
        with context.Pool(min(workers, len(groups)), initializer=_init_worker, initargs=(unfinished, workers)) as pool:
            pending = {
                tuple(name for name, _ in group): pool.apply_async(train_and_evaluate, (group, str(out_dir), n_sequences))
                for group in groups
            }
            while pending:
                time.sleep(0.5)
                for names in [n for n, r in pending.items() if r.ready()]:
                    for summary in pending.pop(names).get():
                        by_name[summary.name] = summary
                        bar.update(1)
                unfinished.value = len(pending)
                running = [
                    f"{name}@{_last_step(out_dir / name)}"
                    for names in pending
                    for name in names
                    if (out_dir / name / "metrics.jsonl").exists()
                ]
                bar.set_postfix_str(", ".join(running[: 2 * workers]), refresh=True)
            # let the workers exit on their own: the context manager's terminate() can kill
            # one holding a queue lock, which leaks a semaphore (a warning at shutdown)
            pool.close()
            pool.join()
    finally:
        bar.close()
    return by_name


def _last_step(run_dir: Path) -> int:
    records = read_metrics(run_dir)
    return records[-1]["step"] if records else 0


def prepare_experiment_dir(
    out_dir: str | os.PathLike,
    marker_file: str,
    settings: dict[str, Any],
    what: str,
    overwrite: bool,
) -> None:
    """Make ``out_dir`` ready: resume when its ``marker_file`` holds the same settings,
    refuse other contents unless ``overwrite`` (then start afresh)."""
    out_dir = Path(out_dir)
    marker = out_dir / marker_file
    if marker.exists() and not overwrite:
        if read_json(marker) != settings:
            raise FileExistsError(
                f"{out_dir} holds {what} with different settings; use another --out or pass --overwrite"
            )
        return  # same settings: resume
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists and is not empty; use another --out or pass --overwrite")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(marker, settings)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
