"""Type checks for config dataclasses built from Python: ``ToyModelConfig(n_heads="2")``
is an ``InputError`` naming the field, not a ``TypeError`` from deep inside a comparison
or a tensor constructor."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from sinkscope.infra.errors import InputError


def _fits(kind: Any, value: Any) -> bool:
    """Whether ``value`` has the annotated type ``kind`` (containers checked shallowly;
    an int is a float; a bool is neither an int nor a float)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(option, value) for option in args)
    if origin is typing.Literal:
        return value in args
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, kind) if isinstance(kind, type) else True


def _describe(kind: Any) -> str:
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(kind))
    if kind is type(None):
        return "None"
    return getattr(kind, "__name__", str(kind))


def check_field_types(instance: Any) -> None:
    """Raise ``InputError`` (``field`` = the field's name) for the first field of the
    dataclass ``instance`` whose value does not have its annotated type."""
    hints = typing.get_type_hints(type(instance))
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if not _fits(hints[field.name], value):
            raise InputError(
                f"{field.name} must be {_describe(hints[field.name])}, got {value!r} ({type(value).__name__})",
                field=field.name,
            )
