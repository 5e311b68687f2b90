"""Issue 16, the sweep: histories that delta-rs writes, read by feedlog at every version like deltalake.

Each history is built with deltalake 1.6 (appends and overwrites, partitions of every type,
schema evolution, replaceWhere, DELETE/UPDATE/MERGE, OPTIMIZE and Z-ORDER, VACUUM, checkpoints and
log cleanup, constraints, added columns and features, properties, column mapping, generated
columns, nested and large values, empty tables). Then, for every version, feedlog's rows, column
names and record count must equal deltalake's (order-independently, timestamps as UTC) and
DuckDB's where DuckDB agrees with deltalake; feedlog's history must list deltalake's versions and
`version_at` of each commit's time must name the version deltalake's time travel names. Last,
feedlog appends a matching batch where it claims it may write (and deltalake and DuckDB must read
the new version as feedlog does), or refuses with Unsupported naming the feature and "writing
refused". Each history is its own test id.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import (
    CommitProperties,
    Field,
    PostCommitHookProperties,
    Schema,
    TableFeatures,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake import DeltaTable as DL
from deltalake.schema import PrimitiveType

from feedlog.delta import DeltaTable
from feedlog.errors import BeforeHorizon, FeedlogError, InvalidArgument, Unsupported

from .conftest import deltalake_read, duckdb_read
from .s3 import S3Server
from .test_real_data_scan import canon

# --- the histories ---------------------------------------------------------------------------------


def base(n: int = 4, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"s{i}" for i in ids], "x": [i * 1.5 for i in ids]})


def h_append_overwrite(p: str) -> None:
    write_deltalake(p, base(3))
    write_deltalake(p, base(2, 10), mode="append")
    write_deltalake(p, base(2, 20), mode="append")
    write_deltalake(p, base(1, 30), mode="overwrite")
    write_deltalake(p, base(2, 40), mode="append")


def _partitioned(values: pa.Array, name: str = "pk") -> Callable[[str], None]:
    def build(p: str) -> None:
        n = len(values)
        data = pa.table({"id": pa.array(range(n), pa.int64()), name: values, "v": [f"v{i}" for i in range(n)]})
        write_deltalake(p, data, partition_by=[name])
        write_deltalake(p, data.slice(0, 2), mode="append")
        DL(p).delete("id = 1")
        DL(p).update(updates={"v": "'updated'"}, predicate="id = 0")
        DL(p).create_checkpoint()
        write_deltalake(p, data.slice(2), mode="append")

    return build


PARTITION_VALUES: dict[str, pa.Array] = {
    "int": pa.array([1, -5, None, 2**40], pa.int64()),
    "int8": pa.array([1, -128, None, 127], pa.int8()),
    "string": pa.array(["a b", "x/y=z", None, "ü%#?é", ""], pa.string()),
    "date": pa.array([dt.date(2024, 2, 29), dt.date(1, 1, 1), None, dt.date(9999, 12, 31)], pa.date32()),
    "timestamp": pa.array(
        [
            dt.datetime(2021, 9, 8, 11, 11, 11, 123456),
            dt.datetime(1970, 1, 1),
            None,
            dt.datetime(2000, 1, 1, 0, 0, 0, 1),
        ],
        pa.timestamp("us", tz="UTC"),
    ),
    "timestamp_ntz": pa.array(
        [dt.datetime(2021, 9, 8, 11, 11, 11), dt.datetime(1999, 12, 31, 23, 59, 59, 999999), None],
        pa.timestamp("us"),
    ),
    "decimal": pa.array(
        [decimal.Decimal("1.23"), decimal.Decimal("99999.99"), None, decimal.Decimal("0.00")], pa.decimal128(7, 2)
    ),
    "binary": pa.array([b"\x00\x01", b"\xff\x80", None, b"abc", b""], pa.binary()),
    "boolean": pa.array([True, False, None], pa.bool_()),
    "double": pa.array([1.5, -0.0, None, 1e10, 0.1], pa.float64()),
    "float": pa.array([1.5, 2.25, None], pa.float32()),
    "special_double": pa.array([float("nan"), float("inf"), float("-inf"), None], pa.float64()),
}


def h_two_partitions(p: str) -> None:
    data = pa.table(
        {
            "a": pa.array(["x", "y", None, "x"]),
            "b": pa.array([1, None, 2, 1], pa.int32()),
            "v": [1, 2, 3, 4],
        }
    )
    write_deltalake(p, data, partition_by=["a", "b"])
    write_deltalake(p, data.slice(0, 1), mode="overwrite", predicate="a = 'x' AND b = 1")
    DL(p).delete("a IS NULL")


def h_schema_merge(p: str) -> None:
    write_deltalake(p, base(2))
    extra = pa.table({"id": pa.array([5], pa.int64()), "s": ["five"], "x": [5.0], "y": pa.array([True])})
    write_deltalake(p, extra, mode="append", schema_mode="merge")
    fewer = pa.table({"id": pa.array([6], pa.int64()), "z": pa.array([dt.date(2020, 1, 1)])})
    write_deltalake(p, fewer, mode="append", schema_mode="merge")
    write_deltalake(p, base(1, 7), mode="overwrite", schema_mode="overwrite")


def h_replace_where(p: str) -> None:
    data = pa.table({"d": pa.array([dt.date(2024, 1, i) for i in (1, 1, 2, 3)]), "v": [1, 2, 3, 4]})
    write_deltalake(p, data, partition_by=["d"])
    new = pa.table({"d": pa.array([dt.date(2024, 1, 2)] * 2), "v": [30, 31]})
    write_deltalake(p, new, mode="overwrite", predicate="d = '2024-01-02'")
    write_deltalake(p, pa.table({"d": pa.array([dt.date(2024, 1, 1)]), "v": [10]}), mode="overwrite", predicate="v > 3")


def h_dml(p: str) -> None:
    write_deltalake(p, base(6))
    DL(p).delete("id % 2 = 0")
    DL(p).update(updates={"s": "'changed'", "x": "x * 2"}, predicate="id > 2")
    source = pa.table({"id": pa.array([1, 3, 100], pa.int64()), "s": ["m1", "m3", "new"], "x": [0.0, 0.0, 0.0]})
    (
        DL(p)
        .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update(updates={"s": "s.s"})
        .when_not_matched_insert_all()
        .execute()
    )
    DL(p).delete()


def h_deletion_vectors(p: str) -> None:
    write_deltalake(p, base(5), configuration={"delta.enableDeletionVectors": "true"})
    DL(p).delete("id = 2")
    DL(p).update(updates={"s": "'u'"}, predicate="id = 3")
    write_deltalake(p, base(2, 10), mode="append")


def h_optimize(p: str) -> None:
    for i in range(4):
        write_deltalake(p, base(2, i * 10), mode="append")
    DL(p).optimize.compact()
    write_deltalake(p, base(2, 50), mode="append")
    DL(p).optimize.z_order(["id", "x"])


def h_optimize_partitioned(p: str) -> None:
    for i in range(3):
        data = pa.table({"g": ["a", "b"], "id": pa.array([i, i + 100], pa.int64())})
        write_deltalake(p, data, mode="append", partition_by=["g"])
    DL(p).optimize.compact(partition_filters=[("g", "=", "a")])
    DL(p).optimize.z_order(["id"])


def h_vacuum(p: str) -> None:
    write_deltalake(p, base(3))
    write_deltalake(p, base(2, 10), mode="overwrite")
    DL(p).delete("id = 10")
    DL(p).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    write_deltalake(p, base(1, 20), mode="append")


def h_checkpoint_cleanup(p: str) -> None:
    conf = {"delta.logRetentionDuration": "interval 0 seconds"}
    write_deltalake(p, base(2), configuration=conf)
    write_deltalake(p, base(2, 10), mode="append")
    DL(p).delete("id = 0")
    DL(p).create_checkpoint()
    write_deltalake(p, base(1, 20), mode="append")
    DL(p).cleanup_metadata()
    write_deltalake(p, base(1, 30), mode="append")


def h_checkpoint_interval(p: str) -> None:
    write_deltalake(p, base(1), configuration={"delta.checkpointInterval": "2"}, partition_by=["s"])
    for i in range(1, 6):
        write_deltalake(p, base(1, i), mode="append")
    DL(p).delete("id = 3")


def h_checkpoint_nested(p: str) -> None:
    write_deltalake(p, nested(0))
    write_deltalake(p, nested(3), mode="append")
    DL(p).create_checkpoint()
    write_deltalake(p, nested(6), mode="append")


def h_compact_logs(p: str) -> None:
    write_deltalake(p, base(2))
    for i in range(1, 5):
        write_deltalake(p, base(1, i * 10), mode="append")
    DL(p).compact_logs(1, 3)


def h_constraint(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_constraint({"id_pos": "id >= 0"})
    write_deltalake(p, base(1, 5), mode="append")


def h_add_columns(p: str) -> None:
    write_deltalake(p, base(2))
    added = [Field("extra", PrimitiveType("string")), Field("n", PrimitiveType("integer"))]
    DL(p).alter.add_columns(added)
    write_deltalake(
        p,
        pa.table({"id": pa.array([9], pa.int64()), "s": ["n"], "x": [9.0], "extra": ["e"]}),
        mode="append",
        schema_mode="merge",
    )


def h_add_feature_cdf(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_feature(TableFeatures.ChangeDataFeed, allow_protocol_versions_increase=True)
    DL(p).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DL(p).update(updates={"s": "'cdf'"}, predicate="id = 1")
    DL(p).delete("id = 0")


def h_add_feature_dv(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    DL(p).delete("id = 0")


def h_add_feature_v2_checkpoint(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_feature(TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True)
    write_deltalake(p, base(1, 10), mode="append")
    DL(p).create_checkpoint()
    write_deltalake(p, base(1, 20), mode="append")


def h_add_feature_ntz(p: str) -> None:
    write_deltalake(p, base(2))
    DL(p).alter.add_feature(TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True)
    write_deltalake(p, base(1, 5), mode="append")


def h_set_properties(p: str) -> None:
    write_deltalake(p, base(2))
    DL(p).alter.set_table_properties({"delta.appendOnly": "true", "delta.dataSkippingNumIndexedCols": "1"})
    write_deltalake(p, base(1, 5), mode="append")


def h_cdf(p: str) -> None:
    write_deltalake(p, base(4), configuration={"delta.enableChangeDataFeed": "true"}, partition_by=["s"])
    DL(p).update(updates={"x": "0.0"}, predicate="id = 1")
    DL(p).delete("id = 2")
    write_deltalake(p, base(1, 9), mode="overwrite")


def h_column_mapping_name(p: str) -> None:
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "col a": ["x", "y", "z"], "g": ["p", "q", "p"]})
    write_deltalake(p, data, configuration={"delta.columnMapping.mode": "name"}, partition_by=["g"])
    write_deltalake(p, data.slice(1), mode="append")
    DL(p).delete("id = 2")
    DL(p).update(updates={'"col a"': "'u'"}, predicate="id = 3")


def h_column_mapping_id(p: str) -> None:
    write_deltalake(p, base(3), configuration={"delta.columnMapping.mode": "id"})
    write_deltalake(p, base(2, 10), mode="append")
    DL(p).create_checkpoint()
    write_deltalake(p, base(1, 20), mode="append")


def h_generated_columns(p: str) -> None:
    g = Field("g", PrimitiveType("long"), metadata={"delta.generationExpression": "a * 2"})
    schema = Schema([Field("a", PrimitiveType("long")), g])
    DL.create(p, schema)
    write_deltalake(p, pa.table({"a": pa.array([1, 2], pa.int64())}), mode="append")
    write_deltalake(p, pa.table({"a": pa.array([3], pa.int64())}), mode="append")


def nested(start: int) -> pa.Table:
    ids = list(range(start, start + 3))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "st": pa.array(
                [{"a": i, "b": {"c": f"c{i}", "d": [i, None]}} if i % 3 else None for i in ids],
                pa.struct([("a", pa.int32()), ("b", pa.struct([("c", pa.string()), ("d", pa.list_(pa.int64()))]))]),
            ),
            "arr": pa.array([[[{"k": i}], [], None][i % 3] for i in ids]),
            "m": pa.array([[[("x", i), ("y", None)], None, []][i % 3] for i in ids], pa.map_(pa.string(), pa.int64())),
        }
    )


def h_nested(p: str) -> None:
    write_deltalake(p, nested(0))
    write_deltalake(p, nested(3), mode="append")
    DL(p).delete("id = 1")


def h_large_strings(p: str) -> None:
    data = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "big": pa.array(["é" * 100_000, "z" * 300_000], pa.large_string()),
            "lb": pa.array([b"\x00" * 70_000, None], pa.large_binary()),
        }
    )
    write_deltalake(p, data)
    write_deltalake(p, data.slice(0, 1), mode="append")


def h_empty_created(p: str) -> None:
    DL.create(p, Schema([Field("id", PrimitiveType("long")), Field("s", PrimitiveType("string"))]), partition_by=["s"])
    write_deltalake(p, pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.string())}), mode="append")


def h_all_removed(p: str) -> None:
    write_deltalake(p, base(3), partition_by=["s"])
    DL(p).delete()
    write_deltalake(p, base(0), mode="overwrite")


def h_restore(p: str) -> None:
    write_deltalake(p, base(2))
    write_deltalake(p, base(2, 10), mode="overwrite")
    write_deltalake(p, base(1, 20), mode="append")
    DL(p).restore(0)


def h_types(p: str) -> None:
    data = pa.table(
        {
            "i8": pa.array([1, None], pa.int8()),
            "i16": pa.array([-3, 2], pa.int16()),
            "i32": pa.array([2**31 - 1, None], pa.int32()),
            "f32": pa.array([float("nan"), 1.25], pa.float32()),
            "f64": pa.array([float("inf"), None], pa.float64()),
            "dec": pa.array([decimal.Decimal("12345678901234567890.123456"), None], pa.decimal128(38, 6)),
            "d": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31)]),
            "ts": pa.array([dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)], pa.timestamp("us", tz="UTC")),
            "ntz": pa.array([dt.datetime(2020, 2, 2, 2, 2, 2), None], pa.timestamp("us")),
            "b": pa.array([True, None]),
            "bin": pa.array([b"\x00", None]),
            "s": pa.array(["", None]),
        }
    )
    write_deltalake(p, data)
    write_deltalake(p, data.slice(1), mode="append")


def h_stats_off(p: str) -> None:
    write_deltalake(p, base(3), configuration={"delta.dataSkippingNumIndexedCols": "0"})
    write_deltalake(p, base(2, 5), mode="append")
    DL(p).delete("id = 5")


def h_stats_columns(p: str) -> None:
    write_deltalake(p, base(3), configuration={"delta.dataSkippingStatsColumns": "s"})
    write_deltalake(p, base(2, 5), mode="append")


def h_stats_struct_checkpoint(p: str) -> None:
    conf = {"delta.checkpoint.writeStatsAsStruct": "true", "delta.checkpoint.writeStatsAsJson": "false"}
    data = pa.table(
        {
            "n": pa.array([1, 2, None], pa.int32()),
            "d": pa.array([dt.date(2020, 1, 1), None, dt.date(2021, 1, 1)]),
            "ts": pa.array([dt.datetime(2020, 1, 1, 1), None, None], pa.timestamp("us", tz="UTC")),
            "v": ["a", "b", "c"],
        }
    )
    write_deltalake(p, data, configuration=conf, partition_by=["n", "d", "ts"])
    write_deltalake(p, data.slice(1), mode="append")
    DL(p).create_checkpoint()
    DL(p).delete("v = 'a'")


def h_random_prefixes(p: str) -> None:
    write_deltalake(p, base(3), configuration={"delta.randomizeFilePrefixes": "true"})
    write_deltalake(p, base(2, 10), mode="append")
    DL(p).delete("id = 10")


def h_update_partition_column(p: str) -> None:
    data = pa.table({"g": ["a", "a", "b"], "id": pa.array([1, 2, 3], pa.int64())})
    write_deltalake(p, data, partition_by=["g"])
    DL(p).update(updates={"g": "'c'"}, predicate="id = 2")
    DL(p).update(updates={"g": "NULL"}, predicate="id = 3")


def h_merge_variants(p: str) -> None:
    write_deltalake(p, base(5), partition_by=["s"])
    source = pa.table({"id": pa.array([1, 2, 9], pa.int64()), "s": ["s1", "s2", "s9"], "x": [10.0, 20.0, 90.0]})
    (
        DL(p)
        .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete(predicate="s.id = 1")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete(predicate="t.id = 4")
        .execute()
    )
    wider = pa.table({"id": pa.array([3, 50], pa.int64()), "s": ["s3", "s50"], "x": [3.0, 5.0], "w": ["w3", "w50"]})
    (
        DL(p)
        .merge(wider, predicate="t.id = s.id", source_alias="s", target_alias="t", merge_schema=True)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def h_nested_evolution(p: str) -> None:
    st = pa.struct([("a", pa.int64())])
    write_deltalake(p, pa.table({"id": pa.array([1], pa.int64()), "st": pa.array([{"a": 1}], st)}))
    st2 = pa.struct([("a", pa.int64()), ("b", pa.string())])
    write_deltalake(
        p,
        pa.table({"id": pa.array([2], pa.int64()), "st": pa.array([{"a": 2, "b": "x"}], st2)}),
        mode="append",
        schema_mode="merge",
    )


def h_many_files(p: str) -> None:
    props = WriterProperties(compression="ZSTD", max_row_group_size=7, data_page_row_count_limit=3)
    data = pa.table({"id": pa.array(range(200), pa.int64()), "s": [f"{i % 7}" * (i % 50) for i in range(200)]})
    write_deltalake(p, data, writer_properties=props, target_file_size=1024)
    DL(p).delete("id % 3 = 0")
    DL(p).optimize.compact(target_size=4096)


def h_named_table(p: str) -> None:
    write_deltalake(p, base(2), name="my table", description="a description")
    write_deltalake(p, base(1, 5), mode="append", description="changed?")


def h_column_mapping_cleanup(p: str) -> None:
    conf = {"delta.columnMapping.mode": "name", "delta.logRetentionDuration": "interval 0 seconds"}
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "d": pa.array([dt.date(2020, 1, 1), None])})
    write_deltalake(p, data, configuration=conf, partition_by=["d"])
    write_deltalake(p, data, mode="append")
    DL(p).create_checkpoint()
    DL(p).cleanup_metadata()
    DL(p).delete("id = 1")


def h_many_commits(p: str) -> None:
    conf = {"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 0 seconds"}
    write_deltalake(p, base(1), configuration=conf)
    for i in range(1, 24):
        write_deltalake(p, base(1, i), mode="append")
    DL(p).cleanup_metadata()
    write_deltalake(p, base(1, 99), mode="append")


def h_special_names(p: str) -> None:
    data = pa.table({"with space": [1, 2], "ünï": ["a", "b"], "Upper": [True, False], "p-art": ["x", "y y"]})
    write_deltalake(p, data, partition_by=["p-art"])
    write_deltalake(p, data, mode="append")


def h_timestamp_replace(p: str) -> None:
    ts = [dt.datetime(2024, 1, 1, h, tzinfo=dt.UTC) for h in (0, 0, 1)]
    data = pa.table({"t": pa.array(ts, pa.timestamp("us", tz="UTC")), "v": [1, 2, 3]})
    write_deltalake(p, data, partition_by=["t"])
    new = pa.table({"t": pa.array(ts[:1], pa.timestamp("us", tz="UTC")), "v": [10]})
    write_deltalake(p, new, mode="overwrite", predicate="t = '2024-01-01T00:00:00Z'")
    DL(p).delete("t > '2024-01-01T00:30:00Z'")


def h_cdf_column_mapping(p: str) -> None:
    conf = {"delta.enableChangeDataFeed": "true", "delta.columnMapping.mode": "name"}
    write_deltalake(p, base(3), configuration=conf)
    DL(p).update(updates={"s": "'c'"}, predicate="id = 1")
    DL(p).delete("id = 2")


def h_ntz_nested(p: str) -> None:
    st = pa.struct([("when", pa.timestamp("us")), ("n", pa.int32())])
    data = pa.table(
        {"id": pa.array([1, 2], pa.int64()), "st": pa.array([{"when": dt.datetime(2020, 5, 5), "n": 1}, None], st)}
    )
    write_deltalake(p, data)
    DL(p).create_checkpoint()
    write_deltalake(p, data, mode="append")


def h_txn(p: str) -> None:
    write_deltalake(p, base(2), commit_properties=CommitProperties(app_transactions=[Transaction(APP, 3)]))
    write_deltalake(p, base(1, 5), mode="append", commit_properties=CommitProperties(custom_metadata={"who": "me"}))
    again = CommitProperties(app_transactions=[Transaction(APP, 9)])
    write_deltalake(p, base(1, 6), mode="append", commit_properties=again)


def h_repartition(p: str) -> None:
    write_deltalake(p, base(3), partition_by=["s"])
    write_deltalake(p, base(3, 10), mode="overwrite", schema_mode="overwrite", partition_by=["id"])
    write_deltalake(p, base(2, 20), mode="overwrite", schema_mode="overwrite")
    write_deltalake(p, base(1, 30), mode="append")


def h_commit_hooks(p: str) -> None:
    conf = {"delta.checkpointInterval": "3", "delta.logRetentionDuration": "interval 0 seconds"}
    hooks = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=True)
    write_deltalake(p, base(1), configuration=conf, post_commithook_properties=hooks)
    for i in range(1, 8):
        write_deltalake(p, base(1, i), mode="append", post_commithook_properties=hooks)


def h_complex_nested(p: str) -> None:
    inner = pa.struct([("q", pa.float64()), ("r.s", pa.string())])
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "ms": pa.array([[("a", {"q": 1.0, "r.s": "x"})], [], None], pa.map_(pa.string(), inner)),
            "ll": pa.array([[[1, 2], [], None], None, [[3]]], pa.list_(pa.list_(pa.int32()))),
            "ls": pa.array([[{"q": 2.0, "r.s": None}], [None], []], pa.list_(inner)),
            "mi": pa.array([[(1, [b"x"])], [(2, None)], None], pa.map_(pa.int32(), pa.list_(pa.binary()))),
        }
    )
    write_deltalake(p, data)
    DL(p).create_checkpoint()
    write_deltalake(p, data.slice(0, 1), mode="append")
    DL(p).delete("id = 2")


def h_column_mapping_nested(p: str) -> None:
    st = pa.struct([("in ner", pa.int64()), ("deep", pa.struct([("x.y", pa.string())]))])
    data = pa.table(
        {
            "a b": pa.array([1, 2], pa.int64()),
            "st": pa.array([{"in ner": 1, "deep": {"x.y": "v"}}, None], st),
            "part col": ["p", "q"],
        }
    )
    write_deltalake(p, data, configuration={"delta.columnMapping.mode": "name"}, partition_by=["part col"])
    DL(p).create_checkpoint()
    write_deltalake(p, data, mode="append")
    DL(p).update(updates={"st": "NULL"}, predicate='"a b" = 1')


def h_decimal_extremes(p: str) -> None:
    data = pa.table(
        {
            "big": pa.array([decimal.Decimal(10**37), decimal.Decimal(0), None], pa.decimal128(38, 0)),
            "tiny": pa.array([decimal.Decimal("0.00001"), decimal.Decimal("0.99999"), None], pa.decimal128(5, 5)),
            "v": [1, 2, 3],
        }
    )
    write_deltalake(p, data, partition_by=["big", "tiny"])
    DL(p).create_checkpoint()
    write_deltalake(p, data.slice(0, 1), mode="append")


def h_update_expressions(p: str) -> None:
    write_deltalake(p, base(4), partition_by=["s"])
    DL(p).update(updates={"id": "id + 100", "x": "NULL"}, predicate="id < 2")
    DL(p).update(updates={"s": "concat(s, '!')"})


def h_nanos(p: str) -> None:
    ts = pa.array([dt.datetime(2021, 1, 1, 0, 0, 0, 1), None], pa.timestamp("ns", tz="UTC"))
    write_deltalake(p, pa.table({"t": ts, "n": pa.array([dt.datetime(2021, 1, 1)] * 2, pa.timestamp("ns"))}))
    write_deltalake(p, pa.table({"t": ts, "n": pa.array([None, None], pa.timestamp("ns"))}), mode="append")


def h_dv_checkpoint_cleanup(p: str) -> None:
    conf = {"delta.enableDeletionVectors": "true", "delta.logRetentionDuration": "interval 0 seconds"}
    write_deltalake(p, base(4), configuration=conf, partition_by=["s"])
    DL(p).delete("id = 1")
    DL(p).create_checkpoint()
    DL(p).cleanup_metadata()
    write_deltalake(p, base(1, 9), mode="append")


def h_v2_checkpoint_cleanup(p: str) -> None:
    write_deltalake(p, base(3), configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    DL(p).alter.add_feature(TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True)
    write_deltalake(p, base(1, 10), mode="append")
    DL(p).create_checkpoint()
    DL(p).cleanup_metadata()
    write_deltalake(p, base(1, 20), mode="append")


def h_overwrite_empty(p: str) -> None:
    write_deltalake(p, base(3), partition_by=["s"])
    write_deltalake(p, base(0), mode="overwrite")
    write_deltalake(p, base(2, 5), mode="append")


def h_append_only(p: str) -> None:
    write_deltalake(p, base(2), configuration={"delta.appendOnly": "true"})
    write_deltalake(p, base(2, 5), mode="append")


def h_many_partitions(p: str) -> None:
    data = pa.table({"k": pa.array(range(60), pa.int32()), "v": pa.array(range(60), pa.int64())})
    write_deltalake(p, data, partition_by=["k"])
    DL(p).delete("k >= 30")
    DL(p).optimize.compact()


def _listed(feature: TableFeatures) -> Callable[[str], None]:
    """A (3,7) table listing `feature` without using it, as delta-spark lists every legacy feature
    when it upgrades a table: appended to and deleted from by delta-rs."""

    def build(p: str) -> None:
        write_deltalake(p, base(3), partition_by=["s"])
        DL(p).alter.add_feature(feature, allow_protocol_versions_increase=True)
        write_deltalake(p, base(2, 10), mode="append")
        DL(p).delete("id = 1")

    return build


LISTED = ["AppendOnly", "ChangeDataFeed", "CheckConstraints", "ColumnMapping", "GeneratedColumns", "Invariants"]
LISTED += ["VariantType", "VariantTypePreview"]


def h_constraint_dropped(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_constraint({"id_pos": "id >= 0"})
    DL(p).alter.drop_constraint("id_pos")
    write_deltalake(p, base(1, 5), mode="append")


def h_constraint_listed_and_used(p: str) -> None:
    write_deltalake(p, base(3))
    DL(p).alter.add_feature(TableFeatures.CheckConstraints, allow_protocol_versions_increase=True)
    DL(p).alter.add_constraint({"id_pos": "id >= 0"})
    write_deltalake(p, base(1, 5), mode="append")


def h_replace_table(p: str) -> None:
    write_deltalake(p, base(3), partition_by=["s"])
    write_deltalake(p, base(1, 5), mode="append")
    DL.create(p, Schema([Field("other", PrimitiveType("string"))]), mode="overwrite")
    write_deltalake(p, pa.table({"other": ["o"]}), mode="append")


def h_restore_by_time(p: str) -> None:
    write_deltalake(p, base(2))
    first = (Path(p) / "_delta_log" / f"{0:020d}.json").stat().st_mtime_ns
    when = dt.datetime.fromtimestamp(first / 1e9, dt.UTC)
    write_deltalake(p, base(2, 10), mode="overwrite")
    DL(p).restore(when)
    write_deltalake(p, base(1, 20), mode="append")


def h_alter_metadata(p: str) -> None:
    schema = Schema([Field("id", PrimitiveType("long"), nullable=False), Field("s", PrimitiveType("string"))])
    DL.create(p, schema)
    write_deltalake(p, base(2).select(["id", "s"]), mode="append")
    DL(p).alter.set_table_name("renamed")
    DL(p).alter.set_table_description("described")
    DL(p).alter.set_column_metadata("s", {"comment": "a comment"})
    DL(p).alter.drop_column_not_null("id")
    write_deltalake(p, pa.table({"id": pa.array([None], pa.int64()), "s": ["null id"]}), mode="append")


def h_mapped_timestamp_partition(p: str) -> None:
    ts = pa.array([dt.datetime(2024, 3, 1, 12, 30, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC"))
    data = pa.table({"t": ts, "d": pa.array([dt.date(2024, 3, 1), None]), "v": [1, 2]})
    write_deltalake(p, data, configuration={"delta.columnMapping.mode": "id"}, partition_by=["t", "d"])
    write_deltalake(p, data.slice(0, 1), mode="append")
    DL(p).create_checkpoint()


def h_null_partitions(p: str) -> None:
    data = pa.table(
        {"n": pa.array([None, None], pa.int64()), "t": pa.array([None, None], pa.timestamp("us")), "v": [1, 2]}
    )
    write_deltalake(p, data, partition_by=["n", "t"])
    DL(p).create_checkpoint()
    DL(p).delete("v = 1")


def h_invariants(p: str) -> None:
    invariant = json.dumps({"expression": {"expression": "x > 0"}})
    x = Field("x", PrimitiveType("long"), nullable=False, metadata={"delta.invariants": invariant})
    DL.create(p, Schema([x, Field("y", PrimitiveType("string"))]))
    write_deltalake(p, pa.table({"x": pa.array([1, 2], pa.int64()), "y": ["a", None]}), mode="append")


HISTORIES: dict[str, Callable[[str], None]] = {
    "append_overwrite": h_append_overwrite,
    **{f"partition_{name}": _partitioned(values) for name, values in PARTITION_VALUES.items()},
    "two_partitions": h_two_partitions,
    "schema_merge": h_schema_merge,
    "replace_where": h_replace_where,
    "dml": h_dml,
    "deletion_vectors": h_deletion_vectors,
    "optimize": h_optimize,
    "optimize_partitioned": h_optimize_partitioned,
    "vacuum": h_vacuum,
    "checkpoint_cleanup": h_checkpoint_cleanup,
    "checkpoint_interval": h_checkpoint_interval,
    "checkpoint_nested": h_checkpoint_nested,
    "compact_logs": h_compact_logs,
    "constraint": h_constraint,
    "add_columns": h_add_columns,
    "add_feature_cdf": h_add_feature_cdf,
    "add_feature_dv": h_add_feature_dv,
    "add_feature_v2_checkpoint": h_add_feature_v2_checkpoint,
    "add_feature_ntz": h_add_feature_ntz,
    "set_properties": h_set_properties,
    "cdf": h_cdf,
    "column_mapping_name": h_column_mapping_name,
    "column_mapping_id": h_column_mapping_id,
    "generated_columns": h_generated_columns,
    "nested": h_nested,
    "large_strings": h_large_strings,
    "empty_created": h_empty_created,
    "all_removed": h_all_removed,
    "restore": h_restore,
    "types": h_types,
    "stats_off": h_stats_off,
    "stats_columns": h_stats_columns,
    "stats_struct_checkpoint": h_stats_struct_checkpoint,
    "random_prefixes": h_random_prefixes,
    "update_partition_column": h_update_partition_column,
    "merge_variants": h_merge_variants,
    "nested_evolution": h_nested_evolution,
    "many_files": h_many_files,
    "named_table": h_named_table,
    "column_mapping_cleanup": h_column_mapping_cleanup,
    "many_commits": h_many_commits,
    "special_names": h_special_names,
    "timestamp_replace": h_timestamp_replace,
    "cdf_column_mapping": h_cdf_column_mapping,
    "ntz_nested": h_ntz_nested,
    "invariants": h_invariants,
    "txn": h_txn,
    "repartition": h_repartition,
    "commit_hooks": h_commit_hooks,
    "complex_nested": h_complex_nested,
    "column_mapping_nested": h_column_mapping_nested,
    "decimal_extremes": h_decimal_extremes,
    "update_expressions": h_update_expressions,
    "nanos": h_nanos,
    "dv_checkpoint_cleanup": h_dv_checkpoint_cleanup,
    "v2_checkpoint_cleanup": h_v2_checkpoint_cleanup,
    "overwrite_empty": h_overwrite_empty,
    "append_only": h_append_only,
    "many_partitions": h_many_partitions,
    "constraint_dropped": h_constraint_dropped,
    "null_partitions": h_null_partitions,
    "replace_table": h_replace_table,
    "restore_by_time": h_restore_by_time,
    "alter_metadata": h_alter_metadata,
    "mapped_timestamp_partition": h_mapped_timestamp_partition,
    "constraint_listed_and_used": h_constraint_listed_and_used,
    **{f"listed_{name}": _listed(getattr(TableFeatures, name)) for name in LISTED},
}


# --- the sweep -------------------------------------------------------------------------------------


def _default(t: pa.DataType) -> Any:
    if pa.types.is_integer(t):
        return 7
    if pa.types.is_floating(t):
        return 7.5
    if pa.types.is_decimal(t):
        return decimal.Decimal(7)
    if pa.types.is_boolean(t):
        return True
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "w"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b"w"
    if pa.types.is_date(t):
        return dt.date(2026, 1, 2)
    if pa.types.is_timestamp(t):
        return dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC if t.tz else None)
    if pa.types.is_struct(t):
        return {f.name: _default(f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return []
    return None


def matching_batch(table: DeltaTable) -> pa.Table:
    """Two rows of the table's latest data, or one row of defaults for an empty table."""
    current = table.to_arrow()
    if current.num_rows:
        return current.slice(0, 2)
    schema = table.snapshot().schema
    return pa.table({f.name: pa.array([_default(f.type)], f.type) for f in schema}, schema=schema)


