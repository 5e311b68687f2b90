"""The Spark pipeline for real: local Spark, peers and a commit owner on 127.0.0.1, Delta readers we did not write."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog import failpoints
from feedlog.delta import DeltaTable
from feedlog.errors import Corruption, FeedlogError, InvalidArgument, Unavailable
from feedlog.lake import ROW_BOUNDED_BATCHES, sql_settings
from feedlog.lake.audit import audit_table
from feedlog.lake.expire import expire
from feedlog.lake.ingest import ingest_batch, ingest_stream
from feedlog.lake.rows import SCHEMA
from feedlog.lake.sink import app_id
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer
from feedlog_server.host import FeedHost
from feedlog_server.owner import OwnerServer
from feedlog_server.rpc import rpc_handler, start_server
from feedlog_server.service import FeedsService

from ..delta.conftest import deltalake_read, duckdb_read
from ..delta.s3 import S3Server
from .conftest import KEY_A, KEY_B, append, make_feed

pytestmark = pytest.mark.slow
quiet = lambda _msg: None  # noqa: E731


def url(peer: Any, key: bytes) -> str:
    return f"grpc://{peer.address}/{key.hex()}"


def wait_length(address: str, key: bytes, length: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    with FeedClient(address) as c:
        while time.monotonic() < deadline:
            try:
                if c.info(key).state.length >= length:
                    return
            except Exception:
                pass
            time.sleep(0.05)
    raise AssertionError(f"{address} did not reach length {length}")


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[OwnerServer]:
    server = OwnerServer(tmp_path / "owner.db", roots=[tmp_path]).start()
    yield server
    server.stop()


def seqs(table: Path, key: bytes | None = None) -> list[int]:
    rows = DeltaTable.open(table).to_arrow().to_pylist()
    return sorted(r["seq"] for r in rows if key is None or r["feed"] == key.hex())


def test_peer_to_managed_table_end_to_end(spark, tmp_path: Path, owner: OwnerServer) -> None:
    feed = make_feed(tmp_path / "feed", 1000, batch=100)
    first = PeerServer(tmp_path / "peer1").start()
    second = None
    try:
        push(tmp_path / "feed", Address.parse(f"grpc://{first.address}"), token=first.token)
        second = PeerServer(tmp_path / "peer2", follow=[Address.parse(url(first, KEY_A.public_key))]).start()
        wait_length(second.address, KEY_A.public_key, feed.length)
        table = tmp_path / "table"
        src = url(second, KEY_A.public_key)
        failpoints.arm("owner.backfill.background=error")  # the owner's background backfill fails once
        r1 = ingest_batch(spark, [src], str(table), owner=owner.endpoint, progress=quiet)
        assert (r1.version, r1.rows) == (1, 1000)
        # the served owner backfills in the background, but a job ends with its commit in the log
        assert (table / "_delta_log" / f"{1:020d}.json").exists()
        failpoints.arm("")

        append(feed, 234, batch=50)
        push(tmp_path / "feed", Address.parse(f"grpc://{first.address}"), token=first.token)
        wait_length(second.address, KEY_A.public_key, feed.length)
        r2 = ingest_batch(spark, [src], str(table), owner=owner.endpoint, progress=quiet)
        assert (r2.version, r2.rows) == (2, 234)
        assert (table / "_delta_log" / f"{2:020d}.json").exists()
        again = ingest_batch(spark, [src], str(table), owner=owner.endpoint, progress=quiet)
        assert (again.version, again.rows) == (None, 0)

        t = DeltaTable.open(table, owner=owner.endpoint)  # readers ask only an owner they trust
        info = t.info()
        assert info["commit_owner"] == {"endpoint": owner.endpoint}
        assert "inCommitTimestamp" in info["features"] and "managedCommits" in info["features"]
        hist = t.history()
        assert [h.version for h in hist] == [2, 1, 0]
        assert all(h.in_commit_timestamp for h in hist)
        prov = hist[0].commit_info["feedlog"]["feeds"][0]
        assert prov["key"] == KEY_A.public_key.hex() and (prov["from"], prov["to"]) == (1001, 1235)
        assert prov["signed"]["length"] == 1235 == feed.length
        assert prov["signed"]["signature"] == feed.core.state.signature.hex()
        assert t.txn_version(app_id(KEY_A.public_key.hex())) == 1235

        expected = [(r.seq, r.key, r.value) for r in feed.records()]
        for read in (deltalake_read, duckdb_read):
            got = sorted((r["seq"], r["key"], r["value"]) for r in read(table).to_pylist())
            assert got == expected
        assert audit_table(str(table), [KEY_A.public_key]).ok
    finally:
        failpoints.arm("")
        for p in (second, first):
            if p is not None:
                p.stop(grace=1)
        feed.close()


def test_streaming_available_now_across_runs(spark, tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 300, batch=100)
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    kw: dict[str, Any] = dict(checkpoint_location=str(ckpt), available_now=True, progress=quiet, timeout=120)
    r = ingest_stream(spark, [str(tmp_path / "feed")], str(table), **kw)
    assert r.rows == 300
    assert seqs(table) == list(range(1, 301))
    for round_ in range(2):
        append(feed, 70 + round_, batch=30)
        ingest_stream(spark, [str(tmp_path / "feed")], str(table), **kw)
        assert seqs(table) == list(range(1, feed.length))
    nothing = ingest_stream(spark, [str(tmp_path / "feed")], str(table), **kw)
    assert nothing.rows == 0
    assert audit_table(str(table), [KEY_A.public_key]).ok
    feed.close()


class TamperingFeeds(FeedsService):  # type: ignore[misc]
    """A malicious peer: serves its real feed, but with one byte of block `victim` changed."""

    victim = 150

    def Read(self, request: Any, context: Any) -> Iterator[feeds_pb2.ReadResponse]:
        for raw in super().Read(request, context):  # messages come encoded (the peer holds them that way)
            resp = feeds_pb2.ReadResponse.FromString(raw)
            for seg in resp.segments:
                k = self.victim - seg.start
                if 0 <= k < len(seg.blocks) and seg.blocks[k]:
                    b = bytearray(seg.blocks[k])
                    b[-1] ^= 1
                    seg.blocks[k] = bytes(b)
            yield resp


@contextlib.contextmanager
def tampering_peer(data: Path, victim: int) -> Iterator[int]:
    """A `TamperingFeeds` peer over the feeds under `data` on 127.0.0.1, altering block `victim`: its port."""
    host = FeedHost(data)
    service = TamperingFeeds(host)
    service.victim = victim
    server, port, _health = start_server(
        "127.0.0.1:0", [rpc_handler(service, feeds_pb2, "Feeds")], [], tls=None, workers=8, max_message_bytes=64 << 20
    )
    try:
        yield port
    finally:
        server.stop(1)
        host.close()


def test_a_tampered_block_fails_the_job_and_leaves_the_table(spark, tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 300, batch=100)
    table = tmp_path / "table"
    ingest_batch(spark, [str(tmp_path / "feed")], str(table), progress=quiet)
    append(feed, 200, batch=100)
    feed.close()
    honest = PeerServer(tmp_path / "peer").start()
    push(tmp_path / "feed", Address.parse(f"grpc://{honest.address}"), token=honest.token)
    honest.stop(grace=1)
    with tampering_peer(tmp_path / "peer", victim=350) as port:
        before = DeltaTable.open(table).version()
        files_before = sorted(p.name for p in table.glob("*.parquet"))
        with pytest.raises(Corruption, match="do not hash to the signed tree"):
            ingest_batch(spark, [f"grpc://127.0.0.1:{port}/{KEY_A.public_key.hex()}"], str(table), progress=quiet)
        assert DeltaTable.open(table).version() == before
        assert sorted(p.name for p in table.glob("*.parquet")) == files_before
        assert seqs(table) == list(range(1, 301))


def test_a_job_reports_its_own_commit_when_another_job_commits_after_it(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs on one table: the one that committed first reports its own version and ICT, not
    "another job had landed these entries" (it looked only at the newest commit)."""
    make_feed(tmp_path / "a", 30, kp=KEY_A).close()
    feed_b = make_feed(tmp_path / "b", 20, kp=KEY_B)
    table = tmp_path / "table"
    assert ingest_batch(spark, [str(tmp_path / "b")], str(table), progress=quiet).version == 1
    append(feed_b, 10)
    feed_b.close()
    armed, rivals = [False], list[int]()

    from feedlog.lake.sink import TableRef

    real_open, real_version = TableRef.open, TableRef.version

    def rival_first(self: TableRef) -> DeltaTable:  # the job's table handle, as ingest_batch asks for it
        if armed[0]:  # job a has committed; job b commits before job a looks for its commit
            armed[0] = False
            assert ingest_batch(spark, [str(tmp_path / "b")], str(table), progress=quiet).version == 3
        return real_open(self)

    def version_then_arm(self: TableRef) -> int:
        v = real_version(self)
        if not rivals:  # job a's: the next open in ingest_batch is the one after its Spark job
            rivals.append(1)
            armed[0] = True
        return v

    monkeypatch.setattr(TableRef, "version", version_then_arm)
    monkeypatch.setattr(TableRef, "open", rival_first)
    r = ingest_batch(spark, [str(tmp_path / "a")], str(table), progress=quiet)
    monkeypatch.undo()
    assert (r.version, r.rows) == (2, 30) and r.in_commit_timestamp is not None
    assert [h.version for h in DeltaTable.open(table).history()] == [3, 2, 1, 0]
    assert seqs(table, KEY_A.public_key) == list(range(1, 31))


