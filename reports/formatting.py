"""Numbers as text, one way everywhere: table cells (reports, inline displays) and the
numbers in findings' prose."""

from __future__ import annotations

import math
from typing import Any

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


def percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}%"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` with its noun, singular for exactly one: "1 prompt", "16 prompts"."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"


def interval_text(low: float, high: float, n: int, digits: int = 3, level: str = "95%") -> str:
    """The one way an interval is written: "95% CI 1.31 to 1.81, n = 16"; from fewer than two
    units there is no interval (a bootstrap of one value is that value twice), so it says
    "n = 1, no interval"."""
    if n < 2 or not (math.isfinite(low) and math.isfinite(high)):  # NaN ends: none was computed
        return f"n = {n:,}, no interval"
    return f"{level} CI {sig(low, digits)} to {sig(high, digits)}, n = {n:,}"


def estimate_text(mean: float, low: float, high: float, n: int, digits: int = 3, signed: bool = True) -> str:
    """A mean with its interval: "+1.58 [95% CI 1.31 to 1.81, n = 16]" (brackets: it sits
    inside prose's parentheses)."""
    value = format(mean, f"+.{digits}g") if signed else sig(mean, digits)
    return f"{value} [{interval_text(low, high, n, digits)}]"


def value_range(low: float, high: float, spec: str) -> str:
    """A range of measured values as text: one value when both ends print the same
    (``2.5e-04``, not ``2.5e-04..2.5e-04``), else ``low–high`` joined by an en dash."""
    low_text, high_text = format(low, spec), format(high, spec)
    return low_text if low_text == high_text else f"{low_text}\u2013{high_text}"
