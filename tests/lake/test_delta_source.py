"""The feedlog-delta Spark reader on real local Spark: every version as deltalake reads it, time travel by
in-commit timestamp as `feedlog table version-at` resolves it, file pruning, and streams of new commits."""

from __future__ import annotations

import datetime as dt
import os
import pickle
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, Filter, GreaterThan, GreaterThanOrEqual, In, IsNull, LessThan
from pyspark.sql.types import StructType

from feedlog.cli import main as cli_main
from feedlog.delta import DeltaTable
from feedlog.errors import InvalidArgument, NotFound, Unsupported
from feedlog.lake.delta_source import (
    DeltaBatchReader,
    DeltaStreamReader,
    FilesPartition,
    SkippingDeltaBatchReader,
    prune,
)
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.sink import DeltaSink

from ..delta.conftest import SCHEMA, T0, deltalake_read, rows
from .conftest import append, make_feed

pytestmark = pytest.mark.slow
quiet = lambda _msg: None  # noqa: E731
FMT = "feedlog-delta"


def batch(options: CaseInsensitiveDict) -> DeltaBatchReader:
    """The batch reader Spark gets from the data source (in Spark's planning worker; here in-process)."""
    reader = DeltaSink(options).reader(StructType())
    assert isinstance(reader, DeltaBatchReader)
    return reader


def streaming(options: CaseInsensitiveDict) -> DeltaStreamReader:
    reader = DeltaSink(options).streamReader(StructType())
    assert isinstance(reader, DeltaStreamReader)
    return reader