def feedlog_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "feedlog.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_two_ingest_jobs_write_one_table_concurrently(tmp_path: Path, owner: OwnerServer) -> None:
    """Two `feedlog ingest` processes race on one table through the gRPC owner (each lands its feed in
    its own process, no Spark: they start within milliseconds of each other, so their commits race)."""
    make_feed(tmp_path / "a", 400, kp=KEY_A).close()
    make_feed(tmp_path / "b", 300, kp=KEY_B).close()
    table = tmp_path / "table"
    # created first, so the jobs race on commits rather than on creation
    DeltaTable.create(table, SCHEMA, owner=owner.endpoint, owner_token="t0k3n")
    (tmp_path / "token").write_text("t0k3n\n")
    jobs = [
        feedlog_cli(
            "ingest", str(tmp_path / n), str(table), "--token-file", str(tmp_path / "token"), "--owner", owner.endpoint
        )
        for n in ("a", "b")
    ]
    for j in jobs:
        out, err = j.communicate(timeout=300)
        assert j.returncode == 0, err[-2000:]
        assert "committed version" in out and "without Spark" in out
    assert sorted(h.version for h in DeltaTable.open(table).history()) == [0, 1, 2]
    assert seqs(table, KEY_A.public_key) == list(range(1, 401))
    assert seqs(table, KEY_B.public_key) == list(range(1, 301))
    assert audit_table(str(table), [KEY_A.public_key, KEY_B.public_key]).ok


