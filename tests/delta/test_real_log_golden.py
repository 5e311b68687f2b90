"""Real logs written by Databricks and delta-spark (tests/delta/golden/real/log/README.md), read at every
version by feedlog, deltalake and DuckDB.

The logs are verbatim; their Parquet files are not in the index, so `materialize` builds them from
what the log says: each data file with the table's schema, the `numRecords` of its stats and values
inside its min/max, each file and sidecar padded to exactly the size its action records (kernels
read by that size). The rows are therefore ours, the log is theirs: what is tested is reading the log.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta import checkpoint as cp
from feedlog.delta.log import list_log
from feedlog.delta.replay import check_writable
from feedlog.errors import Corruption, Unsupported

from .test_real_log_items import GOLDEN, LOG, assert_like_references

_TYPES = {
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "string": pa.string(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def parquet_of_size(table: pa.Table, size: int) -> bytes:
    """`table` as Parquet of exactly `size` bytes, padded in the footer's key-value metadata."""
    pad = 0
    for _ in range(64):
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, table.schema, store_schema=False) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({"pad": "x" * pad})
        data = bytes(sink.getvalue())
        if len(data) == size:
            return data
        if len(data) > size and pad == 0:
            raise AssertionError(f"{table.num_rows} rows need more than {size} bytes")
        pad = max(0, pad + size - len(data))
    raise AssertionError(f"cannot pad a file to {size} bytes")


def _value(typ: pa.DataType, lo: Any, hi: Any, i: int, n: int) -> Any:
    if pa.types.is_integer(typ):
        return min(int(lo) + i, int(hi))
    if pa.types.is_timestamp(typ):
        return dt.datetime.fromisoformat(str(lo).replace("Z", "+00:00"))
    if pa.types.is_string(typ):
        return hi if i == n - 1 else lo
    return lo


