"""Per-file statistics (PROTOCOL.md "Per-file Statistics") computed from Arrow. Pure.

`numRecords` always; `nullCount` for every indexed column; `minValues` /
`maxValues` for orderable primitives. Bounds are tight except where the
protocol lets them be cut: strings keep a prefix (a prefix is <= the value, so
the min stays valid; a cut max would not be, so a max is written only when it
fits), timestamps are truncated to milliseconds as the protocol's footnote says.
Floats with NaN and binaries get no bounds: readers would skip wrongly.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Delta's default `delta.dataSkippingNumIndexedCols`
DEFAULT_INDEXED_COLS = 32
STRING_PREFIX = 32


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        # timestamp_ntz has no zone (as delta-spark's JSON of TimestampNTZ); years < 1000 keep 4 digits
        zone = "" if value.tzinfo is None else "Z"
        v = value if value.tzinfo is None else value.astimezone(dt.UTC)
        return (
            f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}."
            f"{v.microsecond // 1000:03d}{zone}"
        )
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _bounds(col: pa.ChunkedArray) -> tuple[Any, Any] | None:
    t = col.type
    orderable = (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )
    if not orderable or col.null_count == len(col):
        return None
    if pa.types.is_floating(t) and pc.any(pc.is_nan(col)).as_py():
        return None
    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if isinstance(lo, float) and (math.isinf(lo) or math.isinf(hi)):
        return None
    if isinstance(lo, str):
        lo = lo[:STRING_PREFIX]
        if len(hi) > STRING_PREFIX:
            hi = None
    return _jsonable(lo), _jsonable(hi) if hi is not None else None


def _collect(
    col: pa.ChunkedArray, name: str, mins: dict[str, Any], maxs: dict[str, Any], nulls: dict[str, Any]
) -> None:
    if pa.types.is_struct(col.type):
        sub_min: dict[str, Any] = {}
        sub_max: dict[str, Any] = {}
        sub_null: dict[str, Any] = {}
        # flatten() folds the parent's nulls into each child
        children = [chunk.flatten() for chunk in col.chunks]
        for i in range(col.type.num_fields):
            field = col.type.field(i)
            child = pa.chunked_array([ch[i] for ch in children], type=field.type)
            _collect(child, field.name, sub_min, sub_max, sub_null)
        for target, sub in ((mins, sub_min), (maxs, sub_max), (nulls, sub_null)):
            if sub:
                target[name] = sub
        return
    nulls[name] = col.null_count
    b = _bounds(col)
    if b is not None:
        mins[name] = b[0]
        if b[1] is not None:
            maxs[name] = b[1]


def file_stats(data: pa.Table, indexed_cols: int = DEFAULT_INDEXED_COLS) -> str:
    """The `stats` JSON string of an `add` action for a file holding `data`."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    names = data.column_names if indexed_cols < 0 else data.column_names[:indexed_cols]
    for name in names:
        _collect(data.column(name), name, mins, maxs, nulls)
    doc = {"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