def test_a_job_failing_around_its_commit_lands_every_entry_once_on_rerun(
    spark: Any, spark_failpoints: Any, tmp_path: Path
) -> None:
    """The job's tasks write their files in Spark's workers and the driver (here, this process)
    commits them. Its commit fails before, then right after, it is made; each rerun lands what is
    missing, exactly once. A task that dies outright is retried or fails the job. The last rerun
    lands without Spark: either kind of job picks up where the other stopped. (The cluster test
    kills the driver and an executor under `feedlog ingest`; test_cli_lake checks what the command
    prints when a task fails.)"""
    feed = make_feed(tmp_path / "feed", 500, batch=100)
    table = tmp_path / "table"
    source = [str(tmp_path / "feed")]
    try:
        failpoints.arm("sink.before_commit=error")  # files written by the tasks, never committed
        with pytest.raises(Unavailable, match=r"sink\.before_commit"):
            ingest_batch(spark, source, str(table), progress=quiet)
        assert seqs(table) == []
        assert not list(table.glob("*.parquet"))  # the failed commit's files are gone
        failpoints.arm("sink.committed=error")  # committed, then the job failed: the files must stay
        with pytest.raises(Unavailable, match=r"sink\.committed"):
            ingest_batch(spark, source, str(table), progress=quiet)
    finally:
        failpoints.arm("")
    assert seqs(table) == list(range(1, 501))
    append(feed, 50)
    spark_failpoints("sink.written=exit")  # the task's worker dies after writing its files
    with pytest.raises(FeedlogError, match=r"^the Spark job failed") as died:
        ingest_batch(spark, source, str(table), progress=quiet)
    spark_failpoints("")
    assert "Traceback" not in str(died.value)
    assert seqs(table) == list(range(1, 501))
    feed.close()
    said: list[str] = []
    rerun = ingest_batch(None, source, str(table), progress=said.append)
    assert rerun.rows == 50 and any("seqs 501..550, 50 new" in line for line in said), said
    assert seqs(table) == list(range(1, 551))
    assert audit_table(str(table), [KEY_A.public_key]).ok


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_ttl_compaction_keeps_the_table_auditable(spark, tmp_path: Path, engine: str) -> None:
    feed = Feed.create(tmp_path / "feed", key_pair=KEY_A, timestamps="exact")
    feed.append([Write(f"/k{i}", b"x" * 10, ttl_ms=1 if i % 3 == 0 else None) for i in range(90)])
    feed.append([Write(f"/late{i}", b"y") for i in range(10)])
    feed.close()
    table = tmp_path / "table"
    ingest_batch(spark, [str(tmp_path / "feed")], str(table), progress=quiet)
    r = expire(spark, str(table), now_ms=int(time.time() * 1000) + 10_000, engine=engine)
    assert (r.files_rewritten, r.rows_cleared, r.engine) == (1, 30, engine)
    rows = DeltaTable.open(table).to_arrow().to_pylist()
    cleared = [x for x in rows if x["cleared"]]
    assert len(cleared) == 30 and all(x["value"] is None and x["block"] is None for x in cleared)
    assert len(rows) == 100
    assert DeltaTable.open(table).history(1)[0].operation == "TTL COMPACTION"
    assert audit_table(str(table), [KEY_A.public_key]).ok
    assert expire(spark, str(table), now_ms=int(time.time() * 1000) + 10_000).rows_cleared == 0


