"""The check at each public API entry point: an argument of the wrong type is an
``InputError`` naming the argument, not a ``TypeError``/``AttributeError`` from deep inside."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from sinkscope.infra.bounds import SEED, Bound
from sinkscope.infra.errors import InputError

PATH_TYPES: tuple[type, ...] = (str, os.PathLike)


def check_argument(value: Any, expected: type | tuple[type, ...], name: str, what: str) -> None:
    """Raise ``InputError(field=name)`` unless ``value`` is an instance of ``expected``;
    ``what`` says in words what to pass (``"a directory path"``, ``"an AuditConfig"``)."""
    if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
        found = "bool"  # a bool is an int to isinstance, never a count or a path
    elif isinstance(value, expected):
        return
    else:
        found = type(value).__name__
    raise InputError(f"{name} must be {what}, got a {found} ({_shown(value)})", field=name)


def check_path(value: Any, name: str, what: str = "a path (str or pathlib.Path)") -> None:
    """``value`` is a path: a ``str`` or ``os.PathLike`` (not None, not bytes)."""
    check_argument(value, PATH_TYPES, name, what)
    if isinstance(value, str) and not value.strip():
        raise InputError(f"{name} is empty; pass {what}", field=name)


MAX_SEED = SEED.high  # torch's generators take 64 bits; a signed 64-bit range leaves room for offsets


def check_seed(value: int, name: str = "seed") -> None:
    """A random seed torch and ``random`` accept: an integer in [0, 2**63 - 1]; else an
    ``InputError(field=name)``, not torch's "Overflow when unpacking long long"."""
    check_argument(value, int, name, "an integer")
    if not SEED.admits(value):
        raise InputError(
            f"{name} must be {SEED.as_setting(True)}, got {_shown(value)}; pick a seed in that range", field=name
        )


def check_number(value: Any, bound: Bound, name: str, none: bool = False) -> None:
    """A function's integer argument ``name`` within ``bound`` (the declared range of the
    setting it is, ``sinkscope.infra.bounds``), or None where ``none``; else an
    ``InputError(field=name)`` before anything is built from it."""
    if none and value is None:
        return
    check_argument(value, int, name, "an integer" + (" or None" if none else ""))
    if not bound.admits(value):
        raise InputError(f"{name} must be {bound.as_setting(True)}, got {_shown(value)}", field=name)


def refuse_duplicates(values: Iterable[Any], name: str) -> None:
    """Refuse a value listed twice in the list setting ``name`` (a grid axis, a set of
    architectures): it would train the same runs twice into one directory."""
    seen: list[Any] = []
    for value in values:
        if value in seen:
            raise InputError(f"{name} lists {_shown(value)} twice; list each value once", field=name)
        seen.append(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_items(values: Any, expected: type | tuple[type, ...], name: str, what: str) -> list[Any]:
    """``values`` as a list, every item an instance of ``expected``; else ``InputError``
    naming ``name`` and the first bad item's index and type. One string or path is not a
    list of them."""
    if isinstance(values, (str, bytes)):
        one = "string" if isinstance(values, str) else "bytes object"
        raise InputError(f"{name} must be a list of {what}, not one {one} ({_shown(values)})", field=name)
    if isinstance(values, os.PathLike) or not isinstance(values, Iterable):
        raise InputError(
            f"{name} must be a list of {what}, got a {type(values).__name__} ({_shown(values)})", field=name
        )
    items = list(values)
    for index, value in enumerate(items):
        if not isinstance(value, expected):
            raise InputError(
                f"{name}[{index}] must be {_singular(what)}, got a {type(value).__name__} ({_shown(value)})", field=name
            )
    return items


def _singular(what: str) -> str:
    """``"prompt strings"`` -> ``"a prompt string"``, for the message about one item."""
    return "a " + what.removesuffix("s") if what.endswith("s") else what
