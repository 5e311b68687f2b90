"""Column mapping, type widening and timestampNtz (issue 16): tables deltalake writes (name and id
mapping, nested fields, partitions by physical name, timestampNtz), and logs written by hand from
PROTOCOL.md where it writes none (a rename, field-id resolution, a widened column)."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from feedlog.delta import DeltaTable
from feedlog.errors import Unsupported

from .conftest import deltalake_read, duckdb_read
from .test_real_data_scan import (
    add,
    assert_all_agree,
    canon,
    feedlog_rows,
    field,
    metadata,
    parquet_file,
    protocol,
    write_commit,
)

NESTED = pa.table(
    {
        "id": pa.array([1, 2, 3], pa.int64()),
        "st": [{"a": 1, "b": "x"}, None, {"a": 3, "b": None}],
        "arr": [[{"q": 1}], [], None],
        "mp": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        "p": ["u", "v", None],
    }
)


def drop(table: Any, column: str) -> pa.Table:
    return pa.table(table).drop_columns([column])


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_as_delta_rs_writes_it(tmp_path: Path, mode: str) -> None:
    write_deltalake(tmp_path, NESTED, partition_by=["p"], configuration={"delta.columnMapping.mode": mode})
    write_deltalake(tmp_path, NESTED, mode="append")
    log = (tmp_path / "_delta_log" / f"{0:020d}.json").read_text()
    assert '"minReaderVersion":2' in log and "col-" in log  # physical names, partition values keyed by them
    for v in range(2):
        ours = feedlog_rows(tmp_path, v)
        assert ours == canon(deltalake_read(tmp_path, v))
        # DuckDB 1.5.5 returns null for a partition column of a column-mapped table; the rest agrees
        assert canon(drop(DeltaTable.open(tmp_path).to_arrow(v), "p")) == canon(drop(duckdb_read(tmp_path, v), "p"))
    assert sorted(DeltaTable.open(tmp_path).to_arrow().column("p").to_pylist(), key=repr) == sorted(
        ["u", "v", None] * 2, key=repr
    )


def test_a_renamed_column_reads_by_its_physical_name(tmp_path: Path) -> None:
    write_deltalake(tmp_path, NESTED.drop_columns(["p"]), configuration={"delta.columnMapping.mode": "name"})
    meta = next(
        json.loads(line)["metaData"]
        for line in (tmp_path / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
        if "metaData" in line
    )
    schema = json.loads(meta["schemaString"])
    schema["fields"][0]["name"] = "renamed"  # RENAME COLUMN id TO renamed: the physical name stays
    schema["fields"][1]["type"]["fields"][1]["name"] = "b2"  # and a nested one
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "arr"]  # DROP COLUMN arr
    write_commit(tmp_path, 1, [{"metaData": {**meta, "schemaString": json.dumps(schema)}}])
    got = DeltaTable.open(tmp_path).to_arrow()
    assert got.column_names == ["renamed", "st", "mp"]
    assert sorted(got.column("renamed").to_pylist()) == [1, 2, 3]
    assert {"a": 1, "b2": "x"} in got.column("st").to_pylist()
    assert_all_agree(tmp_path, range(2))


def test_id_mapping_resolves_columns_by_parquet_field_id(tmp_path: Path) -> None:
    """In `id` mode the file's column names do not matter, its field ids do (PROTOCOL.md "Reader
    Requirements for Column Mapping"). deltalake 1.6.6 and DuckDB 1.5.5 match by physical name even in
    `id` mode and return nulls for this file: they are not the reference here, the protocol is."""
    schema = pa.schema(
        [
            pa.field("whatever", pa.int64(), metadata={"PARQUET:field_id": "1"}),
            pa.field("other_name", pa.string(), metadata={"PARQUET:field_id": "2"}),
        ]
    )
    size = parquet_file(tmp_path, "f.parquet", pa.table({"whatever": [1, 2], "other_name": ["a", "b"]}, schema=schema))
    assert pq.read_schema(tmp_path / "f.parquet").field(0).metadata[b"PARQUET:field_id"] == b"1"
    fields = [
        field("x", "long", **{"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-x"}),
        field("s", "string", **{"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-s"}),
        field("gone", "long", **{"delta.columnMapping.id": 3, "delta.columnMapping.physicalName": "col-g"}),
    ]
    fields[0]["type"], fields[1]["type"] = "string", "long"  # id 2 is the string column, id 1 the long
    proto = {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}
    conf = {"delta.columnMapping.mode": "id", "delta.columnMapping.maxColumnId": "3"}
    write_commit(tmp_path, 0, [proto, metadata(fields, None, **conf), add("f.parquet", size, 2)])
    got = DeltaTable.open(tmp_path).to_arrow().to_pylist()
    assert got == [{"x": "a", "s": 1, "gone": None}, {"x": "b", "s": 2, "gone": None}]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_appends_to_a_column_mapped_table_write_physical_names(tmp_path: Path, mode: str) -> None:
    """PROTOCOL.md "Writer Requirements for Column Mapping": files by physical name with field ids,
    partition values and stats by physical name; delta-rs and feedlog append in turn."""
    write_deltalake(tmp_path, NESTED, partition_by=["p"], configuration={"delta.columnMapping.mode": mode})
    # the table-features form of the protocol (3, 7), as delta-spark writes it for new tables
    write_commit(tmp_path, 1, [protocol(["columnMapping"], ["columnMapping"])])
    t = DeltaTable.open(tmp_path)
    t.append(NESTED.slice(0, 2))
    write_deltalake(tmp_path, NESTED.slice(2), mode="append")
    t.append(NESTED.slice(1))
    snap = t.snapshot()
    physical = {f.name: f.metadata[b"delta.columnMapping.physicalName"].decode() for f in snap.schema}
    ours = [a for a in snap.files() if "part-00000-" in a.path and len(a.path.split("/")[0]) > 2]
    assert ours
    for a in ours:
        assert set(a.partition_values) == {physical["p"]}
        assert set(json.loads(a.stats or "{}")["nullCount"]) <= {physical[n] for n in ("id", "st", "arr", "mp")}
        file_schema = pq.read_schema(tmp_path / urllib.parse.unquote(a.path))
        assert file_schema.names == [physical[n] for n in ("id", "st", "arr", "mp")]
        assert file_schema.field(0).metadata[b"PARQUET:field_id"] == b"1"
    for v in range(5):
        assert feedlog_rows(tmp_path, v) == canon(deltalake_read(tmp_path, v)), v
        assert canon(drop(DeltaTable.open(tmp_path).to_arrow(v), "p")) == canon(drop(duckdb_read(tmp_path, v), "p"))
    assert len(DeltaTable.open(tmp_path).to_arrow()) == 3 + 2 + 1 + 2
    assert t.checkpoint() == 4  # maintenance is allowed too; the checkpoint reads alike
    assert feedlog_rows(tmp_path) == canon(deltalake_read(tmp_path))
    assert canon(drop(DeltaTable.open(tmp_path).to_arrow(), "p")) == canon(drop(duckdb_read(tmp_path), "p"))


def test_column_mapping_property_without_the_feature_is_ignored(tmp_path: Path) -> None:
    """The mode counts only where the protocol supports column mapping: files keep display names."""
    size = parquet_file(tmp_path, "f.parquet", pa.table({"x": pa.array([1], pa.int64())}))
    fields = [field("x", "long", **{"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-x"})]
    write_commit(tmp_path, 0, [protocol(), metadata(fields, None, **{"delta.columnMapping.mode": "name"}),
                               add("f.parquet", size, 1)])  # fmt: skip
    t = DeltaTable.open(tmp_path)
    t.append(pa.table({"x": pa.array([2], pa.int64())}))
    assert sorted(t.to_arrow().column("x").to_pylist()) == [1, 2]
    for v in range(2):  # DuckDB refuses a physicalName annotation without column mapping
        assert feedlog_rows(tmp_path, v) == canon(deltalake_read(tmp_path, v))


def test_type_widening_reads_old_files_with_the_current_type(tmp_path: Path) -> None:
    """typeWidening: int -> long, float -> double, date -> timestamp_ntz, decimal(5,2) -> decimal(10,2)."""
    import decimal

    old = pa.table(
        {
            "i": pa.array([1, -2], pa.int32()),
            "f": pa.array([1.5, None], pa.float32()),
            "d": pa.array([dt.date(2020, 1, 2), None]),
            "dec": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(5, 2)),
            "b": pa.array([1, 2], pa.int8()),
        }
    )
    s0 = parquet_file(tmp_path, "old.parquet", old)
    narrow = [field("i", "integer"), field("f", "float"), field("d", "date"), field("dec", "decimal(5,2)"),
              field("b", "byte")]  # fmt: skip
    features = ["typeWidening", "timestampNtz"]
    write_commit(tmp_path, 0, [protocol(features, features), metadata(narrow), add("old.parquet", s0, 2)])

    def changed(f: dict[str, Any], to: str) -> dict[str, Any]:
        change = {"fromType": f["type"], "toType": to}
        return {**f, "type": to, "metadata": {"delta.typeChanges": [change]}}

    wide = [changed(narrow[0], "long"), changed(narrow[1], "double"), changed(narrow[2], "timestamp_ntz"),
            changed(narrow[3], "decimal(10,2)"), changed(narrow[4], "integer")]  # fmt: skip
    new = pa.table(
        {
            "i": pa.array([2**40], pa.int64()),
            "f": pa.array([0.1], pa.float64()),
            "d": pa.array([dt.datetime(2021, 1, 1, 12)], pa.timestamp("us")),
            "dec": pa.array([decimal.Decimal("12345678.90")], pa.decimal128(10, 2)),
            "b": pa.array([100_000], pa.int32()),
        }
    )
    s1 = parquet_file(tmp_path, "new.parquet", new)
    write_commit(tmp_path, 1, [metadata(wide), add("new.parquet", s1, 1)])
    got = DeltaTable.open(tmp_path).to_arrow()
    assert got.schema.field("i").type == pa.int64() and got.schema.field("d").type == pa.timestamp("us")
    assert sorted(got.column("i").to_pylist()) == [-2, 1, 2**40]
    assert dt.datetime(2020, 1, 2) in got.column("d").to_pylist()
    assert feedlog_rows(tmp_path, 0) == canon(duckdb_read(tmp_path, 0))
    for v in range(2):  # deltalake 1.6.6 refuses typeWidening; DuckDB reads it
        assert feedlog_rows(tmp_path, v) == canon(duckdb_read(tmp_path, v)), v


def test_timestamp_ntz_columns(tmp_path: Path) -> None:
    data = pa.table(
        {
            "ntz": pa.array([dt.datetime(2021, 9, 8, 11, 11, 11, 5), None, dt.datetime(1, 1, 1)], pa.timestamp("us")),
            "ts": pa.array([dt.datetime(2021, 1, 1), None, None], pa.timestamp("us", tz="UTC")),
        }
    )
    write_deltalake(tmp_path, data)
    got = DeltaTable.open(tmp_path).to_arrow()
    assert got.schema.field("ntz").type == pa.timestamp("us")  # no time zone
    assert got.column("ntz").to_pylist()[0] == dt.datetime(2021, 9, 8, 11, 11, 11, 5)
    assert_all_agree(tmp_path, range(1))


def test_appends_to_a_timestamp_ntz_table_and_their_stats(tmp_path: Path) -> None:
    """feedlog appends naive timestamps to a delta-rs timestampNtz table (partitioned by one, too):
    partition values in the protocol's zone-less form, stats without a zone, 4-digit years; filters
    that deltalake and DuckDB answer from those stats find the rows."""

    def rows(n: list[dt.datetime | None], t: list[dt.datetime | None], pn: list[dt.datetime | None]) -> pa.Table:
        utc = [None if x is None else x.replace(tzinfo=dt.UTC) for x in t]
        return pa.table({"n": pa.array(n, pa.timestamp("us")), "t": pa.array(utc, pa.timestamp("us", tz="UTC")),
                         "pn": pa.array(pn, pa.timestamp("us"))})  # fmt: skip

    d = dt.datetime
    write_deltalake(tmp_path, rows([d(2021, 9, 8, 11, 11, 11, 123456)], [d(2021, 1, 1)], [d(2020, 1, 1, 1, 2, 3)]),
                    partition_by=["pn"])  # fmt: skip
    t = DeltaTable.open(tmp_path)
    t.append(rows([d(1, 1, 1, 0, 0, 0, 5), d(9999, 12, 31, 23, 59, 59)], [d(1, 1, 1), None],
                  [d(1, 2, 3, 4, 5, 6, 7), None]))  # fmt: skip
    t.append(rows([d(2200, 1, 1, 0, 0, 0, 500000)], [d(2200, 1, 1)], [d(2020, 1, 1, 1, 2, 3)]))
    (ours,) = [a for a in t.snapshot().files() if "0001" in str(a.partition_values)]
    assert ours.partition_values == {"pn": "0001-02-03 04:05:06.000007"}
    stats = json.loads(ours.stats or "{}")
    assert stats["minValues"] == {"n": "0001-01-01T00:00:00.000", "t": "0001-01-01T00:00:00.000Z"}
    assert_all_agree(tmp_path, range(3))
    import deltalake

    from . import conftest  # its DuckDB connection, loaded by duckdb_read above

    for where in ("n = TIMESTAMP '2200-01-01 00:00:00.5'", "t >= TIMESTAMP '2199-12-31 00:00:00+00'",
                  "n > TIMESTAMP '2150-01-01 00:00:00' and pn = TIMESTAMP '2020-01-01 01:02:03'"):  # fmt: skip
        sql = f"select count(*) as c from t where {where}"
        rs = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(tmp_path))).execute(sql).read_all()
        assert pa.table(rs).column("c").to_pylist() == [1], where
        duck = conftest._duck.sql(f"select count(*) as c from delta_scan('{tmp_path}') where {where}").fetchall()
        assert duck == [(1,)], where


@pytest.mark.parametrize(
    "change, ok",
    [(("byte", "long"), True), (("integer", "double"), True), (("date", "timestamp_ntz"), True),
     (("decimal(5,2)", "decimal(10,4)"), True), (("long", "decimal(20,0)"), True), (("integer", "decimal(12,2)"), True),
     (("long", "integer"), False), (("double", "float"), False), (("decimal(5,2)", "decimal(6,4)"), False),
     (("long", "decimal(19,0)"), False), (("string", "long"), False), (("long", "double"), False)],
)  # fmt: skip
def test_type_changes_outside_the_protocol_refuse_reading(tmp_path: Path, change: tuple[str, str], ok: bool) -> None:
    size = parquet_file(tmp_path, "f.parquet", pa.table({"c": pa.array([], pa.int64())}))
    meta = {"delta.typeChanges": [{"fromType": change[0], "toType": change[1]}]}
    fields = [{"name": "c", "type": change[1], "nullable": True, "metadata": meta}]
    features = ["typeWidening", "timestampNtz"]
    write_commit(tmp_path, 0, [protocol(features, features), metadata(fields), add("f.parquet", size, 0)])
    t = DeltaTable.open(tmp_path)
    if ok:
        assert t.to_arrow().num_rows == 0
    else:
        with pytest.raises(Unsupported, match=r"reading refused: column 'c' had type change"):
            t.to_arrow()


def test_appends_to_a_widened_table(tmp_path: Path) -> None:
    """Appends write the current type and keep delta.typeChanges (feedlog changes no type)."""
    s0 = parquet_file(tmp_path, "old.parquet", pa.table({"i": pa.array([1], pa.int32())}))
    wide = [{"name": "i", "type": "long", "nullable": True,
             "metadata": {"delta.typeChanges": [{"fromType": "integer", "toType": "long"}]}}]  # fmt: skip
    features = ["typeWidening"]
    write_commit(tmp_path, 0, [protocol(features, features), metadata(wide), add("old.parquet", s0, 1)])
    t = DeltaTable.open(tmp_path)
    t.append(pa.table({"i": pa.array([2**40], pa.int64())}))
    t.set_properties({"x.note": "kept"})
    assert sorted(t.to_arrow().column("i").to_pylist()) == [1, 2**40]
    schema = json.loads(t.snapshot().metadata.schema_string)
    assert schema["fields"][0]["metadata"]["delta.typeChanges"] == [{"fromType": "integer", "toType": "long"}]
    for v in range(3):
        assert feedlog_rows(tmp_path, v) == canon(duckdb_read(tmp_path, v)), v


def test_variant_columns_read_as_their_two_binaries(tmp_path: Path) -> None:
    """variantType (unshredded): the struct of `metadata` and `value` binaries, as deltalake exposes
    it (DuckDB 1.5.5 cannot return a VARIANT to Arrow). Writing such a table is refused."""
    variant = pa.struct([pa.field("value", pa.binary(), False), pa.field("metadata", pa.binary(), False)])
    # Parquet Variant encoding: metadata v1 with an empty dictionary; value int8 5, and a short string "hi"
    v = pa.array([{"value": b"\x0c\x05", "metadata": b"\x01\x00\x00"}, None,
                  {"value": b"\x09hi", "metadata": b"\x01\x00\x00"}], variant)  # fmt: skip
    size = parquet_file(tmp_path, "f.parquet", pa.table({"x": [1, 2, 3], "v": v}))
    features = ["variantType"]
    fields = [field("x", "long"), field("v", "variant")]
    write_commit(tmp_path, 0, [protocol(features, features), metadata(fields), add("f.parquet", size, 3)])
    t = DeltaTable.open(tmp_path)
    got = t.to_arrow()
    assert got.column("v").to_pylist()[0] == {"metadata": b"\x01\x00\x00", "value": b"\x0c\x05"}
    assert feedlog_rows(tmp_path) == canon(deltalake_read(tmp_path))
    with pytest.raises(Unsupported, match=r"writing refused.*variantType"):
        t.append(got)


def test_a_delta_rs_deletion_vector_table_lists_variant_type_and_reads(tmp_path: Path) -> None:
    """deltalake 1.6.6 creates a table with delta.enableDeletionVectors as reader features
    [variantType, deletionVectors] (and rewrites files on delete): feedlog reads it."""
    write_deltalake(tmp_path, pa.table({"x": list(range(10))}), configuration={"delta.enableDeletionVectors": "true"})
    deltalake.DeltaTable(str(tmp_path)).delete("x > 7")
    assert "variantType" in (tmp_path / "_delta_log" / f"{0:020d}.json").read_text()
    assert_all_agree(tmp_path, range(2))
    assert sorted(DeltaTable.open(tmp_path).to_arrow().column("x").to_pylist()) == list(range(8))