Fix = Callable[[pa.Table], pa.Table]


def protocol_binary(column: str) -> Fix:
    """The reference readers' rows with `column`'s binary partition values decoded as PROTOCOL.md
    escapes them (one `\\u00XX` per byte, as delta-rs writes them): deltalake and DuckDB return the
    escape text itself, so they do not give back the bytes delta-rs was given (test_real_data_scan)."""

    def decode(b: bytes | None) -> bytes | None:
        if b is None or not re.fullmatch(rb"(?:\\u00[0-9A-Fa-f]{2})+", b):
            return b
        return bytes(int(b[i + 2 : i + 6], 16) for i in range(0, len(b), 6))

    def fix(t: pa.Table) -> pa.Table:
        i = t.column_names.index(column)
        values = [decode(b) for b in t.column(column).to_pylist()]
        return t.set_column(i, column, pa.array(values, pa.binary()))

    return fix


def agree(
    path: str,
    v: int,
    ours: pa.Table,
    problems: list[str],
    counts: dict[str, int],
    what: str = "read",
    fix: Fix | None = None,
    read: pa.Table | None = None,
) -> bool:
    """feedlog's rows at version v against deltalake's, and DuckDB's: where the two disagree, feedlog
    must give one of their answers (the protocol's; which one is counted). True if DuckDB read the
    version as deltalake does. `read`: deltalake's rows at v, if the caller has read them already."""
    fix = fix or (lambda t: t)
    theirs = fix(deltalake_read(path, v) if read is None else read)
    at = f"v{v}" + ("" if what == "read" else f" (after feedlog's {what})")
    if ours.column_names != theirs.column_names:
        problems.append(f"{at}: columns {ours.column_names} != deltalake {theirs.column_names}")
    mine, dl = canon(ours), canon(theirs)
    try:
        duck: list[tuple[Any, ...]] | None = canon(fix(duckdb_read(path, v)))
    except Exception:  # DuckDB's delta extension refuses some tables; it only counts where it reads
        duck = None
        counts["duckdb_refused"] += 1
    if duck is None or duck == dl:
        counts["duckdb_agreed"] += duck is not None
        if mine != dl:
            problems.append(f"{at}: rows differ from deltalake:\n  feedlog   {mine}\n  deltalake {dl}")
        return duck is not None
    if mine == dl:
        counts["disagreed_feedlog_as_deltalake"] += 1
    elif mine == duck:
        counts["disagreed_feedlog_as_duckdb"] += 1
    else:
        problems.append(f"{at}: rows differ from both:\n  feedlog   {mine}\n  deltalake {dl}\n  duckdb    {duck}")
    return False