def as_rows(table: Any, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples, timestamps as UTC microseconds (Spark and Arrow agree on those)."""
    t = pa.table(table)
    names = columns or t.column_names
    cols = []
    for n in names:
        c = t.column(n)
        if pa.types.is_timestamp(c.type):
            c = c.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        cols.append(c.to_pylist())
    return sorted(zip(*cols, strict=True), key=repr)


def spark_rows(df: Any) -> list[tuple[Any, ...]]:
    return as_rows(df.toArrow())


def read(spark: Any, path: Path | str, **options: Any) -> Any:
    r = spark.read.format(FMT)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(str(path))


def cli_version_at(capsys: pytest.CaptureFixture[str], path: Path, ts: int) -> int | None:
    """`feedlog table version-at PATH TS`: the version, or None when it exits non-zero (no version then)."""
    capsys.readouterr()
    code = cli_main(["table", "version-at", str(path), str(ts)])
    out = capsys.readouterr().out.strip()
    return int(out) if code == 0 else None


def build_history(path: Path) -> DeltaTable:
    """A table without ICT for its first versions, then ICT enabled: appends on two partitions, an
    overwrite, a checkpoint. Every version's rows differ from every other's but v5's (ICT on) from v4's."""
    t = DeltaTable.create(path, SCHEMA, partition_by=["p"], in_commit_timestamps=False)  # v0
    t.append(rows(0, 5, "a"))  # v1
    t.append(rows(5, 5, "b"))  # v2
    t.append(rows(10, 3, "a"), mode="overwrite")  # v3
    t.append(rows(13, 4, "b"))  # v4
    t.enable_ict()  # v5: the boundary
    t.append(rows(17, 6, "a"))  # v6
    t.append(rows(23, 2, "b"))  # v7
    t.checkpoint()
    t.append(rows(25, 3, "a"))  # v8
    return t


def test_every_version_and_timestamp_as_deltalake_and_version_at(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t"
    t = build_history(path)
    e = t.ict_enablement()
    assert e is not None and e.version == 5 and e.timestamp is not None
    latest = t.version()
    cols = SCHEMA.names
    by_version = {}
    for v in range(latest + 1):
        expected = as_rows(deltalake_read(path, v), cols)
        got = spark_rows(read(spark, path, versionAsOf=v).select(*cols))
        assert got == expected, f"version {v}"
        by_version[v] = expected
    # rows name their version, but for the enablement commit's (it changes a property, not data)
    assert by_version[5] == by_version[4]
    assert len({repr(r) for v, r in by_version.items() if v != 5}) == latest
    assert spark_rows(read(spark, path).select(*cols)) == by_version[latest]

    # timestamps around every commit's time, on both sides of the ICT enablement: the reader resolves
    # each as the CLI does (planned in this process, as Spark's planning worker runs it) ...
    times = {h.version: h.timestamp for h in t.history()}
    assert all(h.in_commit_timestamp is None for h in t.history() if h.version < 5)
    sweep = sorted({c + d for c in times.values() for d in (-1, 0, 1)} | {e.timestamp - 1, e.timestamp})
    resolved = {}
    for ts in sweep:
        want = cli_version_at(capsys, path, ts)
        assert want == (t.version_at(ts) if ts >= times[0] else None)
        options = CaseInsensitiveDict({"path": str(path), "timestampAsOf": str(ts)})
        if want is None:  # before the first commit: the reader refuses as the CLI does
            with pytest.raises(NotFound, match="before the earliest"):
                batch(options)
            continue
        assert batch(options).version == want, f"timestampAsOf {ts}"
        resolved[ts] = want
    assert set(resolved.values()) == set(range(latest + 1))  # the sweep met every version
    # ... and Spark reads those versions' rows: at the boundary, at each side of it, and at the ends
    for ts in (times[0], times[4], e.timestamp - 1, e.timestamp, times[6] - 1, times[latest] + 1):
        got = spark_rows(read(spark, path, timestampAsOf=str(ts)).select(*cols))
        assert got == by_version[resolved[ts]], f"timestampAsOf {ts}: expected version {resolved[ts]}"
    with pytest.raises(Exception, match="before the earliest"):
        read(spark, path, timestampAsOf=str(times[0] - 1)).count()
    # an ISO 8601 timestamp (ms precision) resolves like its milliseconds
    iso = dt.datetime.fromtimestamp(times[6] / 1000, dt.UTC).isoformat(timespec="milliseconds")
    assert spark_rows(read(spark, path, timestampAsOf=iso).select(*cols)) == by_version[6]


def test_feedlog_table_ingested_every_version_and_pruning(spark: Any, tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 300, batch=100)
    table = tmp_path / "table"
    for _ in range(3):  # three ingest commits, 300 entries each
        ingest_batch(spark, [str(tmp_path / "feed")], str(table), progress=quiet)
        append(feed, 300, batch=100)
    t = DeltaTable.open(table)
    assert t.version() == 3
    for v in range(t.version() + 1):
        assert spark_rows(read(spark, table, versionAsOf=v)) == as_rows(deltalake_read(table, v)), v

    # without dataSkipping (the default) one DataFrame answers filtered and unfiltered queries alike
    plain = read(spark, table)
    assert [plain.filter("seq > 650").count(), plain.count(), plain.filter("seq < 11").count()] == [250, 900, 10]

    files = t.snapshot().files()
    df = read(spark, table, maxPartitionBytes=1, dataSkipping="true")  # a task per file: tasks count files
    assert df.rdd.getNumPartitions() == len(files) == 3
    # seqs 1..300 came in the first commit's file, 301..600 in the second's, 601..900 in the third's
    assert df.filter("seq > 650").rdd.getNumPartitions() == 1
    assert df.filter("seq >= 290 AND seq < 310").rdd.getNumPartitions() == 2
    assert df.filter("seq IN (5, 7)").rdd.getNumPartitions() == 1
    # no file can match: Spark still runs one task, given no files (checked below with the files gone)
    nothing = [df.filter("seq > 5000"), df.filter("timestamp IS NULL")]  # exact timestamps: no nulls
    assert [d.rdd.getNumPartitions() for d in nothing] == [1, 1]
    # writer timestamps: the third file's rows are newer than any of the first two files'
    third_min = min(r["timestamp"] for r in t.to_arrow().to_pylist() if r["seq"] > 600)
    newer = df.filter(df["timestamp"] >= third_min)
    assert newer.rdd.getNumPartitions() == 1
    assert newer.count() == 300

    # Files not planned are not read: remove the two old files and the pruned query still answers
    first_two = sorted(files, key=lambda a: min_seq(a))[:2]
    for a in first_two:
        os.remove(table / urllib.parse.unquote(a.path))
    assert sorted(r.seq for r in df.filter("seq > 895").select("seq").collect()) == [896, 897, 898, 899, 900]
    assert newer.count() == 300
    with pytest.raises(Exception, match=r"No such file|NotFound|not found"):
        df.filter("seq > 10").count()
    os.remove(table / urllib.parse.unquote(next(a for a in files if a not in first_two).path))
    assert [d.count() for d in nothing] == [0, 0]
    with pytest.raises(Exception, match=r"No such file|NotFound|not found"):
        read(spark, table).count()


def min_seq(a: Any) -> int:
    import json

    return int(json.loads(a.stats)["minValues"]["seq"])


def test_pruning_by_partition_values_and_stats(tmp_path: Path) -> None:
    """The planner alone (what the reader's pushFilters and partitions run), on every kind of filter."""
    t = DeltaTable.create(tmp_path / "t", SCHEMA, partition_by=["p"])
    for i in range(6):
        t.append(rows(i * 10, 10, "ab"[i % 2]))
    files = t.snapshot().files()
    seq_of = {a.path: min_seq(a) for a in files}

    def kept(*filters: Any) -> list[int]:
        return sorted(seq_of[a.path] for a in prune(files, list(filters), SCHEMA))

    assert kept(GreaterThan(("seq",), 35)) == [30, 40, 50]
    assert kept(LessThan(("seq",), 10)) == [0]
    assert kept(GreaterThanOrEqual(("seq",), 19), LessThan(("seq",), 21)) == [10, 20]
    assert kept(In(("p",), ("b",))) == [10, 30, 50]
    assert kept(In(("seq",), (3, 44))) == [0, 40]
    assert kept(IsNull(("seq",))) == []
    assert kept(IsNull(("nope",))) == [0, 10, 20, 30, 40, 50]  # unknown column: keep everything
    # ts = T0 + seq ms. Stats hold timestamps truncated to the ms, so a max of T0 + 29 ms stands for
    # anything up to T0 + 29.999 ms: the file with seqs 20..29 is kept for ts >= T0 + 29.5 ms
    ms29 = dt.datetime.fromtimestamp((T0 + 29) / 1000, dt.UTC)
    assert kept(GreaterThanOrEqual(("ts",), ms29 + dt.timedelta(microseconds=500))) == [20, 30, 40, 50]
    assert kept(GreaterThan(("ts",), ms29 + dt.timedelta(microseconds=999))) == [30, 40, 50]
    assert kept(LessThan(("ts",), ms29 - dt.timedelta(milliseconds=9))) == [0, 10]  # min of 20..29 is T0 + 20

    # bounds that are not bounds: a string max cut to a prefix (writers cut string stats at 32
    # characters), a decimal written as a float (delta-rs) that has lost digits
    from feedlog.lake.delta_source import _stat_value

    long = "f" * 40
    assert _stat_value(long[:32], pa.string(), upper=False) == long[:32]  # a cut min is still a lower bound
    assert _stat_value(long[:32], pa.string(), upper=True) is None
    assert _stat_value("abc", pa.string(), upper=True) == "abc"
    assert _stat_value(1.234567890123457e19, pa.decimal128(38, 0), upper=True) is None
    assert _stat_value("12345678901234567890", pa.decimal128(38, 0), upper=True) == 12345678901234567890

    # through the reader, as Spark drives it
    options = CaseInsensitiveDict({"path": str(tmp_path / "t"), "maxPartitionBytes": "1", "dataSkipping": "true"})
    reader = batch(options)
    assert isinstance(reader, SkippingDeltaBatchReader)
    pushed: list[Filter] = [GreaterThan(("seq",), 49)]
    assert list(reader.pushFilters(pushed)) == pushed  # Spark still filters the rows
    parts = reader.partitions()
    assert len(parts) == 1 and isinstance(parts[0], FilesPartition)
    batches = list(reader.read(parts[0]))
    assert sorted(s for b in batches for s in b.column("seq").to_pylist()) == list(range(50, 60))


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    t = DeltaTable.create(tmp_path / "t", SCHEMA)
    t.append(rows(0, 3))
    p = str(tmp_path / "t")

    def opts(**kw: str) -> CaseInsensitiveDict:
        return CaseInsensitiveDict({"path": p, **kw})

    with pytest.raises(InvalidArgument, match="versionAsOf or timestampAsOf, not both"):
        batch(opts(versionAsOf="0", timestampAsOf="0"))
    with pytest.raises(InvalidArgument, match="bad timestamp"):
        batch(opts(timestampAsOf="yesterday"))
    with pytest.raises(InvalidArgument, match="versionAsOf must be an integer"):
        batch(opts(versionAsOf="one"))
    with pytest.raises(InvalidArgument, match="needs option startingVersion"):
        batch(opts(readChangeFeed="true"))
    with pytest.raises(InvalidArgument, match="for batch reads"):
        streaming(opts(versionAsOf="0"))
    with pytest.raises(InvalidArgument, match="maxFilesPerTrigger must be >= 1"):
        streaming(opts(maxFilesPerTrigger="0"))
    with pytest.raises(InvalidArgument, match="startingVersion or startingTimestamp"):
        streaming(opts(startingVersion="0", startingTimestamp="0"))
    with pytest.raises(InvalidArgument, match="needs a table path"):
        batch(CaseInsensitiveDict({}))
    with pytest.raises(Exception, match="no Delta table"):
        batch(CaseInsensitiveDict({"path": str(tmp_path / "none")}))
    # a change feed over deletion vectors (whose commits swap a file's DV) is refused, not approximated
    dv = DeltaTable.create(tmp_path / "dv", SCHEMA, in_commit_timestamps=False)
    dv.append(rows(0, 3))
    protocol = (
        '{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],'
        '"writerFeatures":["deletionVectors"]}}\n'
    )
    (tmp_path / "dv" / "_delta_log" / f"{2:020d}.json").write_text('{"commitInfo":{"timestamp":1}}\n' + protocol)
    batch(CaseInsensitiveDict({"path": str(tmp_path / "dv")}))  # a plain read is fine
    with pytest.raises(Unsupported, match="deletionVectors"):
        batch(CaseInsensitiveDict({"path": str(tmp_path / "dv"), "readChangeFeed": "true", "startingVersion": "0"}))


def test_deletion_vectors_and_column_mapping_are_applied_as_the_library_reads(spark: Any, tmp_path: Path) -> None:
    """Tables no one here wrote: deletion vectors (inline and on disk) and a column-mapped partitioned
    table read through Spark give every version's rows as feedlog's library and deltalake read them."""
    from ..delta.test_real_data_dv import DV_PROTOCOL, FIELDS, inline, on_disk, remove, with_dv
    from ..delta.test_real_data_dv import rows as dv_rows
    from ..delta.test_real_data_scan import add, metadata, parquet_file, write_commit

    root = tmp_path / "dv"
    a = add("a.parquet", parquet_file(root, "a.parquet", dv_rows(0, 10)), 10)
    b = add("b.parquet", parquet_file(root, "b.parquet", dv_rows(100, 5)), 5)
    write_commit(root, 0, [DV_PROTOCOL, metadata(FIELDS, None, **{"delta.enableDeletionVectors": "true"}), a, b])
    dv1 = inline([0, 9])
    write_commit(root, 1, [with_dv(a, dv1), remove(a)])
    (dv2,) = on_disk(root, [[0, 3, 9]])
    write_commit(root, 2, [remove(a, dv1), with_dv(a, dv2)])
    t = DeltaTable.open(root)
    for v in range(3):
        got = spark.read.format("feedlog-delta").option("versionAsOf", str(v)).load(str(root))
        xs = sorted(r["x"] for r in got.collect())
        assert xs == sorted(t.to_arrow(v).column("x").to_pylist()), v
        assert xs == sorted(deltalake_read(root, v).column("x").to_pylist()), v
    assert sorted(r["x"] for r in spark.read.format("feedlog-delta").load(str(root)).collect()) == [
        1, 2, 4, 5, 6, 7, 8, 100, 101, 102, 103, 104
    ]  # fmt: skip


class Batches:
    """What a streaming query delivered, micro-batch by micro-batch (foreachBatch, on the driver)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[dict[str, Any]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = df.toArrow().to_pylist()  # timestamps aware, in UTC

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]

    def with_rows(self) -> list[int]:
        return sorted(b for b, rs in self.batches.items() if rs)


def stream(spark: Any, path: Path | str, sink: Batches, ckpt: Path, trigger: dict[str, Any], **options: Any) -> Any:
    r = spark.readStream.format(FMT)
    for k, v in options.items():
        r = r.option(k, v)
    return (
        r.load(str(path))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(ckpt))
        .trigger(**trigger)
        .start()
    )


def us(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_stream_change_feed_available_now(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = build_history(path)  # v0..v8; v3 is an overwrite (removes files), v5 enables ICT
    ict = {h.version: h.timestamp for h in t.history()}
    assert all(h.in_commit_timestamp == h.timestamp for h in t.history() if h.version >= 5)
    out = Batches()
    q = stream(spark, path, out, tmp_path / "ck", {"availableNow": True}, readChangeFeed="true", startingVersion=4)
    assert q.awaitTermination(60)
    got = sorted((r["seq"], r["_change_type"], r["_commit_version"], r["_commit_timestamp"]) for r in out.rows)
    want = [(s, "insert", 4, ict[4]) for s in range(13, 17)] + [(s, "insert", 6, ict[6]) for s in range(17, 23)]
    want += [(s, "insert", 7, ict[7]) for s in range(23, 25)] + [(s, "insert", 8, ict[8]) for s in range(25, 28)]
    assert got == [(s, c, v, us(ms)) for s, c, v, ms in want]  # the commit's ICT (file time before v5)

    # a commit made after the run: the next availableNow run, from the checkpoint, reads it alone
    t.append(rows(100, 2, "b"))  # v9
    again = Batches()
    q = stream(spark, path, again, tmp_path / "ck", {"availableNow": True}, readChangeFeed="true", startingVersion=4)
    assert q.awaitTermination(60)
    assert sorted((r["seq"], r["_commit_version"]) for r in again.rows) == [(100, 9), (101, 9)]

    # the overwrite at v3 reads as deletes of the files it removed, then inserts
    v3 = Batches()
    q = stream(spark, path, v3, tmp_path / "ck3", {"availableNow": True}, readChangeFeed="true", startingVersion=3)
    assert q.awaitTermination(60)
    assert sorted((r["_change_type"], r["seq"]) for r in v3.rows if r["_commit_version"] == 3) == sorted(
        [("delete", s) for s in range(0, 10)] + [("insert", s) for s in range(10, 13)]
    )


def test_stream_starting_timestamp_across_ict_enablement_and_file_limit(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = build_history(path)
    times = {h.version: h.timestamp for h in t.history()}
    limits = {4: {"maxFilesPerTrigger": 1}, 5: {"maxFilesPerTrigger": 1}, 6: {"maxBytesPerTrigger": 1}}
    for v in (4, 5, 6):  # before, at and after the enablement (v5)
        out = Batches()
        q = stream(
            spark,
            path,
            out,
            tmp_path / f"ck{v}",
            {"availableNow": True},
            readChangeFeed="true",
            startingTimestamp=str(times[v]),
            **limits[v],  # a byte limit below one file's size reads one file per micro-batch too
        )
        assert q.awaitTermination(60)
        versions = sorted({r["_commit_version"] for r in out.rows})
        first = 6 if v == 5 else v  # v5 (enable ICT) adds no rows
        assert versions == [x for x in (4, 6, 7, 8) if x >= first]
        # each of those commits added one file, and each micro-batch reads one file
        assert len(out.with_rows()) == len(versions)
        assert all(len({r["_commit_version"] for r in out.batches[b]}) == 1 for b in out.with_rows())


def test_plain_stream_snapshot_then_new_commit_within_one_trigger(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = DeltaTable.create(path, SCHEMA, partition_by=["p"])
    t.append(rows(0, 5, "a"))
    t.append(rows(5, 5, "b"))
    out = Batches()
    q = stream(spark, path, out, tmp_path / "ck", {"processingTime": "1 second"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(out.rows) < 10:
            time.sleep(0.1)
        assert sorted(r["seq"] for r in out.rows) == list(range(10))  # the table as of the start
        assert set(out.rows[0]) == set(SCHEMA.names)  # a plain stream: the table's columns
        before = max(out.batches)
        t.append(rows(10, 3, "a"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(out.rows) < 13:
            time.sleep(0.05)
        assert sorted(r["seq"] for r in out.rows) == list(range(13))
        # the commit lands in the micro-batch after the last one before it (or the one running then)
        assert out.with_rows()[-1] <= before + 2
        # an overwrite stops a plain stream (as delta-spark's does) rather than replaying the table
        t.append(rows(20, 1, "a"), mode="overwrite")
        with pytest.raises(Exception, match="skipChangeCommits"):
            q.awaitTermination(30)
            raise AssertionError("the stream kept running past an overwrite")
    finally:
        q.stop()


def test_batch_change_feed_of_a_version_range(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = build_history(path)
    times = {h.version: h.timestamp for h in t.history()}
    cdf = read(spark, path, readChangeFeed="true", startingVersion=3, endingVersion=4).toArrow().to_pylist()
    assert sorted((r["_commit_version"], r["_change_type"], r["seq"]) for r in cdf) == sorted(
        [(3, "delete", s) for s in range(10)]
        + [(3, "insert", s) for s in range(10, 13)]
        + [(4, "insert", 13)]
        + [(4, "insert", s) for s in range(14, 17)]
    )
    assert {r["_commit_timestamp"] for r in cdf} == {us(times[3]), us(times[4])}
    # by time: from the first commit at or after startingTimestamp to the last at or before endingTimestamp
    by_time = read(
        spark, path, readChangeFeed="true", startingTimestamp=str(times[6]), endingTimestamp=str(times[7])
    ).toArrow()
    assert sorted(set(by_time.column("_commit_version").to_pylist())) == [6, 7]


def test_managed_table_on_s3_reads_commits_only_its_trusted_owner_holds(
    spark: Any, s3_server: Any, tmp_path: Path
) -> None:
    from feedlog.delta.managed import Binding

    url = s3_server.url("reader")
    db = str(tmp_path / "owner.db")
    binding = Binding.feedlog(db=db, batch_size=3)
    token = "reader-test-token"
    t = DeltaTable.create(url, SCHEMA, owner=binding, owner_token=token, storage_options=s3_server.options)
    for v in range(1, 6):
        t.append(rows(v * 10, 3))
    store = {f"storage.{k}": v for k, v in s3_server.options.items()}
    # backfills in threes: versions 0..3 are in the log, 4 and 5 only with the owner (deltalake sees 3)
    assert int(__import__("deltalake").DeltaTable(url, storage_options=s3_server.options).version()) == 3
    trusted = read(spark, url, owner=db, ownerToken=token, **store)
    assert spark_rows(trusted) == as_rows(t.to_arrow())
    assert trusted.count() == 15
    assert read(spark, url, owner=db, ownerToken=token, versionAsOf=4, **store).count() == 12
    # what tasks are sent (the reader, pickled with its read function) holds no owner token
    planned = batch(CaseInsensitiveDict({"path": url, "owner": db, "ownerToken": token, **store}))
    assert planned.version == 5
    assert token.encode() not in pickle.dumps(planned)
    stream_reader = streaming(CaseInsensitiveDict({"path": url, "owner": db, "ownerToken": token, **store}))
    assert token.encode() not in pickle.dumps(stream_reader)
    # a reader that does not trust the owner reads the backfilled log, as any Delta reader does
    assert spark_rows(read(spark, url, **store)) == as_rows(deltalake_read_s3(url, s3_server.options), SCHEMA.names)
    # a stream with the owner picks up commits the owner has not backfilled yet
    out = Batches()
    q = stream(
        spark,
        url,
        out,
        tmp_path / "ck",
        {"availableNow": True},
        owner=db,
        ownerToken=token,
        startingVersion=4,
        readChangeFeed="true",
        **store,
    )
    assert q.awaitTermination(60)
    assert sorted({r["_commit_version"] for r in out.rows}) == [4, 5]


def deltalake_read_s3(url: str, options: dict[str, str]) -> pa.Table:
    import deltalake

    dt_ = deltalake.DeltaTable(url, storage_options=options)
    return pa.table(deltalake.QueryBuilder().register("t", dt_).execute("select * from t").read_all())


def test_timestamp_and_string_partitions_read_and_skip(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = DeltaTable.create(path, SCHEMA, partition_by=["ts", "p"])
    t.append(pa.concat_tables([rows(0, 3, "a"), rows(3, 2, "b")]))
    assert len(t.snapshot().files()) == 5  # one per (ts, p)
    assert spark_rows(read(spark, path)) == as_rows(deltalake_read(path), SCHEMA.names)
    df = read(spark, path, dataSkipping="true", maxPartitionBytes=1)
    second = df.filter(df["ts"] == us(T0 + 1))
    assert second.rdd.getNumPartitions() == 1
    assert [r.seq for r in second.collect()] == [1]
    assert df.filter("p = 'b'").rdd.getNumPartitions() == 2
    assert df.filter(df["ts"] >= us(T0 + 3)).rdd.getNumPartitions() == 2