def test_ttl_compaction_in_process_that_fails_on_one_file_leaves_no_file_and_no_commit(tmp_path: Path) -> None:
    """Without Spark the files are rewritten by threads; one failing removes the others' new files."""
    feed = Feed.create(tmp_path / "feed", key_pair=KEY_A, timestamps="exact")
    table = tmp_path / "table"
    for part in range(3):  # three ingests: three data files, each with rows that expire
        feed.append([Write(f"/k{part}.{i}", b"x", ttl_ms=1 if i % 2 else None) for i in range(10)])
        ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    feed.close()
    before = sorted(p.name for p in table.glob("*.parquet"))
    assert len(before) == 3
    later = int(time.time() * 1000) + 10_000
    try:
        failpoints.arm("expire.rewrite=error@2")
        with pytest.raises(Unavailable, match=r"expire\.rewrite"):
            expire(None, str(table), now_ms=later)
    finally:
        failpoints.arm("")
    assert sorted(p.name for p in table.glob("*.parquet")) == before
    assert DeltaTable.open(table).version() == 3
    r = expire(None, str(table), now_ms=later)  # and the next run does it all, once
    assert (r.files_rewritten, r.rows_cleared, r.engine) == (3, 15, "local")
    assert audit_table(str(table), [KEY_A.public_key]).ok
    with pytest.raises(InvalidArgument, match="needs a Spark session"):
        expire(None, str(table), engine="spark")


def test_ingest_and_expire_without_spark_on_s3(tmp_path: Path, s3_server: S3Server) -> None:
    """The in-process engines on an object store: the files are read and rewritten in the bucket
    with the table's storage options, and a second compaction of two files clears only the newer."""
    with Feed.create(tmp_path / "feed", key_pair=KEY_A, timestamps="exact") as feed:
        feed.append([Write(f"/k{i}", b"x" * 10, ttl_ms=1 if i % 3 == 0 else None) for i in range(30)])
        table, opts, db = s3_server.url("here"), s3_server.options, str(tmp_path / "owner.db")
        kw: dict[str, Any] = {"owner": db, "token": "t0k", "storage_options": opts}
        assert ingest_batch(None, [str(tmp_path / "feed")], table, progress=quiet, **kw).rows == 30
        later = int(time.time() * 1000) + 10_000
        e = expire(None, table, now_ms=later, **kw)
        assert (e.files_rewritten, e.rows_cleared, e.engine) == (1, 10, "local")
        feed.append([Write(f"/m{i}", b"y", ttl_ms=1) for i in range(5)])
    assert ingest_batch(None, [str(tmp_path / "feed")], table, progress=quiet, **kw).rows == 5
    e = expire(None, table, now_ms=later + 10_000, **kw)
    assert (e.files_rewritten, e.rows_cleared) == (1, 5)  # the first file's rows were cleared already
    rows = DeltaTable.open(table, owner=db, storage_options=opts).to_arrow().to_pylist()
    assert sorted(x["seq"] for x in rows) == list(range(1, 36)) and sum(x["cleared"] for x in rows) == 15
    assert audit_table(table, [KEY_A.public_key], owner=db, storage_options=opts).ok


