"""sinkscope.infra.codec: the one JSON codec, its rules, and round trips of every persisted
result kind (the helper the result-writing tests share is ``tests/round_trip.py``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from sinkscope.infra.codec import SchemaError, decode, encode, read_result, write_result


@dataclass(frozen=True)
class Inner:
    value: float
    pair: tuple[int, int]


@dataclass(frozen=True)
class Outer:
    SCHEMA: ClassVar[str] = "outer"
    SCHEMA_VERSION: ClassVar[int] = 1

    name: str
    inner: tuple[Inner, ...]
    optional: float | None
    table: dict[str, float]
    added_later: int = 7
    in_memory: list[int] = field(default_factory=list, metadata={"persist": False})

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")


OUTER = Outer("x", (Inner(math.nan, (1, 2)), Inner(math.inf, (3, 4))), None, {"0.3": -math.inf}, 8, [1])


def test_non_finite_numbers_are_null_and_read_back_as_nan_while_optional_none_stays_none(tmp_path):
    data = encode(OUTER)
    assert data == {
        "name": "x",
        "inner": [{"value": None, "pair": [1, 2]}, {"value": None, "pair": [3, 4]}],
        "optional": None,
        "table": {"0.3": None},
        "added_later": 8,
    }
    write_result(tmp_path / "o.json", OUTER)
    assert json.loads((tmp_path / "o.json").read_text())["schema"] == "outer"  # standard JSON: no NaN literal
    back = read_result(tmp_path / "o.json", Outer)
    assert math.isnan(back.inner[0].value) and back.inner[1].pair == (3, 4) and back.optional is None
    assert math.isnan(back.table["0.3"]) and back.added_later == 8 and back.in_memory == []


def test_missing_keys_take_defaults_and_unknown_or_mistyped_keys_are_refused():
    base = {"name": "x", "inner": [], "optional": 1, "table": {}}
    assert decode(Outer, base).added_later == 7 and decode(Outer, base).optional == 1.0
    with pytest.raises(SchemaError, match=r"Outer has unknown fields \['extra'\]"):
        decode(Outer, {**base, "extra": 1})
    with pytest.raises(SchemaError, match="Outer lacks the field 'table'"):
        decode(Outer, {"name": "x", "inner": [], "optional": None})
    with pytest.raises(SchemaError, match=r"Outer.inner\[0\].pair has 3 items, not 2"):
        decode(Outer, {**base, "inner": [{"value": 1.0, "pair": [1, 2, 3]}]})
    with pytest.raises(SchemaError, match="Outer.added_later is bool True, not int"):
        decode(Outer, {**base, "added_later": True})
    with pytest.raises(SchemaError, match="Outer: name must not be empty"):  # the class's own validation
        decode(Outer, {**base, "name": ""})


def test_schema_versions_and_files_from_before_them(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"schema": "outer", "schema_version": 2, **encode(OUTER)}))
    with pytest.raises(SchemaError, match="outer schema version 2; this sinkscope reads version 1; upgrade sinkscope"):
        read_result(path, Outer)
    path.write_text(json.dumps(encode(OUTER)))  # no version: written before the codec, same layout
    assert encode(read_result(path, Outer)) == encode(OUTER)
    path.write_text(json.dumps({"title": "x"}))
    with pytest.raises(SchemaError, match="predates outer schema version 1.*; rerun it"):
        read_result(path, Outer, "rerun it")
    path.write_text(json.dumps({"schema": "probe", "schema_version": 1}))
    with pytest.raises(SchemaError, match="is a 'probe' file, not 'outer'"):
        read_result(path, Outer)


@dataclass(frozen=True)
class Renamed:
    """Version 3 of a result whose field ``n`` became ``n_heads`` (v1 -> v2) and which
    gained ``note`` (v2 -> v3)."""

    SCHEMA: ClassVar[str] = "renamed"
    SCHEMA_VERSION: ClassVar[int] = 3
    UPGRADES: ClassVar[dict] = {
        1: lambda old: {("n_heads" if key == "n" else key): value for key, value in old.items()},
        2: lambda old: {**old, "note": "upgraded"},
    }
    n_heads: int
    note: str


def test_older_schema_versions_are_upgraded_step_by_step_and_others_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": "renamed", "schema_version": 1, "n": 4}))
    assert read_result(path, Renamed) == Renamed(n_heads=4, note="upgraded")
    path.write_text(json.dumps({"schema": "renamed", "schema_version": 2, "n_heads": 5}))
    assert read_result(path, Renamed) == Renamed(n_heads=5, note="upgraded")
    write_result(path, Renamed(6, "kept"))
    assert json.loads(path.read_text())["schema_version"] == 3 and read_result(path, Renamed) == Renamed(6, "kept")
    path.write_text(json.dumps({"schema": "renamed", "schema_version": 0, "n": 4}))
    with pytest.raises(SchemaError, match="version 0; this sinkscope reads version 1 to 3; regenerate it"):
        read_result(path, Renamed)
    path.write_text(json.dumps({"schema": "renamed", "schema_version": 4, "n_heads": 4}))
    with pytest.raises(SchemaError, match="version 4; this sinkscope reads version 1 to 3; upgrade sinkscope"):
        read_result(path, Renamed)
    path.write_text(json.dumps({"schema": "renamed", "schema_version": 1, "n": 4, "stray": 1}))
    with pytest.raises(SchemaError, match=r"unknown fields \['stray'\]"):  # an upgrade validates like any read
        read_result(path, Renamed)


def test_an_unknown_type_is_a_bug_not_bad_input():
    with pytest.raises(TypeError, match="no JSON form for object"):
        encode(object())


def test_a_version_of_the_wrong_type_and_file_keys_below_the_top_are_refused(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"schema": "outer", "schema_version": "1", **encode(OUTER)}))
    with pytest.raises(SchemaError, match="schema version '1'; this sinkscope reads version 1"):
        read_result(path, Outer)
    nested = encode(OUTER)
    nested["inner"][0]["schema_version"] = 1
    path.write_text(json.dumps({"schema": "outer", "schema_version": 1, **nested}))
    with pytest.raises(SchemaError, match=r"inner\[0\] has unknown fields \['schema_version'\]"):
        read_result(path, Outer)
