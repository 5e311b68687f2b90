"""`feedlog ingest` without Spark (`land.land_here`, `ingest_batch(None, ...)`): the Spark job's
reader, checks, files and commit, run in this process. What is checked is what the Spark job
promises: every entry exactly once across failures and reruns, no file left behind by a failed
run, and a table that real readers (deltalake) and the audit agree with."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedlog import failpoints
from feedlog.delta import DeltaTable
from feedlog.errors import Corruption, Unavailable
from feedlog.lake.audit import audit_table
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.land import _prepare, land_here
from feedlog.lake.source import read_partition
from feedlog.log import storage
from feedlog.log.core import Core

from .conftest import KEY_A, KEY_B, append, make_feed


def seqs(table: Path, key: bytes | None = None) -> list[int]:
    rows = DeltaTable.open(table).to_arrow().to_pylist()
    return sorted(r["seq"] for r in rows if key is None or r["feed"] == key.hex())


def quiet(_m: str) -> None:
    pass


@pytest.fixture
def armed() -> Iterator[None]:
    yield
    failpoints.arm("")


def test_ingest_without_spark_lands_each_entry_once_and_picks_up_on_rerun(tmp_path: Path) -> None:
    a = make_feed(tmp_path / "a", 250, kp=KEY_A)
    make_feed(tmp_path / "b", 120, kp=KEY_B).close()
    table = tmp_path / "table"
    said: list[str] = []
    done: list[tuple[int, int]] = []
    first = ingest_batch(
        None,
        [str(tmp_path / "a"), str(tmp_path / "b")],
        str(table),
        progress=said.append,
        tasks=lambda *t: done.append(t),
    )
    assert (first.version, first.rows) == (1, 370) and first.in_commit_timestamp is not None
    assert len(said) == 2 and "seqs 1..250, 250 new" in said[0]
    assert done[-1][0] == done[-1][1]  # every task reported
    assert ingest_batch(None, [str(tmp_path / "a")], str(table), progress=quiet).version is None  # nothing new
    append(a, 30)
    a.close()
    again = ingest_batch(None, [str(tmp_path / "a"), str(tmp_path / "b")], str(table), progress=quiet)
    assert (again.version, again.rows) == (2, 30)
    assert seqs(table, KEY_A.public_key) == list(range(1, 281))
    assert seqs(table, KEY_B.public_key) == list(range(1, 121))
    assert audit_table(str(table), [KEY_A.public_key, KEY_B.public_key]).ok
    import deltalake  # a reader we did not write agrees

    assert deltalake.DeltaTable(str(table)).to_pyarrow_table().num_rows == 400
    info = DeltaTable.open(table).history(1)[0].commit_info["feedlog"]
    assert [(f["from"], f["to"]) for f in info["feeds"]] == [(251, 281)]


def test_a_failed_task_removes_the_files_of_the_tasks_before_it(tmp_path: Path, armed: None) -> None:
    make_feed(tmp_path / "feed", 300).close()
    table = tmp_path / "table"
    options = {"feeds": str(tmp_path / "feed"), "maxEntriesPerPartition": "100"}  # three tasks
    failpoints.arm("sink.written=error@2")  # the second task fails once its files are written
    with pytest.raises(Unavailable):
        land_here(options, str(table), {})
    assert not list(table.glob("*.parquet")) and DeltaTable.open(table).version() == 0
    failpoints.arm("")
    result = land_here(options, str(table), {})
    assert result is not None and result.version == 1
    assert len(list(table.glob("*.parquet"))) == 3 and seqs(table) == list(range(1, 301))


def test_a_failed_commit_leaves_no_files_and_the_rerun_lands_everything_once(tmp_path: Path, armed: None) -> None:
    make_feed(tmp_path / "feed", 200).close()
    table = tmp_path / "table"
    failpoints.arm("sink.before_commit=error")
    with pytest.raises(Unavailable):
        ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    assert not list(table.glob("*.parquet")) and seqs(table) == []
    failpoints.arm("sink.committed=error")  # committed, then the run fails: its files must stay
    with pytest.raises(Unavailable):
        ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    assert seqs(table) == list(range(1, 201))
    failpoints.arm("")
    assert ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet).rows == 0
    assert seqs(table) == list(range(1, 201)) and len(list(table.glob("*.parquet"))) == 1


def test_a_block_that_does_not_verify_fails_the_run_with_the_readers_error(tmp_path: Path) -> None:
    make_feed(tmp_path / "feed", 50, batch=10).close()
    with Core.open(tmp_path / "feed", writable=False) as c:
        off, _n, _ = c._entry(25)
    with open(tmp_path / "feed" / storage.LOG, "r+b") as f:  # one bit of stored block 25
        f.seek(off + 2)
        b = f.read(1)
        f.seek(off + 2)
        f.write(bytes([b[0] ^ 0x40]))
    table = tmp_path / "table"
    with pytest.raises(Corruption, match=r"blocks 21\.\.30 do not hash to the signed tree"):
        ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    assert not table.exists() or (seqs(table) == [] and not list(table.glob("*.parquet")))


def test_auto_lands_here_only_few_entries_of_few_bytes_from_a_directory_or_a_peer(tmp_path: Path) -> None:
    """`--engine auto` weighs both the entries and their bytes: 20 entries of 64 KiB are ~1.3 MB."""
    from feedlog.lake.feeds import FeedSource
    from feedlog.lake.ingest import plan, runs_here
    from feedlog.log.feed import Feed, Write
    from feedlog.replication.sync import push
    from feedlog.rpc import Address
    from feedlog_server.app import PeerServer

    with Feed.create(tmp_path / "feed", key_pair=KEY_A, timestamps="exact") as feed:
        feed.append([Write(f"/k{i}", bytes(64 << 10)) for i in range(20)])
    peer = PeerServer(tmp_path / "peer").start()
    try:
        push(tmp_path / "feed", Address.parse(f"grpc://{peer.address}"), token=peer.token)
        for spec in (str(tmp_path / "feed"), f"grpc://{peer.address}/{KEY_A.public_key.hex()}"):
            (p,) = plan([FeedSource.parse(spec)], str(tmp_path / "table"))
            assert p.entries == 20 and 20 * (64 << 10) <= p.bytes < 21 * (64 << 10) + 4096, (spec, p.bytes)
            assert runs_here([p]) and runs_here([p], max_bytes=2_000_000)
            assert not runs_here([p], max_bytes=1_000_000) and not runs_here([p], max_entries=19)
    finally:
        peer.stop(grace=1)
    ingest_batch(None, [str(tmp_path / "feed")], str(tmp_path / "table"), progress=lambda _m: None)
    (p,) = plan([FeedSource.parse(str(tmp_path / "feed"))], str(tmp_path / "table"))
    assert (p.entries, p.bytes) == (0, 0)  # all landed: nothing left to weigh


def test_a_task_writes_its_rows_out_as_they_come_and_a_failed_task_leaves_no_file(tmp_path: Path) -> None:
    """A sink task holds at most `flush_bytes` of Arrow data: past that it writes files and lets the
    rows go, so its memory does not grow with its partition; the files add up to every row once, with
    one provenance range per feed. A task that fails after some of its files are out removes them."""
    feed = make_feed(tmp_path / "a", 900, kp=KEY_A, batch=100)
    feed.close()
    table = tmp_path / "table"
    reader, parts, config = _prepare(
        {"feeds": str(tmp_path / "a"), "maxEntriesPerPartition": "1000"}, str(table), {}, None
    )
    assert len(parts) == 1
    batches = [b.slice(i, 100) for b in read_partition(reader.feeds, parts[0]) for i in range(0, b.num_rows, 100)]
    assert sum(b.num_rows for b in batches) == 900 and len(batches) >= 9
    small = dataclasses.replace(config, flush_bytes=3 * batches[0].nbytes)  # about three batches a file

    on_disk_when_asked: list[int] = []

    def fed(fail_at: int | None = None) -> Iterator[pa.RecordBatch]:
        for i, b in enumerate(batches):
            on_disk_when_asked.append(len(list(table.glob("*.parquet"))))
            if i == fail_at:
                raise Unavailable("the source went away")
            yield b

    with pytest.raises(Unavailable):
        small.write(fed(fail_at=7))
    assert on_disk_when_asked[7] >= 2  # files were out before the task ended...
    assert not list(table.glob("*.parquet"))  # ...and the failed task removed them

    written = small.write(fed())
    assert len(written.adds) >= 3
    rows = [pq_rows(table / a["path"]) for a in written.adds]
    assert sum(rows) == 900 and max(rows) < 900
    [(key, r)] = written.feeds.items()
    assert key == KEY_A.public_key.hex() and (r.first, r.last, r.rows) == (1, 900, 900)
    assert r.signed is not None and r.signed["length"] == 901
    result = small.commit([written])
    assert result is not None and result.version == 1
    assert seqs(table) == list(range(1, 901))
    assert audit_table(str(table), [KEY_A.public_key]).ok


def pq_rows(path: Path) -> int:
    return int(pq.ParquetFile(path).metadata.num_rows)
