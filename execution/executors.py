"""Run a batch of units on this machine or on Ray; each unit runs once, a failure stops
nothing else, and the caller gets one ``UnitsReport``.

``run_units(units, executor="local", workers=1)`` runs the units in this process
(``workers=1``) or in a pool of ``workers`` spawned processes (``process_pool``: a worker
interrupted by Ctrl-C exits quietly; a unit whose worker is killed fails as lost and the
others run on). A worker dies with this process, even when it is SIGKILLed
(``worker_lifetime``). A unit that runs out of memory fails as bad input, naming the fix
(fewer workers, smaller units).

``executor="ray"`` runs each unit as a Ray task needing ``unit.cpus`` CPUs and
``unit.gpus`` GPUs, so GPU units land on GPU nodes. ``ray_address=None`` starts a local
Ray instance of ``workers`` CPUs for the run and shuts it down at the end; ``"auto"`` or
``"host:port"`` joins a running cluster (``workers`` is then the cluster's business),
which this driver leaves running. A worker process that dies mid-task (killed, out of
memory, its node lost) is retried by Ray up to ``retries`` times; a Python exception in
the unit is that unit's failure and is not retried. Results are gathered as they finish
(``ray.wait``), so ``on_done`` is a progress hook. Ray is an optional extra; without it
``executor="ray"`` is one ``InputError`` naming ``pip install 'sinkscope[ray]'``.

Interrupting the driver loses only the units in flight: the finished ones have written
their directories, and a re-run with ``skip=skip_finished(out_dir)`` skips them.
"""

from __future__ import annotations

import socket
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from sinkscope.execution.process_pool import Outcome, run_in_processes
from sinkscope.execution.units import OUT_OF_MEMORY_FIX, Unit, UnitFailure, UnitsReport
from sinkscope.infra.devices import is_out_of_memory
from sinkscope.infra.errors import InputError, RunFailed

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'sinkscope[ray]'"
DEFAULT_RETRIES = 3  # Ray's own default for tasks: a unit runs at most 4 times in all
POLL_SECONDS = 0.2
CONNECT_SECONDS = 5  # to a cluster's head, before ray.init (which would retry for minutes)

OnDone = Callable[[str, Any], None]
OnFailed = Callable[[UnitFailure], None]


def run_units(
    units: Sequence[Unit],
    executor: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
    on_done: OnDone | None = None,
    on_failed: OnFailed | None = None,
    skip: Callable[[Unit], bool] | None = None,
    retries: int = DEFAULT_RETRIES,
) -> UnitsReport:
    """Run every unit of ``units`` once (those ``skip`` accepts are not scheduled and are
    listed as skipped) and report what finished, what was skipped and what failed.

    ``on_done(name, value)`` runs in this process as each unit finishes, ``on_failed``
    as each fails. ``retries``: how often Ray reruns a unit whose worker process died
    (the local executor does not retry). Bad settings are ``InputError`` before any unit
    runs; ``KeyboardInterrupt`` propagates (the units in flight are lost, no others).
    """
    _check(units, executor, workers, ray_address, retries)
    report = UnitsReport()
    to_run = []
    for unit in units:
        if skip is not None and skip(unit):
            report.skipped.append(unit.name)
        else:
            to_run.append(unit)
    outcomes: dict[str, Outcome] = {}

    def record(name: str, outcome: Outcome) -> None:
        outcomes[name] = outcome
        status, payload = outcome
        if status == "done" and on_done is not None:
            on_done(name, payload)
        elif status == "failed" and on_failed is not None:
            on_failed(payload)

    if to_run:
        if executor == "ray":
            _run_on_ray(to_run, workers, ray_address, retries, record)
        elif workers == 1:
            for unit in to_run:
                record(unit.name, run_unit(unit))
        else:
            run_in_processes(to_run, workers, _run_unit_in_worker, record)
    for unit in to_run:  # the batch's order, whatever order the units finished in
        status, payload = outcomes[unit.name]
        if status == "done":
            report.finished[unit.name] = payload
        else:
            report.failed.append(payload)
    return report


def _check(units: Sequence[Unit], executor: str, workers: int, ray_address: str | None, retries: int) -> None:
    if executor not in EXECUTORS:
        raise InputError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}", field="executor")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"workers={workers!r}; it must be a whole number >= 1", field="workers")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InputError(f"retries={retries!r}; it must be a whole number >= 0", field="retries")
    if ray_address is not None and executor != "ray":
        raise InputError("ray_address is for the ray executor; pass executor='ray' too", field="ray_address")
    if ray_address is not None and not ray_address.strip():
        raise InputError("ray_address is empty; pass 'auto', 'host:port', or leave it unset", field="ray_address")
    seen: set[str] = set()
    for unit in units:
        if not isinstance(unit, Unit):
            raise InputError(f"{unit!r} is not a Unit", field="units")
        if unit.name in seen:
            raise InputError(f"two units are named {unit.name!r}; unit names must be unique", field="units")
        seen.add(unit.name)


