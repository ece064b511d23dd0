"""The sink-circuit battery on a trained toy run: the figure set of its task, the sink
heads its probe finds at default positions, and every circuit edit the toy model has a
part for, read out as the share of anchor mass left and the change in the task's error at
default positions (a toy model has no query bias: that edit is listed as not applicable)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.circuit_battery import run_circuit_battery
from sinkscope.probes.circuit_result import CircuitConfig, CircuitRun
from sinkscope.toy.evaluate import FIGURE_SEED, default_position_mse
from sinkscope.toy.probe_run import probe_of_run
from sinkscope.toy.run_dir import load_model, read_config, require_finished
from sinkscope.toy.task import eval_batch

ERROR_NAME = "mean squared error at default positions"


def toy_circuit(
    run_dir: str | os.PathLike,
    n_sequences: int = 1000,
    config: CircuitConfig | None = None,
    allow_unfinished: bool = False,
) -> CircuitRun:
    """The battery on the toy run in ``run_dir`` over ``n_sequences`` figure-set sequences
    (one forward pass each: the error is read against the whole set's targets)."""
    start = time.perf_counter()
    config = CircuitConfig() if config is None else config
    run_dir = Path(run_dir)
    unfinished = require_finished(run_dir, allow_unfinished, "take the circuit battery of")
    probe = probe_of_run(run_dir, n_sequences, allow_unfinished)
    heads = probe.sink_heads()
    if not heads:
        raise InputError(
            f"the toy run {run_dir} has no sink head (anchor mass >= {1 - probe.config.sink_eps:g} at default "
            "positions); train it to convergence, or pick a softmax run",
            field="run_dir",
        )
    run_config = read_config(run_dir)
    batch = eval_batch(run_config.task, n_sequences, FIGURE_SEED, run_config.model.target)
    error = default_position_mse(batch.targets, batch.default_query_mask())
    battery = run_circuit_battery(
        HookedModel(load_model(run_dir)),
        batch.tokens,
        heads,
        replace(config, batch_size=n_sequences),
        error_fn=error,
        sink_eps=probe.config.sink_eps,
    )
    model = run_config.model
    return CircuitRun(
        model=f"toy {model.attention} {model.n_layers}x{model.n_heads} ({run_dir.name})"
        + ("" if unfinished is None else f", {unfinished}"),
        inputs=f"{n_sequences} figure-set sequences of {run_config.task.seq_len} tokens",
        error_name=ERROR_NAME,
        sink_rule=f"anchor mass >= {1 - probe.config.sink_eps:g} at default positions",
        battery=battery,
        seconds=time.perf_counter() - start,
    )
