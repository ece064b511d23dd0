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

from sinkscope.infra.errors import InputError

MAX_INT = 2**63 - 1
TOLERANCE = 1e-6  # masses and shares are sums of floats: 1 + 1e-7 is 1, rounded


@dataclasses.dataclass(frozen=True)
class Bound:
    """A range ``[low, high]`` (None: unbounded on that side), widened by ``tolerance``;
    ``low_open``/``high_open`` leave that end out (a rate > 0, a beta < 1)."""

    low: float | None = None
    high: float | None = None
    tolerance: float = 0.0
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):  # null: undefined, legal where the type allows it
            return True
        if isinstance(value, float) and math.isinf(value):
            return False
        # an integer is compared exactly: as a float, 2**63 - 1 rounds up to 2**63
        low = self.low if self.low is None or not self.tolerance else self.low - self.tolerance
        high = self.high if self.high is None or not self.tolerance else self.high + self.tolerance
        low_ok = low is None or (value > low if self.low_open else value >= low)
        return low_ok and (high is None or (value < high if self.high_open else value <= high))

    def __str__(self) -> str:
        low, high = self.low, None if self.high == MAX_INT else self.high  # the 64-bit cap goes without saying
        if high is None:
            return "a finite number" if low is None else f"a number {'>' if self.low_open else '>='} {_number(low)}"
        if low is None:
            return f"a number {'<' if self.high_open else '<='} {_number(high)}"
        opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
        spread = f" give or take {self.tolerance:g}" if self.tolerance else ""
        return f"a number in {opening}{_number(low)}, {_number(high)}{closing}{spread}"

    def as_setting(self, integer: bool) -> str:
        """What a setting (a flag, a config field) may be, in words: ``an integer in [1, 1000]``."""
        if not integer:  # a setting is never NaN or infinite
            return str(self).replace("a number", "a finite number", self.high is None)
        low = "-2**63" if self.low is None else _number(self.low)
        high = "2**63 - 1" if self.high in (None, MAX_INT) else _number(self.high)
        return f"an integer in [{low}, {high}]"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


COUNT = Bound(0, MAX_INT)  # a count or an index
POSITIVE = Bound(1, MAX_INT)  # a size that cannot be zero (layers, heads, widths)
FRACTION = Bound(0.0, 1.0, TOLERANCE)  # an attention mass, a share, a fraction
PERCENT = Bound(0.0, 100.0, 100 * TOLERANCE)
NONNEGATIVE = Bound(0.0)  # a norm, a loss, an error, seconds
UNBOUNDED = Bound()  # any finite number (a signed effect)

# The ranges of settings, each declared once: the configs' BOUNDS and the command line's
# flags (``sinkscope.cli.args.within``) both read them, so a flag accepts what its config
# accepts, and what a config accepts its file's reader accepts (the codec checks BOUNDS).
SEED = Bound(0, MAX_INT)  # torch.manual_seed, random.Random and numpy's generators all take it
SEEDS = Bound(1, 1_000)  # seeds per configuration: the run list (a directory each) is built whole first
SAMPLES = Bound(1, 1_000_000)  # test sequences, prompts, input pairs: each set is held as tensors at once
POSITIVE_NUMBER = Bound(0.0, low_open=True)  # a rate, a width, a threshold that zero would break
EPS = Bound(0.0, 1.0, high_open=True)  # a sink head's anchor mass >= 1 - eps; eps 1 would take every head
MAX_TOKENS = 1 << 20
TOKENS = Bound(
    2, MAX_TOKENS
)  # a prompt's length T: the anchor and a query at least, beyond any model's context at most
K_DIMS = Bound(1, 4096)  # key input dimensions the circuit's key edit zeroes per sink layer


def check_bounds(obj: Any, error: type[InputError] = InputError) -> None:
    """Raise ``InputError`` (``field`` = the field's name) for the first field of the config
    ``obj`` outside its ``BOUNDS``: a value the codec would refuse when the file is read
    back is refused before anything is written. A setting is a number: NaN, which results
    keep for an undefined quantity, is refused too, and an integer must fit in 64 bits.
    ``error``: the ``InputError`` subclass to raise (e.g. the prompts' ``PromptError``)."""
    for name, bound in getattr(type(obj), "BOUNDS", {}).items():
        for path, value in _numbers(getattr(obj, name), name):
            wide = isinstance(value, int) and abs(value) > MAX_INT
            if wide or not bound.admits(value) or (isinstance(value, float) and math.isnan(value)):
                shown = f"an integer of {len(str(abs(value)))} digits" if wide else repr(value)
                raise error(f"{path} must be {bound.as_setting(isinstance(value, int))}, got {shown}", field=name)


def _numbers(value: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Each number in ``value`` (a number, or a tuple, list or dict of them) with its path."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, f"{where}[{key!r}]")
    elif isinstance(value, Iterable):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{where}[{index}]")


Problem = tuple[str, Any, str]  # (field path, its value, what is allowed)


def bound_problems(obj: Any) -> Iterator[Problem]:
    """Each field of ``obj`` (a persisted dataclass) outside its declared ``BOUNDS``."""
    for name, bound in getattr(type(obj), "BOUNDS", {}).items():
        yield from _numbers_outside(getattr(obj, name), bound, name)


def outside(value: Any, bound: Bound, where: str) -> Iterator[Problem]:
    """Each number in ``value`` (a number, or a tuple, list or dict of them) outside ``bound``."""
    return _numbers_outside(value, bound, where)


def _numbers_outside(value: Any, bound: Bound, where: str) -> Iterator[Problem]:
    for path, number in _numbers(value, where):
        if not bound.admits(number):
            yield path, number, str(bound)


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