def run_unit(unit: Unit) -> Outcome:
    """``unit.function(*unit.args)`` as an outcome: ``("done", value)``, or
    ``("failed", UnitFailure)`` with the traceback text of an exception (formatted where
    it happened, so the exception itself need not survive pickling). Running out of
    memory is the machine's limit, not a bug: a failure of kind ``"input"`` naming the fix."""
    try:
        return "done", unit.function(*unit.args)
    except Exception as error:
        if is_out_of_memory(error):
            return "failed", _out_of_memory(unit, error)
        kind = "input" if isinstance(error, InputError) else "run" if isinstance(error, RunFailed) else "bug"
        field = getattr(error, "field", None) if kind == "input" else None
        return "failed", UnitFailure(unit.name, type(error).__name__, str(error), traceback.format_exc(), kind, field)


def _out_of_memory(unit: Unit, error: Exception) -> UnitFailure:
    text = str(error).strip()
    cause = text.splitlines()[0] if text else type(error).__name__
    message = f"out of memory ({cause}); {OUT_OF_MEMORY_FIX}"
    return UnitFailure(unit.name, type(error).__name__, message, traceback.format_exc(), "input", "workers")


def _set_threads(unit: Unit) -> None:
    """One torch thread per CPU the unit asked for, in a worker process (not the caller's)."""
    import torch

    torch.set_num_threads(max(1, int(unit.cpus)))


def _run_unit_in_worker(unit: Unit) -> Outcome:
    """``run_unit`` in a pool worker, with the unit's torch threads."""
    _set_threads(unit)
    return run_unit(unit)


def _run_unit_on_ray(unit: Unit) -> Outcome:
    """``run_unit`` in a Ray worker, with the unit's torch threads."""
    _set_threads(unit)
    return run_unit(unit)


def import_ray() -> Any:
    """The ``ray`` module, or ``InputError`` naming the extra that installs it."""
    try:
        import ray
    except ImportError as error:
        raise InputError(f"the ray executor needs Ray: {RAY_INSTALL}", field="executor") from error
    return ray


def _run_on_ray(
    units: list[Unit], workers: int, address: str | None, retries: int, record: Callable[[str, Outcome], None]
) -> None:
    ray = import_ray()
    started_here = not ray.is_initialized()  # a caller's own ray.init() is used and left as it is
    if started_here:
        _init_ray(ray, workers, address)
    try:
        if started_here and address is None:
            _check_feasible(ray, units)
        task = ray.remote(_run_unit_on_ray)
        pending = {
            task.options(
                num_cpus=unit.cpus,
                num_gpus=unit.gpus,
                max_retries=retries,
                retry_exceptions=False,
                name=f"sinkscope:{unit.name}",
            ).remote(unit): unit.name
            for unit in units
        }
        waiting = list(pending)
        while waiting:
            # whatever finished within the poll interval, so that thousands of units cost
            # a wait per interval rather than one per unit
            ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_SECONDS)
            for ref in ready:
                name = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as error:  # the worker died more often than retries allow, or a Ray error
                    outcome = "failed", _ray_failure(name, error, retries)
                record(name, outcome)
    finally:
        if started_here:
            ray.shutdown()  # stops the instance started here; from a joined cluster it only disconnects


def _init_ray(ray: Any, workers: int, address: str | None) -> None:
    import logging

    if address is None:
        # "local": a new instance even where RAY_ADDRESS or a `ray start` on this machine
        # would otherwise be joined; pass ray_address="auto" for those
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING)
        return
    check_ray_address(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as error:
        raise InputError(
            f"cannot join the Ray cluster at {address} ({error}); start it with `ray start --head` or pass another address",
            field="ray_address",
        ) from error


def check_ray_address(address: str) -> None:
    """Refuse a ``host:port`` address where nothing listens: ``ray.init`` would retry for
    minutes. ``auto`` (and ``ray://`` client addresses' own errors) are Ray's to resolve."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(
            f"ray_address {address!r} is not 'auto' or host:port (e.g. 10.0.0.5:6379)", field="ray_address"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as error:
        raise InputError(
            f"cannot reach the Ray cluster at {address} ({error.strerror or error}); start it with "
            "`ray start --head` or pass the address it printed",
            field="ray_address",
        ) from error


def _check_feasible(ray: Any, units: list[Unit]) -> None:
    """Refuse, before scheduling, a unit that the local instance can never place (Ray
    would wait for it forever): more CPUs or GPUs than the machine offers."""
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0), total.get("GPU", 0)
    for unit in units:
        if unit.cpus > cpus or unit.gpus > gpus:
            raise InputError(
                f"unit {unit.name} needs {unit.cpus:g} CPUs and {unit.gpus:g} GPUs; the local Ray instance has "
                f"{cpus:g} CPUs and {gpus:g} GPUs (raise workers, or join a cluster with ray_address)",
                field="workers" if unit.cpus > cpus else "gpus",
            )


def _ray_failure(name: str, error: Exception, retries: int) -> UnitFailure:
    kind = type(error).__name__
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else kind
    if kind in ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError"):
        message = f"its Ray worker died {retries + 1} times (retries={retries}): {message}"
    return UnitFailure(name, kind, message, "".join(traceback.format_exception(error)), "lost")
