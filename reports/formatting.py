"""Numbers as text, one way everywhere: table cells (reports, inline displays) and the
numbers in findings' prose."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from sinkscope.infra.intervals import interval_possible

Cell = str | int | float | bool | None


def format_cell(value: Cell | Any, fmt: str = "") -> str:
    """Display text of a cell: None/NaN as an en dash, booleans as yes/no; numpy and
    torch scalars format as the Python numbers they hold."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bool, int, float)):
        value = item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and fmt:
        return format(value, fmt)
    return str(value)


def sig(value: float | None, digits: int = 2) -> str:
    """A number for prose: ``digits`` significant digits (``6.7e-09``, ``0.12``), n/a when
    missing."""
    if value is None or math.isnan(value):
        return "n/a"
    return format(value, f".{digits}g")


def sig_kept(value: float, digits: int = 3) -> str:
    """``digits`` significant digits with trailing zeros kept (``7.00e-09``, ``0.140``): the
    rounding of a sentence whose numbers all show ``digits``, where ``sig``'s 7e-09 and 0.14
    beside 7.04e-09 would read as two rules."""
    if math.isnan(value):
        return "n/a"
    return format(value, f"#.{digits}g")


def kept_together(values: tuple[float, ...], digits: int = 3) -> list[str]:
    """``sig_kept`` of each of ``values``, all in scientific notation when one of them needs it
    (``-1.01e-04 to -6.65e-06``, not ``-0.000101`` beside ``-6.65e-06``)."""
    texts = [sig_kept(value, digits) for value in values]
    if any("e" in text for text in texts):
        texts = ["n/a" if math.isnan(value) else format(value, f".{digits - 1}e") for value in values]
    return texts


def percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}%"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` with its noun, singular for exactly one: "1 prompt", "16 prompts"."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"


def interval_text(low: float, high: float, n: int, digits: int = 3, level: str = "95%") -> str:
    """The one way an interval is written: "95% CI 1.31 to 1.81, n = 16"; from fewer than
    ``MIN_INTERVAL_UNITS`` units there is no interval (sinkscope.infra.intervals: a result
    file written before the rule may hold one), so it says "n = 3, no interval"."""
    if not interval_possible(n) or not (math.isfinite(low) and math.isfinite(high)):  # NaN ends: none was computed
        return f"n = {n:,}, no interval"
    ends = common_decimals((low, high), digits)
    low_text, high_text = ends if ends else kept_together((low, high), digits)
    return f"{level} CI {low_text} to {high_text}, n = {n:,}"


def shared_decimals(values: Iterable[float], digits: int) -> int | None:
    """The number of decimals that gives the largest of ``values`` ``digits`` significant
    digits; None where fixed decimals would not read (all zero, below 0.001 or from
    100,000 up: those stay in ``sig``'s g format)."""
    top = max((abs(value) for value in values if math.isfinite(value)), default=0.0)
    if not 1e-3 <= top < 1e5:
        return None
    return max(0, digits - 1 - math.floor(math.log10(top)))


def common_decimals(values: tuple[float, ...], digits: int, signed: bool = False) -> list[str] | None:
    """``values`` with one number of decimals, enough for ``digits`` significant digits in
    the largest (77.0 to 78.2, not 77 to 78.2); None where ``shared_decimals`` has none."""
    decimals = shared_decimals(values, digits)
    if decimals is None:
        return None
    return [format(value, f"{'+' if signed else ''}.{decimals}f") for value in values]


def confidence_label(confidence: float) -> str:
    """A confidence level as intervals are labelled: 0.95 -> "95%", 0.9 -> "90%"."""
    return f"{confidence * 100:g}%"


def estimate_text(
    mean: float, low: float, high: float, n: int, digits: int = 3, signed: bool = True, level: str = "95%"
) -> str:
    """A mean with its interval, all with the same decimals: "+1.58 [95% CI 1.31 to 1.81,
    n = 16]" (brackets: it sits inside prose's parentheses); ``level``: the interval's."""
    shown = (mean, low, high) if interval_possible(n) and math.isfinite(low) and math.isfinite(high) else (mean,)
    fixed = common_decimals(shown, digits) or kept_together(shown, digits)
    value = ("+" if signed and mean >= 0 else "") + fixed[0]
    interval = f"{level} CI {fixed[1]} to {fixed[2]}, n = {n:,}" if len(fixed) == 3 else f"n = {n:,}, no interval"
    return f"{value} [{interval}]"


def value_range(low: float, high: float, spec: str) -> str:
    """A range of measured values as text: one value when both ends print the same
    (``2.5e-04``, not ``2.5e-04..2.5e-04``), else ``low–high`` joined by an en dash."""
    low_text, high_text = format(low, spec), format(high, spec)
    return low_text if low_text == high_text else f"{low_text}\u2013{high_text}"


def index_ranges(indices: Iterable[int]) -> str:
    """Sorted integer indices as runs: "0-3, 17-20" (a run of one is the one index)."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
