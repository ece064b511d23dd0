"""One JSON codec for every persisted result and config: dataclasses in, standard JSON out.

A persisted class is a dataclass with two class variables, ``SCHEMA`` (the kind of file,
e.g. ``"audit"``) and ``SCHEMA_VERSION``; ``write_result(path, obj)`` writes
``{"schema": ..., "schema_version": ..., <fields>}`` atomically and
``read_result(path, cls)`` reads it back into the same class; ``encode(obj)`` and
``decode(cls, data)`` apply the same rules without a file. The rules, in one place:

- NaN and infinities are written as ``null``; a ``null`` read into a ``float`` field is
  NaN (``float | None`` fields keep ``None``), so every file is standard JSON;
- nested dataclasses, tuples, lists and ``dict[str, X]`` round-trip by the field's type;
- unknown keys are refused by name, a missing key takes the field's default or is refused;
- a field with ``metadata={"persist": False}`` (in-memory only, e.g. arrays drawn as
  figures) is not written and reads back as its default;
- every value is checked against the class's declared ranges and consistency
  (``sinkscope.infra.bounds``: ``BOUNDS`` and ``inconsistencies``) once it is decoded,
  so an impossible value (a layer beyond n_layers, a mass of 1e308, a count of -4) is
  refused in one line naming the file, the field and what is allowed;
- a nested class may declare ``RENAMED`` (``{old field name: new}``): a field renamed there
  reads under its old name in every file that nests the class, with no version step in
  each of them;
- a file of an older schema version is upgraded step by step through the class's
  ``UPGRADES`` (``{v: fields of version v -> fields of version v + 1}``) where it has them,
  and refused in one line naming the versions otherwise; a file without a version
  predates the codec and is read if its layout still matches.

Adding a field to a result is one line in its dataclass (with a default, so that older
files still read).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, Union

from sinkscope.infra.arguments import check_path
from sinkscope.infra.atomic_io import atomic_write_json, read_json
from sinkscope.infra.bounds import MAX_INT, bound_problems
from sinkscope.infra.errors import InputError

SCHEMA_KEY = "schema"
VERSION_KEY = "schema_version"
_FILE_KEYS = {SCHEMA_KEY, VERSION_KEY}  # a file's own keys, beside its top-level object's fields
T = TypeVar("T")
# one step of a persisted class's UPGRADES: version v's fields -> version v + 1's
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


class Persisted(Protocol):
    """A dataclass written by ``write_result``."""

    SCHEMA: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int]
    __dataclass_fields__: ClassVar[dict[str, Any]]


class SchemaError(InputError):
    """A JSON file whose content does not fit the class it is read into."""


def persisted_fields(cls: type) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(cls) if field.metadata.get("persist", True)]


def encode(value: Any) -> Any:
    """``value`` as standard JSON data: dataclasses as objects of their persisted fields,
    tuples as lists, non-finite floats as None, paths as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: encode(getattr(value, field.name)) for field in persisted_fields(type(value))}
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy or torch scalar
        return encode(value.item())
    raise TypeError(f"no JSON form for {type(value).__name__}")


def decode(cls: type[T], data: Any, where: str = "") -> T:
    """``data`` (from ``encode``) read into ``cls``; ``where`` names the place in errors
    (a field path, e.g. ``"config"``; default: the class name)."""
    return _decode(cls, data, where or cls.__name__)


