"""Batches of resumable units (toy seed groups, sweep cells, audits of one model revision)
run once each, in this process, in a local process pool, or on Ray. Above ``interp``,
below ``toy`` and ``pretrained_analysis``: it imports ``interp`` only."""

from sinkscope.execution.executors import run_units
from sinkscope.execution.units import Unit, UnitFailure, UnitsFailed, UnitsReport, finished, skip_finished, units_failed

__all__ = [
    "Unit",
    "UnitFailure",
    "UnitsFailed",
    "UnitsReport",
    "finished",
    "run_units",
    "skip_finished",
    "units_failed",
]
