"""What values a persisted result may hold, declared by each result class and checked by
the codec (``sinkscope.infra.codec``) on every file it reads, so that a tampered or
damaged file is refused in one line instead of being reported as if it were real.

A persisted dataclass declares, in one place each:

- ``BOUNDS: ClassVar[dict[str, Bound]]``: the range of each numeric field (applied to
  every number inside a tuple, list or dict field too), e.g. ``{"layer": COUNT,
  "anchor_mass": FRACTION}``; ``UNBOUNDED`` says a number may be any finite value;
- ``inconsistencies(self)``: a generator of ``(field path, value, allowed)`` for fields
  that disagree with each other (an index beyond its count, lists of the wrong length).

Every number must be finite; ``null`` (NaN in a ``float`` field: a quantity that was not
defined, e.g. a metric measured for no query) stays legal wherever the type allows it. An
integer must fit in 64 bits, whatever its declared range (nothing sinkscope counts is
larger, and larger ones overflow on the way to a float). ``undeclared_numeric_fields``
lets a test hold every numeric field of every persisted class to a declaration.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

MAX_INT = 2**63 - 1
TOLERANCE = 1e-6  # masses and shares are sums of floats: 1 + 1e-7 is 1, rounded


@dataclasses.dataclass(frozen=True)
class Bound:
    """A closed range ``[low, high]`` (None: unbounded on that side), widened by ``tolerance``."""

    low: float | None = None
    high: float | None = None
    tolerance: float = 0.0

    def admits(self, value: float) -> bool:
        if math.isnan(value):  # null: undefined, legal where the type allows it
            return True
        if math.isinf(value):
            return False
        low_ok = self.low is None or value >= self.low - self.tolerance
        return low_ok and (self.high is None or value <= self.high + self.tolerance)

    def __str__(self) -> str:
        low, high = self.low, None if self.high == MAX_INT else self.high  # the 64-bit cap goes without saying
        if low is None and high is None:
            return "a finite number"
        if high is None:
            return f"a number >= {low:g}"
        if low is None:
            return f"a number <= {high:g}"
        return f"a number in [{low:g}, {high:g}]" + (f" give or take {self.tolerance:g}" if self.tolerance else "")


COUNT = Bound(0, MAX_INT)  # a count or an index
POSITIVE = Bound(1, MAX_INT)  # a size that cannot be zero (layers, heads, widths)
FRACTION = Bound(0.0, 1.0, TOLERANCE)  # an attention mass, a share, a fraction
PERCENT = Bound(0.0, 100.0, 100 * TOLERANCE)
NONNEGATIVE = Bound(0.0)  # a norm, a loss, an error, seconds
UNBOUNDED = Bound()  # any finite number (a seed, a signed effect)

Problem = tuple[str, Any, str]  # (field path, its value, what is allowed)


def bound_problems(obj: Any) -> Iterator[Problem]:
    """Each field of ``obj`` (a persisted dataclass) outside its declared ``BOUNDS``."""
    for name, bound in getattr(type(obj), "BOUNDS", {}).items():
        yield from _numbers_outside(getattr(obj, name), bound, name)


def outside(value: Any, bound: Bound, where: str) -> Iterator[Problem]:
    """Each number in ``value`` (a number, or a tuple, list or dict of them) outside ``bound``."""
    return _numbers_outside(value, bound, where)


def _numbers_outside(value: Any, bound: Bound, where: str) -> Iterator[Problem]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        if not bound.admits(float(value)):
            yield where, value, str(bound)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers_outside(item, bound, f"{where}[{key!r}]")
    elif isinstance(value, Iterable):
        for index, item in enumerate(value):
            yield from _numbers_outside(item, bound, f"{where}[{index}]")


def index_problems(pairs: Iterable[tuple[str, int, int, str]]) -> Iterator[Problem]:
    """``(path, index, count, count's name)`` where the index is not below its count."""
    for path, index, count, name in pairs:
        if not 0 <= index < count:
            yield path, index, f"an index below {name} ({count})"


def head_grid_problems(
    heads: Iterable[Any], n_layers: int, n_heads: int, name: str = "heads", layers: Sequence[int] | None = None
) -> Iterator[Problem]:
    """A per-head table that must hold each (layer, head) of an ``n_layers`` x ``n_heads``
    model once (of its ``layers`` only, when given): its length, each row's indices, no
    row twice."""
    rows = list(heads)
    expected, which = (n_layers, "n_layers") if layers is None else (len(layers), f"{len(layers)} probed layers")
    if len(rows) != expected * n_heads:
        yield name, f"{len(rows)} rows", f"{which} x n_heads = {expected * n_heads} rows, one per head"
        return
    allowed = None if layers is None else set(layers)
    seen: set[tuple[int, int]] = set()
    for index, row in enumerate(rows):
        yield from index_problems(
            [
                (f"{name}[{index}].layer", row.layer, n_layers, "n_layers"),
                (f"{name}[{index}].head", row.head, n_heads, "n_heads"),
            ]
        )
        if allowed is not None and row.layer not in allowed:
            yield f"{name}[{index}].layer", row.layer, "one of the probed layers"
        if (row.layer, row.head) in seen:
            yield f"{name}[{index}]", f"layer {row.layer} head {row.head}", "each (layer, head) once"
        seen.add((row.layer, row.head))


def head_ref_problems(refs: Iterable[tuple[int, int]], n_layers: int, n_heads: int, name: str) -> Iterator[Problem]:
    """``(layer, head)`` pairs (e.g. the sink heads a test removed) outside the model's heads."""
    for index, (layer, head) in enumerate(refs):
        yield from index_problems(
            [(f"{name}[{index}][0]", layer, n_layers, "n_layers"), (f"{name}[{index}][1]", head, n_heads, "n_heads")]
        )


def at_most(path: str, value: float, limit: float, limit_name: str) -> Iterator[Problem]:
    """``value`` above ``limit`` (e.g. sink heads beyond the number of heads)."""
    if value > limit:
        yield path, value, f"at most {limit_name} ({limit})"


def relative_path_problems(paths: Iterable[str], name: str = "figures") -> Iterator[Problem]:
    """Paths a result names inside its own directory that could point out of it: empty,
    absolute, or with a ``..`` part (a report reads only inside its result directory)."""
    for index, path in enumerate(paths):
        parts = PurePosixPath(path.replace("\\", "/")).parts
        if not path or path.startswith(("/", "\\")) or PureWindowsPath(path).drive or ".." in parts:
            yield f"{name}[{index}]", repr(path), "a relative path inside the result directory (no '..')"


def undeclared_numeric_fields(cls: type) -> list[str]:
    """The numeric fields of the persisted dataclass ``cls`` that its ``BOUNDS`` leaves out."""
    declared = getattr(cls, "BOUNDS", {})
    hints = typing.get_type_hints(cls)
    return [
        field.name
        for field in dataclasses.fields(cls)
        if field.metadata.get("persist", True) and _holds_numbers(hints[field.name]) and field.name not in declared
    ]


def _holds_numbers(kind: Any) -> bool:
    if kind in (int, float):
        return True
    return any(_holds_numbers(arg) for arg in typing.get_args(kind) if arg is not Ellipsis)
