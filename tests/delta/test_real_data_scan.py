"""Issue 16, the data side: rows of tables that feedlog did not write, read as deltalake and DuckDB do.

Tables come from deltalake (delta-rs) where it writes the feature, and otherwise from Parquet files
written by pyarrow plus logs written by hand from PROTOCOL.md's examples (deletion vectors, INT96,
void columns, absolute paths, type widening). Each version is read by feedlog, deltalake and DuckDB
and compared order-independently wherever the reference readers agree.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from feedlog.delta import DeltaTable
from feedlog.errors import Corruption, Unsupported

from .conftest import deltalake_read, duckdb_read

T0 = 1_790_000_000_000


def _norm(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return ("NaN",)  # NaN != NaN; rows with one still compare equal
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return ("tz", v.astimezone(dt.UTC).replace(tzinfo=None))
    if isinstance(v, dict):
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    if isinstance(v, list):
        # a map arrives as a list of (key, value) pairs: its order is not data
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return ("map", tuple(sorted((_norm(k), _norm(x)) for k, x in v)))
        return tuple(_norm(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_norm(x) for x in v)
    return v


def canon(table: Any) -> list[tuple[Any, ...]]:
    """Rows as comparable, order-free tuples (NaN equal to NaN, aware datetimes in UTC, maps unordered)."""
    t = pa.table(table)
    out = [tuple(_norm(r[c]) for c in t.column_names) for r in t.to_pylist()]
    return sorted(out, key=repr)


def feedlog_rows(path: Path, version: int | None = None) -> list[tuple[Any, ...]]:
    return canon(DeltaTable.open(path).to_arrow(version))


def assert_all_agree(path: Path, versions: range) -> None:
    for v in versions:
        ours = feedlog_rows(path, v)
        assert ours == canon(deltalake_read(path, v)), f"version {v}: feedlog != deltalake"
        assert ours == canon(duckdb_read(path, v)), f"version {v}: feedlog != DuckDB"


def write_commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [{"commitInfo": {"timestamp": T0 + version, "operation": "WRITE"}}, *actions]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in lines))


def metadata(fields: list[dict[str, Any]], partition_columns: list[str] | None = None, **conf: str) -> dict[str, Any]:
    return {
        "metaData": {
            "id": str(uuid.UUID(int=7)),
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": fields}),
            "partitionColumns": partition_columns or [],
            "configuration": conf,
            "createdTime": T0,
        }
    }


def field(name: str, type_: Any, **meta: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": True, "metadata": meta}


def protocol(reader: list[str] | None = None, writer: list[str] | None = None) -> dict[str, Any]:
    if reader is None and writer is None:
        return {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    return {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": reader or [],
            "writerFeatures": writer or [],
        }
    }


def add(
    path: str, size: int, num_records: int, partition_values: dict[str, str | None] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "add": {
            "path": path,
            "partitionValues": partition_values or {},
            "size": size,
            "modificationTime": T0,
            "dataChange": True,
            "stats": json.dumps({"numRecords": num_records}),
            **extra,
        }
    }


def parquet_file(root: Path, name: str, table: pa.Table, **kw: Any) -> int:
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target, **kw)
    return target.stat().st_size


# --- 1. partition values of every type -------------------------------------------------------------


def test_timestamp_partitions_as_delta_rs_writes_them(tmp_path: Path) -> None:
    """delta-rs writes `2021-09-08 11:11:11.123456` (and year 0001); to_arrow raised ArrowInvalid."""
    data = pa.table(
        {
            "ts": pa.array(
                [dt.datetime(2021, 9, 8, 11, 11, 11, 123456), dt.datetime(1, 1, 1), None], pa.timestamp("us", tz="UTC")
            ),
            "ntz": pa.array(
                [dt.datetime(2021, 9, 8, 11, 11, 11), None, dt.datetime(9999, 12, 31, 23, 59, 59)], pa.timestamp("us")
            ),
            "x": [1, 2, 3],
        }
    )
    write_deltalake(tmp_path, data, partition_by=["ts", "ntz"])
    assert_all_agree(tmp_path, range(1))
    assert sorted(DeltaTable.open(tmp_path).to_arrow().column("x").to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize(
    "raw",
    [
        "2021-09-08 11:11:11",
        "2021-09-08 11:11:11.5",
        "2021-09-08 11:11:11.123456",
        "2021-09-08T11:11:11Z",
        "2021-09-08T11:11:11.123456Z",
        "2021-09-08T13:11:11.123456+02:00",
    ],
)
def test_timestamp_partition_formats_of_the_protocol(tmp_path: Path, raw: str) -> None:
    """Each format of PROTOCOL.md "Partition Value Serialization" names one instant (UTC)."""
    size = parquet_file(tmp_path, "p.parquet", pa.table({"x": pa.array([1, 2], pa.int64())}))
    fields = [field("ts", "timestamp"), field("x", "long")]
    write_commit(tmp_path, 0, [protocol(), metadata(fields, ["ts"]), add("p.parquet", size, 2, {"ts": raw})])
    got = DeltaTable.open(tmp_path).to_arrow().column("ts").to_pylist()
    frac = raw.split(".")[1].rstrip("Z").split("+")[0] if "." in raw else ""
    want = dt.datetime(2021, 9, 8, 11, 11, 11, int(frac.ljust(6, "0")) if frac else 0, tzinfo=dt.UTC)
    assert got == [want, want]
    if "+" not in raw:  # an offset is beyond the protocol (UTC only): DuckDB ignores it, feedlog applies it
        assert canon(DeltaTable.open(tmp_path).to_arrow()) == canon(duckdb_read(tmp_path))


def test_partition_values_of_every_type_as_delta_rs_writes_them(tmp_path: Path) -> None:
    data = pa.table(
        {
            "d": pa.array([dt.date(2020, 1, 2), None, dt.date(1, 1, 1)]),
            "dec": pa.array([decimal.Decimal("1.25"), decimal.Decimal("3.50"), None], pa.decimal128(5, 2)),
            "b": [True, False, None],
            "i8": pa.array([1, -2, None], pa.int8()),
            "f": [1.5, None, -0.25],
            "s": ["a b/c", "x=y", None],
            "x": [1, 2, 3],
        }
    )
    write_deltalake(tmp_path, data, partition_by=["d", "dec", "b", "i8", "f", "s"])
    assert_all_agree(tmp_path, range(1))


def test_empty_partition_value_is_null(tmp_path: Path) -> None:
    """An empty string of any type is null (DuckDB agrees; deltalake returns '' for strings)."""
    size = parquet_file(tmp_path, "p.parquet", pa.table({"x": pa.array([1], pa.int64())}))
    fields = [field("s", "string"), field("d", "date"), field("v", "void"), field("x", "long")]
    write_commit(tmp_path, 0, [protocol(), metadata(fields, ["s", "d"]), add("p.parquet", size, 1, {"s": "", "d": ""})])
    assert DeltaTable.open(tmp_path).to_arrow().to_pylist() == [{"s": None, "d": None, "v": None, "x": 1}]


def test_bad_partition_value_is_corruption_not_arrow_error(tmp_path: Path) -> None:
    size = parquet_file(tmp_path, "p.parquet", pa.table({"x": pa.array([1], pa.int64())}))
    fields = [field("ts", "timestamp"), field("x", "long")]
    write_commit(tmp_path, 0, [protocol(), metadata(fields, ["ts"]), add("p.parquet", size, 1, {"ts": "yesterday"})])
    with pytest.raises(Corruption, match="yesterday"):
        DeltaTable.open(tmp_path).to_arrow()


# --- 6. binary partition values --------------------------------------------------------------------


def test_binary_partitions_round_trip_as_the_protocol_escapes_them(tmp_path: Path) -> None:
    """delta-rs writes each byte as `\\u00XX` (PROTOCOL.md: "a string of escaped binary values"); feedlog
    reads the bytes back. (deltalake and DuckDB return the escape text itself, not the bytes they were
    given: they do not round-trip delta-rs's binary partitions.) delta-spark and delta-kernel-rs write
    UTF-8 text instead (test_real_data_golden): feedlog writes text where the bytes are UTF-8, which
    every reader reads back, and the escapes where they are not."""
    values = [b"\x01\x02", b"\x80\xff", b"a/b c", b"\xc3\xa9", b"\\u0041"]
    data = pa.table({"b": pa.array(values, pa.binary()), "x": [1, 2, 3, 4, 5]})
    write_deltalake(tmp_path / "rs", data, partition_by=["b"])
    ours = DeltaTable.open(tmp_path / "rs").to_arrow()
    pairs = zip(ours.column("b").to_pylist(), ours.column("x").to_pylist(), strict=True)
    assert sorted(pairs) == sorted(zip(values, [1, 2, 3, 4, 5], strict=True))
    escaped = {v: "".join(f"\\u{c:04X}" for c in v).encode() for v in values}
    theirs = canon(deltalake_read(tmp_path / "rs"))
    assert theirs == sorted((escaped[v], x) for v, x in zip(values, [1, 2, 3, 4, 5], strict=True))

    t = DeltaTable.create(tmp_path / "fl", pa.schema([("b", pa.binary()), ("x", pa.int64())]), partition_by=["b"])
    t.append(data)
    written = {a.partition_values["b"] for a in t.snapshot().files()}
    # UTF-8 text as text; invalid UTF-8, and text that reads as escapes, escaped as delta-rs does
    assert written == {"\x01\x02", "\\u0080\\u00FF", "a/b c", "é", "\\u005C\\u0075\\u0030\\u0030\\u0034\\u0031"}
    assert canon(t.to_arrow()) == canon(ours)
    # the reference readers read feedlog's text values as written; only the escaped ones differ
    agreed = [v for v in values if v not in (b"\x80\xff", b"\\u0041")]
    for reader in (deltalake_read, duckdb_read):
        got = dict(canon(reader(tmp_path / "fl")))
        assert {b: got[b] for b in agreed} == {
            b: x for b, x in zip(values, [1, 2, 3, 4, 5], strict=True) if b in agreed
        }


# --- 2. INT96 and nanosecond timestamps --------------------------------------------------------------


def test_int96_and_nanosecond_timestamps_read_as_microseconds(tmp_path: Path) -> None:
    far = [dt.datetime(1, 1, 1, 0, 0, 0, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None]
    s1 = parquet_file(
        tmp_path,
        "int96.parquet",
        pa.table({"ts": pa.array(far, pa.timestamp("us", tz="UTC"))}),
        use_deprecated_int96_timestamps=True,
    )
    assert pq.ParquetFile(tmp_path / "int96.parquet").schema.column(0).physical_type == "INT96"
    ns = pa.array([1_631_099_471_123_456_789, None], pa.timestamp("ns", tz="UTC"))
    s2 = parquet_file(tmp_path, "ns.parquet", pa.table({"ts": ns}), version="2.6")
    fields = [field("ts", "timestamp")]
    write_commit(tmp_path, 0, [protocol(), metadata(fields), add("int96.parquet", s1, 3)])
    write_commit(tmp_path, 1, [add("ns.parquet", s2, 2)])
    got = DeltaTable.open(tmp_path).to_arrow()
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    want = [x.replace(tzinfo=dt.UTC) if x else None for x in far]
    want += [dt.datetime(2021, 9, 8, 11, 11, 11, 123456, tzinfo=dt.UTC), None]
    assert sorted(got.column("ts").to_pylist(), key=repr) == sorted(want, key=repr)
    assert canon(got) == canon(duckdb_read(tmp_path))


# --- 7. void ------------------------------------------------------------------------------------------


def test_void_column_is_a_null_column(tmp_path: Path) -> None:
    size = parquet_file(tmp_path, "p.parquet", pa.table({"x": pa.array([1, 2], pa.int64())}))
    nested = {"type": "struct", "fields": [field("a", "long"), field("nothing", "void")]}
    fields = [field("x", "long"), field("v", "void"), field("st", nested)]
    write_commit(tmp_path, 0, [protocol(), metadata(fields), add("p.parquet", size, 2)])
    t = DeltaTable.open(tmp_path)
    got = t.to_arrow()
    assert got.to_pylist() == [{"x": 1, "v": None, "st": None}, {"x": 2, "v": None, "st": None}]
    assert pa.types.is_null(got.schema.field("v").type)
    t.append(pa.table({"x": pa.array([3], pa.int64())}))  # a void column is not written to the file
    new = [a for a in t.snapshot().files() if a.path != "p.parquet"]
    assert pq.read_schema(tmp_path / new[0].path).names == ["x", "st"]
    assert sorted(t.to_arrow().column("x").to_pylist()) == [1, 2, 3]


# --- 8. absolute paths ----------------------------------------------------------------------------------


def test_absolute_file_uri_paths_of_a_shallow_clone(tmp_path: Path) -> None:
    """A shallow clone's adds name the source table's files by absolute file:// URI, percent-encoded."""
    src = tmp_path / "source dir"
    write_deltalake(src, pa.table({"x": [1, 2], "p": ["a", "b c"]}), partition_by=["p"])
    clone = tmp_path / "clone"
    adds = []
    for a in DeltaTable.open(src).snapshot().files():
        absolute = (src / urllib.parse.unquote(a.path)).as_uri()  # the file's name, as a URI again
        assert "source%20dir" in absolute
        adds.append(add(absolute, a.size, 1, dict(a.partition_values)))
    fields = [field("x", "long"), field("p", "string")]
    write_commit(clone, 0, [protocol(), metadata(fields, ["p"]), *adds])
    assert canon(DeltaTable.open(clone).to_arrow()) == canon(DeltaTable.open(src).to_arrow())
    # deltalake reads it too; DuckDB 1.5.5's delta extension joins the URI onto the table root and fails
    assert feedlog_rows(clone) == canon(deltalake_read(clone))


def test_absolute_paths_in_hadoop_form_and_under_the_tables_own_url(tmp_path: Path) -> None:
    """delta-spark writes Hadoop URIs (`file:/abs/path`, one slash); an absolute URI under the table's
    own object-store location reads through the table's store; one elsewhere on a store is refused."""
    src = tmp_path / "src"
    write_deltalake(src, pa.table({"x": [1, 2, 3]}))
    (a,) = DeltaTable.open(src).snapshot().files()
    hadoop = "file:" + str(src / urllib.parse.unquote(a.path))
    clone = tmp_path / "clone"
    write_commit(clone, 0, [protocol(), metadata([field("x", "long")]), add(hadoop, a.size, 3)])
    assert feedlog_rows(clone) == [(1,), (2,), (3,)]

    url = f"memory://real-data-{uuid.uuid4().hex}"
    t = DeltaTable.create(url, pa.schema([("x", pa.int64())]), in_commit_timestamps=False)
    t.append(pa.table({"x": pa.array([7, 8], pa.int64())}))
    body = (src / urllib.parse.unquote(a.path)).read_bytes()
    assert t.storage.put_if_absent("sub dir/copied.parquet", body)

    def put(version: int, action: dict[str, Any]) -> None:
        lines = [{"commitInfo": {"timestamp": T0, "operation": "WRITE"}}, action]
        text = "".join(json.dumps(c) + "\n" for c in lines)
        assert t.storage.put_if_absent(f"_delta_log/{version:020d}.json", text.encode())

    put(2, add(f"{url}/sub%20dir/copied.parquet", len(body), 3))
    assert sorted(DeltaTable.open(url).to_arrow().column("x").to_pylist()) == [1, 2, 3, 7, 8]
    put(3, add("s3://other-bucket/x.parquet", 1, 1))
    with pytest.raises(Unsupported, match="outside the table"):
        DeltaTable.open(url).to_arrow()
