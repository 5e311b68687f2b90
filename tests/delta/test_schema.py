import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from feedlog.delta.schema import SchemaMismatch, conform, from_schema_string, to_schema_string
from feedlog.delta.stats import file_stats
from feedlog.errors import InvalidArgument

ALL_TYPES = pa.schema(
    [
        pa.field("b", pa.int8()),
        pa.field("s", pa.int16()),
        pa.field("i", pa.int32(), nullable=False),
        pa.field("l", pa.int64()),
        pa.field("f", pa.float32()),
        pa.field("d", pa.float64()),
        pa.field("flag", pa.bool_()),
        pa.field("str", pa.string()),
        pa.field("bin", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("dec", pa.decimal128(10, 2)),
        pa.field("arr", pa.list_(pa.field("element", pa.int64()))),
        pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int32()))),
        pa.field("st", pa.struct([pa.field("x", pa.int64()), pa.field("y", pa.string())])),
    ]
)


def test_schema_round_trips_through_delta_json():
    text = to_schema_string(ALL_TYPES)
    doc = json.loads(text)
    assert [f["type"] for f in doc["fields"][:12]] == [
        "byte", "short", "integer", "long", "float", "double", "boolean",
        "string", "binary", "date", "timestamp", "decimal(10,2)",
    ]  # fmt: skip
    assert doc["fields"][2]["nullable"] is False
    assert doc["fields"][12]["type"] == {"type": "array", "elementType": "long", "containsNull": True}
    assert from_schema_string(text) == ALL_TYPES


@pytest.mark.parametrize(
    "arrow, message",
    [
        (pa.uint32(), "no Delta equivalent"),
        (pa.timestamp("us"), "timestampNtz"),
        (pa.float16(), "no Delta equivalent"),
    ],
)
def test_types_without_a_delta_equivalent_are_refused(arrow, message):
    with pytest.raises(InvalidArgument, match=message):
        to_schema_string(pa.schema([("c", arrow)]))


def test_case_insensitive_duplicate_columns_are_refused():
    with pytest.raises(InvalidArgument, match="unique regardless of case"):
        to_schema_string(pa.schema([("A", pa.int64()), ("a", pa.int64())]))


def test_conform_casts_representations_fills_missing_and_refuses_mismatches():
    schema = pa.schema([("a", pa.int64(), False), ("t", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
    data = pa.table({"ts": pa.array([1], pa.timestamp("ms", tz="UTC")), "A": [1], "x": [None]}).drop_columns(["x"])
    out = conform(data, schema)
    assert out.schema == schema and out.column("t").null_count == 1
    assert out.column("ts")[0].as_py() == dt.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=dt.UTC)
    with pytest.raises(SchemaMismatch, match="not in the table schema"):
        conform(pa.table({"a": [1], "zzz": [2]}), schema)
    with pytest.raises(SchemaMismatch, match="'a' is string in the data but long"):
        conform(pa.table({"a": ["1"]}), schema)
    with pytest.raises(SchemaMismatch, match="missing non-nullable column 'a'"):
        conform(pa.table({"t": ["x"]}), schema)
    with pytest.raises(SchemaMismatch, match="not nullable but has 1 null"):
        conform(pa.table({"a": pa.array([None], pa.int64())}), schema)
    with pytest.raises(SchemaMismatch, match="'a' is integer in the data but long"):
        conform(pa.table({"a": pa.array([1], pa.int32())}), schema)


def test_stats_bounds_and_null_counts():
    data = pa.table(
        {
            "i": [3, None, -1],
            "d": [1.5, 2.5, None],
            "nan": [1.0, float("nan"), 2.0],
            "s": ["b", "a" * 40, None],
            "long_max": ["a", "z" * 40, "b"],
            "bin": [b"x", b"y", None],
            "flag": [True, False, None],
            "day": [dt.date(2024, 1, 2), dt.date(2023, 5, 6), None],
            "ts": pa.array([1_700_000_000_123_456, 5, None], pa.timestamp("us", tz="UTC")),
            "dec": pa.array([decimal.Decimal("1.10"), None, None], pa.decimal128(5, 2)),
            "st": [{"x": 1, "y": "q"}, None, {"x": 5, "y": None}],
            "allnull": pa.array([None, None, None], pa.int64()),
        }
    )
    s = json.loads(file_stats(data))
    assert s["numRecords"] == 3
    assert s["minValues"]["i"] == -1 and s["maxValues"]["i"] == 3
    assert s["minValues"]["d"] == 1.5 and s["maxValues"]["d"] == 2.5
    assert "nan" not in s["minValues"] and s["nullCount"]["nan"] == 0
    assert s["minValues"]["s"] == "a" * 32 and s["maxValues"]["s"] == "b"  # a prefix is a valid minimum
    assert s["minValues"]["long_max"] == "a" and "long_max" not in s["maxValues"]  # a cut maximum would not be
    assert "bin" not in s["minValues"] and s["nullCount"]["bin"] == 1
    assert "flag" not in s["minValues"] and s["nullCount"]["flag"] == 1
    assert s["minValues"]["day"] == "2023-05-06" and s["maxValues"]["day"] == "2024-01-02"
    assert s["minValues"]["ts"] == "1970-01-01T00:00:00.000Z"
    assert s["maxValues"]["ts"] == "2023-11-14T22:13:20.123Z"  # truncated to ms, per the protocol
    assert s["nullCount"]["dec"] == 2 and "dec" not in s["minValues"]
    assert s["minValues"]["st"] == {"x": 1, "y": "q"} and s["maxValues"]["st"] == {"x": 5, "y": "q"}
    assert s["nullCount"]["st"] == {"x": 1, "y": 2}
    assert s["nullCount"]["allnull"] == 3 and "allnull" not in s["minValues"]
    assert json.loads(file_stats(data, indexed_cols=1))["nullCount"] == {"i": 1}
