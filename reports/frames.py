"""Results as pandas DataFrames: long format, one row per measured thing (a head, a layer,
a patched site), every metric a column, so results of many models or revisions stack
with ``pandas.concat``. They are plain DataFrames (``assert_frame_equal`` and every pandas
idiom work); a notebook shows them as pandas does. The results' own displays (the
per-layer grids and tables of ``_repr_html_``) show every row and column, in boxes that
scroll."""

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
    """``rows`` as a DataFrame (pandas is imported here, not when sinkscope loads)."""
    import pandas

    return pandas.DataFrame.from_records(list(rows))


def without_unmeasured(frame: pandas.DataFrame, context: Iterable[str] = ()) -> pandas.DataFrame:
    """``frame`` less every column that holds no value at all (a metric measured nowhere,
    e.g. ``anchor_mass_other`` without a split of the queries, or ``sink_class`` without a
    sink head), as the CSV files leave them out; the ``context`` columns (model, revision)
    stay even when empty."""
    kept = set(context)
    empty = [name for name in frame.columns if name not in kept and len(frame) and frame[name].isna().all()]
    return frame.drop(columns=empty)