APP = "sweep-app"  # the app id of the histories' txn markers


def deltalake_version_at(path: str, ms: int) -> int | None:
    """The version deltalake's time travel names for `ms` since the epoch, None if it names none."""
    dl = DL(path)
    try:
        dl.load_as_version(dt.datetime.fromtimestamp(ms / 1000, dt.UTC))
    except Exception:  # before the first retained commit
        return None
    return dl.version()


def monotonised_version_at(path: str, ms: int) -> int | None:
    """The newest commit at or before `ms` by file times made strictly increasing, as delta-spark's
    DeltaHistoryManager does (a commit no later than the one before it counts as 1 ms after it).
    deltalake uses the raw times: two commits in the same ms are where the two answers part."""
    log = Path(path) / "_delta_log"
    raw = sorted((int(f.name[:20]), f.stat().st_mtime_ns // 1_000_000) for f in log.glob("[0-9]" * 20 + ".json"))
    found, previous = None, None
    for version, t in raw:
        previous = t if previous is None else max(t, previous + 1)
        if previous <= ms:
            found = version
    return found


def history_and_time(path: str, table: DeltaTable, problems: list[str], since: int = 0) -> None:
    """feedlog's history lists deltalake's versions and operations; version_at of each commit's
    time, a ms before and a ms after, names the version deltalake's time travel names."""
    history = table.history()
    theirs = {int(h["version"]): h.get("operation") for h in DL(path).history()}
    ours = {h.version: h.operation for h in history}
    if ours != theirs:
        problems.append(f"history {ours} != deltalake {theirs}")
    first = min((h.timestamp for h in history), default=0)
    for h in (h for h in history if h.version >= since):
        for ms in (h.timestamp - 1, h.timestamp, h.timestamp + 1):
            try:
                at: int | None = table.version_at(ms)
            except FeedlogError:
                at = None
            if at is None and ms < first:
                continue  # before the first retained commit: deltalake answers its oldest version anyway
            if at != deltalake_version_at(path, ms) and at != monotonised_version_at(path, ms):
                problems.append(f"version_at({ms}) {at} != deltalake {deltalake_version_at(path, ms)}")
            elif at is not None:
                try:
                    got = table.snapshot(timestamp_ms=ms).version
                except BeforeHorizon:
                    continue  # its files vacuumed: refused whole (sweep checks deltalake cannot read it)
                if got != at:
                    problems.append(f"snapshot(timestamp_ms={ms}) is not version {at}")


def _literal(value: Any, t: pa.DataType, duck: bool) -> str | None:
    """`value` as an SQL literal of type `t` for DataFusion (deltalake) or DuckDB; None to skip."""
    if pa.types.is_boolean(t):
        return "true" if value else "false"
    if pa.types.is_integer(t):
        return str(value)
    if pa.types.is_decimal(t):
        return f"CAST('{value}' AS DECIMAL({t.precision},{t.scale}))"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "'" + str(value).replace("'", "''") + "'"
    if pa.types.is_date(t):
        return f"DATE '{value.year:04d}-{value.month:02d}-{value.day:02d}'"
    if pa.types.is_timestamp(t) and 1678 < value.year < 2262:  # DataFusion casts literals to ns
        text = value.replace(tzinfo=None).isoformat(sep=" ")
        if t.tz is None:
            return f"TIMESTAMP '{text}'"
        return f"TIMESTAMPTZ '{text}+00'" if duck else f"TIMESTAMP '{text}Z'"
    return None


def filtered_counts(path: str, v: int, batch: pa.Table, duck: bool, problems: list[str]) -> None:
    """For the first row of `batch`, which feedlog appended as version v, the rows equal to it in
    each simple column, counted by deltalake (and DuckDB where `duck`, i.e. it read version v as
    deltalake does) with a WHERE they may answer by skipping files on stats and partition values:
    version v must hold as many more than v - 1 as the batch has (a wrong min/max in the stats feedlog
    wrote makes a reader skip its file; other writers' stats are theirs: delta-rs writes decimals as
    lossy JSON floats, which DuckDB skips by)."""
    import deltalake

    from . import conftest

    opened: dict[int, Any] = {}  # deltalake's table at each version, loaded once for every column

    def deltalake_count(version: int, where: str) -> int:
        dl = opened.get(version) or opened.setdefault(version, deltalake.DeltaTable(path, version=version))
        sql = f"select count(*) as n from t where {where}"
        return int(pa.table(deltalake.QueryBuilder().register("t", dl).execute(sql).read_all()).column("n")[0].as_py())

    def duckdb_count(version: int, where: str) -> int:
        duckdb_read(path, version)  # loads the extension once
        scan = f"delta_scan('{path}', version => {int(version)})"
        return int(conftest._duck.sql(f"select count(*) from {scan} where {where}").fetchone()[0])

    for name, value in batch.slice(0, 1).to_pylist()[0].items():
        t = batch.schema.field(name).type
        column = batch.column(name).to_pylist()
        if value is None:
            added = column.count(None)
            where = {False: f'"{name}" IS NULL', True: f'"{name}" IS NULL'}
        else:
            dl_lit, duck_lit = _literal(value, t, False), _literal(value, t, True)
            if dl_lit is None or duck_lit is None:
                continue
            added = column.count(value)
            where = {False: f'"{name}" = {dl_lit}', True: f'"{name}" = {duck_lit}'}
        readers = [("deltalake", deltalake_count, where[False])]
        if duck:
            readers.append(("DuckDB", duckdb_count, where[True]))
        for reader, count, condition in readers:
            more = count(v, condition) - count(v - 1, condition)
            if more != added:
                problems.append(f"v{v}: {reader} finds {more} more rows where {condition}, feedlog added {added}")


DISAGREED = ("disagreed_feedlog_as_deltalake", "disagreed_feedlog_as_duckdb")


def sweep(path: str, fix: Fix | None = None) -> tuple[list[str], dict[str, int], str | None]:
    """Every version of the table at `path`, then one append: (problems, counts, refusal message)."""
    problems: list[str] = []
    names = ("versions", "written", "append_only_refused", "deltalake_refused", "duckdb_agreed", "duckdb_refused")
    counts = dict.fromkeys((*names, *DISAGREED), 0)
    latest = DL(path).version()
    table = DeltaTable.open(path)
    for v in range(latest + 1):
        try:
            read = deltalake_read(path, v)
        except Exception:  # vacuumed files or cleaned-up log: feedlog must refuse too, with its own error
            counts["deltalake_refused"] += 1
            try:
                table.to_arrow(v)
            except FeedlogError:
                continue
            except Exception as e:
                problems.append(f"v{v}: crash {type(e).__name__}: {e}")
                continue
            problems.append(f"v{v}: feedlog reads a version deltalake cannot")
            continue
        counts["versions"] += 1
        try:
            ours = table.to_arrow(v)
            n = table.snapshot(v).num_records()
        except FeedlogError as e:
            problems.append(f"v{v}: feedlog refused a version deltalake reads: {type(e).__name__}: {e}")
            continue
        except Exception as e:
            problems.append(f"v{v}: crash {type(e).__name__}: {e}")
            continue
        agree(path, v, ours, problems, counts, fix=fix, read=read)
        if n != ours.num_rows:  # every writer here writes numRecords (in stats or stats_parsed)
            problems.append(f"v{v}: num_records {n} != {ours.num_rows} rows")
    try:
        history_and_time(path, table, problems)
        if table.txn_version(APP) != DL(path).transaction_version(APP):
            problems.append(f"txn_version {table.txn_version(APP)} != deltalake {DL(path).transaction_version(APP)}")
        table.info()
    except FeedlogError as e:
        problems.append(f"history/version_at/txn/info refused: {type(e).__name__}: {e}")
    except Exception as e:
        problems.append(f"history/version_at/txn/info crash {type(e).__name__}: {e}")
    refusal = None
    try:
        batch = matching_batch(table)
        DeltaTable.open(path).append(batch)
    except Unsupported as e:
        refusal = str(e)
        if "writing refused" not in refusal:
            problems.append(f"append refused without saying writing is refused: {refusal}")
        return problems, counts, refusal
    except FeedlogError as e:
        problems.append(f"append failed: {type(e).__name__}: {e}")
        return problems, counts, refusal
    except Exception as e:
        problems.append(f"append crash {type(e).__name__}: {e}")
        return problems, counts, refusal

    # the appended version; after feedlog's checkpoint of it; an append of the rows as deltalake reads
    # them (its Arrow types); an overwrite; a checkpoint and a cleanup of every commit before it
    def cleanup(t: DeltaTable) -> None:
        t.checkpoint()
        t.cleanup(retain_ms=0)

    try:
        theirs = deltalake_read(path).slice(0, 2)
    except Exception as e:  # what feedlog appended, deltalake must read
        problems.append(f"deltalake cannot read feedlog's append: {type(e).__name__}: {e}")
        return problems, counts, refusal
    writes: list[tuple[str, int, Callable[[DeltaTable], object]]] = [
        ("append", 0, lambda t: None),
        ("checkpoint", 0, lambda t: t.checkpoint()),
        ("append of deltalake's rows", 1, lambda t: t.append(theirs)),
        ("overwrite", 1, lambda t: t.append(batch.slice(0, 1), mode="overwrite")),
        ("cleanup", 0, cleanup),
    ]
    expected = latest + 1
    for what, commits, write in writes:
        try:
            write(DeltaTable.open(path))
        except InvalidArgument as e:
            if "append-only" not in str(e) or what != "overwrite":
                problems.append(f"{what} failed: {type(e).__name__}: {e}")
                break
            counts["append_only_refused"] += 1
            continue
        except FeedlogError as e:
            problems.append(f"{what} failed: {type(e).__name__}: {e}")
            break
        except Exception as e:
            problems.append(f"{what} crash {type(e).__name__}: {e}")
            break
        expected += commits
        if DL(path).version() != expected:
            problems.append(f"after feedlog's {what} deltalake sees version {DL(path).version()}, not {expected}")
            break
        counts["written"] += 1
        after = DeltaTable.open(path)
        rows_after = after.to_arrow(expected)
        if after.snapshot(expected).num_records() != rows_after.num_rows:
            problems.append(f"after feedlog's {what}: num_records {after.snapshot(expected).num_records()}")
        duck = agree(path, expected, rows_after, problems, counts, what, fix)
        if what == "append" and fix is None:
            filtered_counts(path, expected, batch, duck, problems)
    try:
        history_and_time(path, DeltaTable.open(path), problems, since=latest + 1)
    except Exception as e:
        problems.append(f"history/version_at after feedlog's writes: {type(e).__name__}: {e}")
    return problems, counts, refusal


#: the histories feedlog must refuse to write, and the feature each refusal must name
REFUSED: dict[str, str] = {
    "deletion_vectors": "deletionVectors",  # feedlog writes no DVs (README "Not supported")
    "add_feature_dv": "deletionVectors",
    "dv_checkpoint_cleanup": "deletionVectors",
    "constraint": "checkConstraints",
    "constraint_listed_and_used": "checkConstraints",
    # listed but unused: refused by choice (test_real_log_items); honouring them would need nothing
    "listed_ChangeDataFeed": "changeDataFeed",
    "listed_CheckConstraints": "checkConstraints",
    "listed_GeneratedColumns": "generatedColumns",
    "listed_VariantType": "variantType",  # writing variant tables is refused (README)
    "listed_VariantTypePreview": "variantType-preview",
    "add_feature_cdf": "changeDataFeed",
    "cdf": "changeDataFeed",
    "cdf_column_mapping": "changeDataFeed",
    "generated_columns": "generatedColumns",
    "invariants": "invariants",  # feedlog appended rows breaking a delta.invariants expression
}
FIXES: dict[str, Fix] = {"partition_binary": protocol_binary("pk")}
#: tables whose time travel is cut short by VACUUM or log cleanup: versions deltalake cannot read
SHORTENED = {
    "vacuum",
    "checkpoint_cleanup",
    "column_mapping_cleanup",
    "many_commits",
    "commit_hooks",
    "dv_checkpoint_cleanup",
    "v2_checkpoint_cleanup",
}


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_sweep(tmp_path: Path, name: str) -> None:
    path = str(tmp_path / name)
    HISTORIES[name](path)
    problems, counts, refusal = sweep(path, FIXES.get(name))
    assert problems == []
    assert counts["versions"] >= 2
    assert (counts["deltalake_refused"] > 0) == (name in SHORTENED)
    if name in REFUSED:
        assert refusal is not None and "writing refused" in refusal and repr(REFUSED[name]) in refusal
    else:
        assert refusal is None
        append_only = name in ("set_properties", "append_only")
        assert (counts["written"], counts["append_only_refused"]) == ((4, 1) if append_only else (5, 0))


def test_long_partition_values_are_appended(tmp_path: Path) -> None:
    """A partition value whose quoted directory name passes the file system's 255 bytes (35 CJK
    characters quote to 315) failed with a retryable Unavailable ('File name too long'; delta-rs
    fails the same way): the file goes to the table's root, and its partition values, as always,
    come from the log."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"k": ["short"], "x": pa.array([1], pa.int64())}), partition_by=["k"])
    long_values = ["数据湖表分区值" * 5, "a" * 300, "/" * 80]
    DeltaTable.open(path).append(pa.table({"k": long_values, "x": pa.array([2, 3, 4], pa.int64())}))
    write_deltalake(path, pa.table({"k": ["short"], "x": pa.array([5], pa.int64())}), mode="append")
    problems: list[str] = []
    counts = dict.fromkeys(("duckdb_agreed", "duckdb_refused", *DISAGREED), 0)
    for v in (1, 2):
        agree(path, v, DeltaTable.open(path).to_arrow(v), problems, counts)
    assert problems == []
    assert counts["duckdb_agreed"] == 2
    assert sorted(DeltaTable.open(path).to_arrow().column("k").to_pylist()) == sorted([*long_values, "short", "short"])


ON_S3 = ["special_names", "column_mapping_name", "checkpoint_cleanup", "random_prefixes", "partition_timestamp"]


def test_sweep_tables_copied_to_an_object_store(tmp_path: Path, s3_server: S3Server) -> None:
    """delta-rs tables copied key for key to moto's S3 server read at every version as they do
    locally (the same rows, or the same refusal), and feedlog appends there too, a partition value
    whose directory name would be too long included: deltalake reads each append from S3 alike."""
    import deltalake

    client = s3_server.client()
    options = {**s3_server.options, "timeout": "10s", "max_retries": "1"}
    for name in ON_S3:
        local_path = tmp_path / name
        HISTORIES[name](str(local_path))
        url = s3_server.url(name)
        prefix = url.removeprefix(f"s3://{s3_server.bucket}/")
        for f in sorted(p for p in local_path.rglob("*") if p.is_file()):
            client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/{f.relative_to(local_path)}", Body=f.read_bytes())
        local, remote = DeltaTable.open(local_path), DeltaTable.open(url, storage_options=s3_server.options)
        for v in range(local.version() + 1):
            try:
                want: Any = canon(local.to_arrow(v))
            except FeedlogError as e:
                want = type(e)
            try:
                got: Any = canon(remote.to_arrow(v))
            except FeedlogError as e:
                got = type(e)
            assert got == want, f"{name} v{v}"
        batch = local.to_arrow().slice(0, 1)
        for column in local.snapshot().partition_columns:
            if pa.types.is_string(batch.schema.field(column).type):
                i = batch.column_names.index(column)
                batch = batch.set_column(i, batch.schema.field(column), pa.array(["数据湖表分区值" * 5]))
        remote.append(batch)
        dl = deltalake.DeltaTable(url, storage_options=options)
        theirs = pa.table(deltalake.QueryBuilder().register("t", dl).execute("select * from t").read_all())
        assert canon(DeltaTable.open(url, storage_options=s3_server.options).to_arrow()) == canon(theirs), name