def _actions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def materialize(name: str, tmp_path: Path) -> Path:
    """A copy of golden table `name` with the data files and V2 sidecars its log names."""
    root = tmp_path / name
    shutil.copytree(GOLDEN / name, root)
    log = root / LOG
    commits = sorted(p for p in log.iterdir() if p.name.endswith(".json") and ".checkpoint." not in p.name)
    schema: pa.Schema | None = None
    partitions: list[str] = []
    live: dict[str, dict[str, Any]] = {}
    live_at: dict[int, list[dict[str, Any]]] = {}
    for path in commits:
        for action in _actions(path):
            if "metaData" in action and schema is None:
                fields = json.loads(action["metaData"]["schemaString"])["fields"]
                partitions = action["metaData"]["partitionColumns"]
                schema = pa.schema([(f["name"], _TYPES[f["type"]]) for f in fields if f["name"] not in partitions])
            if "add" in action:
                add = action["add"]
                live[add["path"]] = add
                stats = json.loads(add["stats"])
                n = stats["numRecords"]
                assert schema is not None
                lo, hi = stats["minValues"], stats["maxValues"]
                columns = {
                    f.name: pa.array([_value(f.type, lo[f.name], hi[f.name], i, n) for i in range(n)], f.type)
                    for f in schema
                }
                target = root / add["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(parquet_of_size(pa.table(columns, schema=schema), add["size"]))
            if "remove" in action:
                live.pop(action["remove"]["path"], None)
        live_at[int(path.name[:20])] = list(live.values())
    side_schema = pa.schema([cp.SCHEMA.field("add"), cp.SCHEMA.field("remove")])
    for path in log.iterdir():
        if ".checkpoint." not in path.name or not path.name.endswith(".json"):
            continue
        version = int(path.name[:20])
        sidecars = [a["sidecar"] for a in _actions(path) if "sidecar" in a]
        assert len(sidecars) == 1  # these logs name one sidecar per checkpoint, holding every file action
        rows = [
            {"add": {**a, "partitionValues": list(a["partitionValues"].items()), "tags": list(a["tags"].items())}}
            for a in live_at[version]
        ]
        (log / "_sidecars").mkdir(exist_ok=True)
        table = pa.Table.from_pylist(rows, schema=side_schema)
        (log / "_sidecars" / sidecars[0]["path"]).write_bytes(parquet_of_size(table, sidecars[0]["sizeInBytes"]))
    return root


def test_databricks_v2_checkpoints_with_sidecars_and_identity_columns(tmp_path: Path) -> None:
    """delta-rs's `checkpoint-v2-table` (Databricks Runtime 17): UUID-named JSON V2 checkpoints at 6 and
    8 with one sidecar each, writeStatsAsStruct, identity columns."""
    root = materialize("checkpoint-v2-table", tmp_path)
    listing = list_log(DeltaTable.open(root).storage)
    assert listing.checkpoints[8].kind == "v2" and listing.checkpoints[6].kind == "v2"
    t = DeltaTable.open(root)
    assert t.version() == 9 and t.snapshot().num_records() == 44
    assert_like_references(root, list(range(10)), column="id", need=10)
    with pytest.raises(Unsupported, match=r"writing refused: .*'identityColumns'"):
        t.append(pa.table({"id": pa.array([45], pa.int64())}))
    # as after a cleanup through version 8: only the V2 checkpoint and its sidecar stand for 0..8
    for v in range(8):
        (root / LOG / f"{v:020d}.json").unlink()
    os.remove(root / LOG / "00000000000000000006.checkpoint.f5ee283b-37c7-46af-b64c-8f77c6a5c43a.json")
    fresh = DeltaTable.open(root)
    assert fresh.snapshot(8).num_records() == 43 and fresh.version() == 9
    assert_like_references(root, [8, 9], column="id", need=4)


def test_delta_spark_optimize_with_change_data_feed_and_arbitrary_operation_parameters(tmp_path: Path) -> None:
    """delta-spark 3.4's `commit-info-containing-arbitrary-operationParams-types`: commitInfo with
    non-string operation parameters, an OPTIMIZE that rewrites both files (dataChange false), and the
    writer feature changeDataFeed in use (read, not written)."""
    root = materialize("commit-info-containing-arbitrary-operationParams-types", tmp_path)
    t = DeltaTable.open(root)
    assert [e.operation for e in t.history()] == ["OPTIMIZE", "WRITE", "CREATE TABLE AS SELECT"]
    assert t.history()[0].operation_parameters["auto"] is False
    assert_like_references(root, [0, 1, 2], column="id", need=6)
    assert sorted(t.to_arrow().column("month").to_pylist()) == [1, 2]
    with pytest.raises(Unsupported, match=r"writing refused: .*'changeDataFeed'"):
        t.append(pa.table({"id": pa.array([3], pa.int32()), "month": pa.array([3], pa.int32())}))


def test_delta_spark_table_with_a_backward_ict_reads_at_every_version(tmp_path: Path) -> None:
    """delta-rs's `cdc_ict_table` (delta-spark 4.3): commit 1's inCommitTimestamp is 10^11 ms before
    commit 0's (issue 16 item 5). Every version still reads like deltalake and DuckDB; history and
    time lookups that need commit 1's time name it; times after it resolve."""
    root = materialize("cdc_ict_table", tmp_path)
    t = DeltaTable.open(root)
    assert t.version() == 3
    assert_like_references(root, [0, 1, 2, 3], column="name", need=8)
    assert sorted(t.to_arrow().column("name").to_pylist()) == ["Kate", "Steve"]
    with pytest.raises(Corruption, match=r"commit 1 has inCommitTimestamp 1683874206883 .* not after version 0's"):
        t.history()
    assert [e.version for e in t.history(limit=2)] == [3, 2]  # the newest entries do not depend on it
    assert t.version_at(1783874213881) == 3 and t.version_at(1783874213881 + 10**6) == 3
    assert t.version_at(1783874212175) == 2
    with pytest.raises(Corruption, match=r"commit 1 has inCommitTimestamp .* not after version 0's"):
        t.version_at(1783874205000)  # the answer depends on commit 1's time
    with pytest.raises(Unsupported, match=r"writing refused: .*'changeDataFeed'"):
        t.append(
            pa.table({"name": ["Zed"], "birthyear": pa.array([2000], pa.int32()), "age": pa.array([1], pa.int32())})
        )


def test_a_databricks_dlt_commit_with_protocol_2_5_and_no_column_mapping(tmp_path: Path) -> None:
    """delta-rs's `delta-live-table`: Databricks DLT's "DLT SETUP" commit sets protocol (2,5) with no
    `delta.columnMapping.mode` (issue 16 item 9). Its commit 0 and data are not in the index: commit 0
    here creates the table with the same metaData, commit 2 adds a file of that schema."""
    root = tmp_path / "dlt"
    shutil.copytree(GOLDEN / "delta-live-table", root)
    setup = _actions(root / LOG / f"{1:020d}.json")
    meta = next(a for a in setup if "metaData" in a)
    create = [{"commitInfo": {"timestamp": 1681798577757, "operation": "CREATE TABLE"}},
              {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, meta]  # fmt: skip
    (root / LOG / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in create) + "\n")
    data = pa.table(
        {
            "sherpa_user_id": pa.array([1, 2], pa.decimal128(38, 0)),
            "enabled": [True, False],
            "last_login": pa.array([dt.datetime(2023, 4, 18, tzinfo=dt.UTC)] * 2, pa.timestamp("us", tz="UTC")),
            "first_name": ["Ada", "Bob"],
            "last_name": ["L", "M"],
            "full_name": ["Ada L", "Bob M"],
            "email": ["a@x", "b@x"],
            "job_title": ["eng", "ops"],
            "hire_date": pa.array([dt.date(2020, 1, 1), dt.date(2021, 2, 3)], pa.date32()),
            "skypoint_delta_index": pa.array([10, 11], pa.int64()),
        }
    )
    body = parquet_of_size(data, 4096)
    (root / "part-00000-dlt.snappy.parquet").write_bytes(body)
    add = {"path": "part-00000-dlt.snappy.parquet", "partitionValues": {}, "size": len(body),
           "modificationTime": 1681798620000, "dataChange": True, "stats": json.dumps({"numRecords": 2})}  # fmt: skip
    commit2 = [{"commitInfo": {"timestamp": 1681798620000, "operation": "WRITE"}}, {"add": add}]
    (root / LOG / f"{2:020d}.json").write_text("\n".join(json.dumps(a) for a in commit2) + "\n")
    t = DeltaTable.open(root)
    s = t.snapshot()
    assert s.protocol.min_reader_version == 2 and t.to_arrow().num_rows == 2
    check_writable(s.protocol, metadata=s.metadata)  # nothing (2,5) implies is in use
    assert_like_references(root, [0, 1, 2], column="skypoint_delta_index", need=6)
