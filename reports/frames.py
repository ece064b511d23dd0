"""Results as pandas DataFrames: long format, one row per measured thing (a head, a layer,
a patched site), every metric a column, so results of many models or revisions stack
with ``pandas.concat``. A notebook shows them whole, in a scrolling box
(``sinkscope.reports.result_frame``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas


def row_of(record: Any, **context: Any) -> dict[str, Any]:
    """A dataclass row as a dict, after the ``context`` columns (e.g. ``model=..., layer=...``)."""
    return {**context, **{field.name: getattr(record, field.name) for field in dataclasses.fields(record)}}


def dataframe(rows: Iterable[Mapping[str, Any]]) -> pandas.DataFrame:
    """``rows`` as a DataFrame whose notebook display drops no row or column (pandas is
    imported here, not when sinkscope loads)."""
    from sinkscope.reports.result_frame import ResultFrame

    return ResultFrame.from_records(list(rows))