def _decode(kind: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if dataclasses.is_dataclass(kind):
        return _decode_dataclass(kind, data, where)  # type: ignore[arg-type]
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [option for option in args if option is not type(None)]
        if len(options) == 1:
            return _decode(options[0], data, where)
        for option in options:  # e.g. int | str: the first that fits
            try:
                return _decode(option, data, where)
            except SchemaError:
                continue
        raise SchemaError(f"{_at(where)} is {_describe(data)}, not one of {[_name(option) for option in options]}")
    if origin is typing.Literal:
        if data in args:
            return data
        raise SchemaError(f"{_at(where)} is {data!r}, not one of {list(args)}")
    if kind is float:
        if data is None:
            return math.nan
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(_finite(data, where))
    elif kind is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return _finite(data, where)
    elif kind in (str, bool):
        if isinstance(data, kind):
            return data
    elif origin in (tuple, list):
        return _decode_sequence(kind, data, where)
    elif origin is dict:
        if isinstance(data, dict):
            return {str(key): _decode(args[1], item, f"{where}[{key!r}]") for key, item in data.items()}
    else:
        raise TypeError(f"the codec cannot read type {kind!r} (at {where})")
    raise SchemaError(f"{_at(where)} is {_describe(data)}, not {_name(kind)}")


def _finite(number: int | float, where: str) -> int | float:
    """``number``, once it is a finite number and, if an integer, one that fits in 64 bits."""
    if isinstance(number, int) and abs(number) > MAX_INT:
        raise SchemaError(f"{_at(where)} is an integer of {len(str(abs(number)))} digits; allowed: at most 2**63 - 1")
    if isinstance(number, float) and math.isinf(number):
        raise SchemaError(f"{_at(where)} is {number}; allowed: a finite number (or null where undefined)")
    return number


def _decode_sequence(kind: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if not isinstance(data, list):
        raise SchemaError(f"{_at(where)} is {_describe(data)}, not a list")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(data) != len(args):
            raise SchemaError(f"{_at(where)} has {len(data)} items, not {len(args)}")
        return tuple(_decode(arg, item, f"{where}[{i}]") for i, (arg, item) in enumerate(zip(args, data)))
    items = [_decode(args[0] if args else Any, item, f"{where}[{i}]") for i, item in enumerate(data)]
    return tuple(items) if origin is tuple else items


def _decode_dataclass(cls: type, data: Any, where: str, top_level: bool = False) -> Any:
    if not isinstance(data, dict):
        raise SchemaError(f"{_at(where)} is {_describe(data)}, not an object")
    fields = {field.name: field for field in persisted_fields(cls)}
    renamed: dict[str, str] = getattr(cls, "RENAMED", {})
    if renamed and not renamed.keys().isdisjoint(data):
        data = {renamed.get(key, key): value for key, value in data.items()}
    unknown = sorted(set(data) - set(fields) - (_FILE_KEYS if top_level else set()))
    if unknown:
        raise SchemaError(f"{_at(where)} has unknown fields {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _decode(hints[name], data[name], f"{where}.{name}" if where else name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{_at(where)} lacks the field {name!r}")
    try:
        decoded = cls(**values)
    except ValueError as error:  # the class's own validation (InputError), e.g. a count out of range
        raise SchemaError(f"{_at(where)}: {error}", field=getattr(error, "field", None)) from error
    _check_values(decoded, where)
    return decoded


def _check_values(decoded: Any, where: str) -> None:
    """The first value of ``decoded`` outside its class's ``BOUNDS`` or ``inconsistencies``, as one error."""
    consistency = getattr(decoded, "inconsistencies", None)
    problems = itertools.chain(bound_problems(decoded), consistency() if consistency is not None else ())
    for path, value, allowed in problems:
        shown = value if isinstance(value, str) else _short(repr(value))
        raise SchemaError(f"{where + '.' if where else ''}{path} is {shown}; allowed: {allowed}")


def _at(where: str) -> str:
    """A field's dotted path as a message subject; the empty path is the whole object."""
    return where or "the top level"


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _describe(data: Any) -> str:
    return f"{type(data).__name__} {_short(repr(data))}"


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _check_persisted(cls: object, message: str, argument: str) -> None:
    """A class ``write_result``/``read_result`` can handle: a dataclass with a ``SCHEMA``."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and hasattr(cls, "SCHEMA")):
        raise InputError(f"{message}; pass a result dataclass such as AuditResult", field=argument)


def write_result(path: str | os.PathLike, result: Persisted) -> None:
    """Write ``result`` to ``path`` atomically, with its schema name and version first."""
    check_path(path, "path")
    _check_persisted(type(result), f"result must be a sinkscope result, got a {type(result).__name__}", "result")
    cls = type(result)
    atomic_write_json(path, {SCHEMA_KEY: cls.SCHEMA, VERSION_KEY: cls.SCHEMA_VERSION, **encode(result)})


def read_result(path: str | os.PathLike, cls: type[T], remedy: str = "") -> T:
    """Read ``path`` (written by ``write_result``) into ``cls``. ``remedy`` ends the
    message of a refused file (e.g. "regenerate it with sinkscope audit").

    A file of an older schema version is read when ``cls.UPGRADES`` holds every step from
    its version to the current one (``UPGRADES[v]`` turns version v's fields into version
    v + 1's), so result directories written by earlier releases keep working."""
    check_path(path, "path")
    _check_persisted(cls, f"cls must be a sinkscope result class, got {cls!r}", "cls")
    path = Path(path)
    data = read_json(path)
    suffix = f"; {remedy}" if remedy else ""
    if not isinstance(data, dict):
        raise SchemaError(f"{path} is not a {cls.SCHEMA} file (it holds {_describe(data)}, not a JSON object){suffix}")  # type: ignore[attr-defined]
    schema, version = data.get(SCHEMA_KEY, cls.SCHEMA), data.get(VERSION_KEY)  # type: ignore[attr-defined]
    if schema != cls.SCHEMA:  # type: ignore[attr-defined]
        raise SchemaError(f"{path} is a {schema!r} file, not {cls.SCHEMA!r}{suffix}")  # type: ignore[attr-defined]
    if version is not None:
        data = _upgraded(path, cls, data, version, remedy)
    try:
        return _decode_dataclass(cls, data, "", top_level=True)
    except SchemaError as error:
        if version is None:  # written before files carried a schema version, in another layout
            raise SchemaError(
                f"{path} predates {cls.SCHEMA} schema version {cls.SCHEMA_VERSION} (it has no schema_version) "  # type: ignore[attr-defined]
                f"and does not match it: {error}{suffix}"
            ) from error
        raise SchemaError(f"{path}: {error}{suffix}", field=error.field) from error


def _upgraded(path: Path, cls: type, data: dict[str, Any], version: Any, remedy: str) -> dict[str, Any]:
    """``data`` of schema ``version`` brought to ``cls.SCHEMA_VERSION`` through
    ``cls.UPGRADES``, or one ``SchemaError`` naming both versions."""
    current = cls.SCHEMA_VERSION  # type: ignore[attr-defined]
    upgrades: Mapping[int, Upgrade] = getattr(cls, "UPGRADES", {})
    readable = type(version) is int and version <= current and all(v in upgrades for v in range(version, current))
    if not readable:
        newer = type(version) is int and version > current
        raise SchemaError(
            f"{path} has {cls.SCHEMA} schema version {version!r}; this sinkscope reads version "  # type: ignore[attr-defined]
            f"{_readable_versions(current, upgrades)}; "
            + ("upgrade sinkscope" if newer else (remedy or "regenerate it"))
        )
    for step in range(version, current):
        data = {**upgrades[step]({key: value for key, value in data.items() if key not in _FILE_KEYS})}
    return data


def _readable_versions(current: int, upgrades: Mapping[int, Upgrade]) -> str:
    oldest = current
    while oldest - 1 in upgrades:
        oldest -= 1
    return str(current) if oldest == current else f"{oldest} to {current}"