def test_ingest_stream_expire_and_audit_on_s3(spark, tmp_path: Path, s3_server: S3Server, capsys) -> None:
    """The whole job on an object store: batch ingest, streaming ingest, TTL compaction and audit of a
    table on moto's S3 server, with the in-process owner whose database is on this machine's disk."""
    from feedlog.cli import main

    feed = Feed.create(tmp_path / "feed", key_pair=KEY_A, timestamps="exact")
    feed.append([Write(f"/k{i}", b"x" * 10, ttl_ms=1 if i % 3 == 0 else None) for i in range(90)])
    table = s3_server.url("lake")
    opts = s3_server.options
    db = str(tmp_path / "owner.db")
    with pytest.raises(InvalidArgument, match="embedded commit owner"):  # no default owner in a bucket
        ingest_batch(spark, [str(tmp_path / "feed")], table, storage_options=opts, progress=quiet)
    with pytest.raises(InvalidArgument, match="owner token"):  # nowhere to keep a generated token
        ingest_batch(spark, [str(tmp_path / "feed")], table, owner=db, storage_options=opts, progress=quiet)
    r = ingest_batch(
        spark, [str(tmp_path / "feed")], table, owner=db, token="t0k", storage_options=opts, progress=quiet
    )
    assert (r.version, r.rows) == (1, 90)

    feed.append([Write(f"/late{i}", b"y") for i in range(10)])
    feed.close()
    with pytest.raises(InvalidArgument, match="checkpoint location"):
        ingest_stream(spark, [str(tmp_path / "feed")], table, owner=db, token="t0k", storage_options=opts)
    s = ingest_stream(
        spark,
        [str(tmp_path / "feed")],
        table,
        owner=db,
        token="t0k",
        storage_options=opts,
        checkpoint_location=str(tmp_path / "ckpt"),
        available_now=True,
        timeout=120,
        progress=quiet,
    )
    assert s.rows == 10

    later = int(time.time() * 1000) + 10_000
    e = expire(spark, table, now_ms=later, token="t0k", owner=db, storage_options=opts, engine="spark")
    assert (e.rows_cleared, e.engine) == (30, "spark")  # executors rewrite the files in the bucket
    t = DeltaTable.open(table, owner=db, storage_options=opts)
    rows = t.to_arrow().to_pylist()
    assert sorted(x["seq"] for x in rows) == list(range(1, 101))
    assert sum(1 for x in rows if x["cleared"]) == 30
    args = ["audit", table, "--key", KEY_A.public_key.hex(), "--owner", db, "--json"]
    args += [a for k, v in opts.items() for a in ("--storage-option", f"{k}={v}")]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_land_writes_in_the_tasks_what_the_dataframe_route_writes(spark, tmp_path: Path) -> None:
    """`land` (rows never enter the JVM) gives the DataFrame route's rows and commit, exactly once; a
    block that fails to verify in one task leaves neither a commit nor the other tasks' files."""
    from feedlog.lake.land import land
    from feedlog.log import storage
    from feedlog.log.crypto import leaf_hash

    make_feed(tmp_path / "feed", 450, batch=50).close()
    where = str(tmp_path / "feed")
    read = {"feeds": where, "endingOffsets": "301", "maxEntriesPerPartition": "100"}
    r = land(spark, read, str(tmp_path / "t1"), {"jobId": "j1"})
    assert r is not None and r.version == 1
    df = spark.read.format("feedlog").options(**read).load()
    df.write.format("feedlog-delta").mode("append").save(str(tmp_path / "t2"))
    rows = [DeltaTable.open(tmp_path / t).to_arrow().sort_by("seq").to_pylist() for t in ("t1", "t2")]
    assert rows[0] == rows[1] and [x["seq"] for x in rows[0]] == list(range(1, 301))
    info = DeltaTable.open(tmp_path / "t1").history(1)[0].commit_info["feedlog"]
    assert info["job"] == "j1" and (info["feeds"][0]["from"], info["feeds"][0]["to"]) == (1, 301)
    assert land(spark, read, str(tmp_path / "t1"), {}).skipped  # type: ignore[union-attr]  # exactly once

    with Feed.open(tmp_path / "feed") as f:  # block 420 altered on disk, its stored leaf with it
        off, n, _flags = f.core._entry(420)
    with open(tmp_path / "feed" / storage.LOG, "r+b") as log:
        log.seek(off)
        block = bytearray(log.read(n))
        block[-1] ^= 1
        log.seek(off)
        log.write(block)
    with open(tmp_path / "feed" / storage.TREE, "r+b") as tree:
        tree.seek(840 * storage.NODE.size)
        tree.write(storage.NODE.pack(leaf_hash(bytes(block)), n))
    before = sorted(p.name for p in (tmp_path / "t1").glob("*.parquet"))
    rest = {"feeds": where, "startingOffsets": "301", "maxEntriesPerPartition": "50"}
    with pytest.raises(Corruption, match="do not hash to the signed tree"):
        land(spark, rest, str(tmp_path / "t1"), {})
    assert DeltaTable.open(tmp_path / "t1").version() == 1
    assert sorted(p.name for p in (tmp_path / "t1").glob("*.parquet")) == before


def test_land_a_task_failing_unforeseen_leaves_no_file_and_no_commit(spark, spark_failpoints, tmp_path: Path) -> None:
    """An error feedlog did not foresee in one task (a bug, a full disk) comes back as that task's
    answer, not as a failed Spark job: the driver still holds the other tasks' files, deletes them
    and raises one line naming the task. (A failed job would return no files to clean up.)"""
    from feedlog.lake.land import land

    make_feed(tmp_path / "feed", 500, batch=50).close()
    read = {"feeds": str(tmp_path / "feed"), "maxEntriesPerPartition": "100"}
    table = tmp_path / "t"
    spark_failpoints("land.task=bug")  # each worker process's first task fails; the others write files
    try:
        with pytest.raises(
            FeedlogError,
            match=r"^a task of the job \(feed [0-9a-f]{16}\.\.\., seqs \d+\.\.\d+\) "
            r"failed: RuntimeError: fail point land\.task \(injected\)$",
        ):
            land(spark, read, str(table), {})
    finally:
        spark_failpoints("")
    assert DeltaTable.open(table).version() == 0  # created, nothing committed
    assert not list(table.glob("*.parquet"))
    assert land(spark, read, str(table), {}).version == 1  # type: ignore[union-attr]
    assert seqs(table) == list(range(1, 501))


def test_a_task_fed_many_arrow_batches_lands_every_row_and_the_newest_signed_state(spark, tmp_path: Path) -> None:
    # ROW_BOUNDED_BATCHES, set for this job only (SQL settings): batches of 1,000 rows, no byte bound
    with sql_settings(spark, ROW_BOUNDED_BATCHES):
        per_batch = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))
        n = 2 * per_batch + 345
        feed = make_feed(tmp_path / "feed", n, batch=250)
        feed.close()
        df = spark.read.format("feedlog").option("feed", str(tmp_path / "feed")).load().coalesce(1)
        df.write.format("feedlog-delta").mode("append").save(str(tmp_path / "t"))
    assert (
        spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch", None)
        != ROW_BOUNDED_BATCHES["spark.sql.execution.arrow.maxBytesPerBatch"]
    )  # put back
    t = DeltaTable.open(tmp_path / "t")
    assert [f.num_records() for f in t.snapshot().files()] == [n]  # one task, so one file of 3 batches
    assert seqs(tmp_path / "t") == list(range(1, n + 1))
    prov = t.history(1)[0].commit_info["feedlog"]["feeds"][0]
    assert (prov["from"], prov["to"], prov["rows"]) == (1, n + 1, n)
    assert prov["signed"]["length"] == feed.length and prov["signed"]["signature"] == feed.core.state.signature.hex()


def test_a_land_task_failing_with_an_error_that_may_pass_is_left_to_spark_until_its_last_attempt(spark) -> None:
    """`feedlog ingest` on a cluster keeps Spark's task retries for errors that may pass (a peer or
    the store unavailable, an error not foreseen) and answers at once with those that would fail
    the same way again; the last attempt answers with any of them (the driver then cleans up)."""
    from feedlog.lake.land import attempts_on, gives_up, task_attempts

    assert task_attempts(spark) == 1  # the suite's local[2] session: Spark runs a task once
    assert [
        attempts_on(m, None) for m in ("local", "local[2]", "local[*]", "local[4, 3]", "local-cluster[2,1,1024]")
    ] == [
        1,
        1,
        1,
        3,
        4,
    ]
    assert attempts_on("spark://h:7077", "8") == 8 and attempts_on("yarn", "x") == 4
    for passing in (Unavailable("peer down"), RuntimeError("bug"), OSError(28, "No space left on device")):
        assert [gives_up(passing, a, 4) for a in range(4)] == [False, False, False, True]
        assert gives_up(passing, 0, 1)
    for lasting in (Corruption("bad block"), InvalidArgument("bad option")):
        assert gives_up(lasting, 0, 4)
