"""The feedlog source's planning and reading, without Spark (the same objects Spark pickles and calls)."""

from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from feedlog.errors import Corruption, InvalidArgument, NotFound
from feedlog.lake.feeds import FeedSource, parse_sources
from feedlog.lake.rows import SCHEMA
from feedlog.lake.source import FeedBatchReader, FeedPartition, FeedStreamReader, SourceFeed, read_partition
from feedlog.log.entries import STAT_FIELDS, decode_entry, decode_header
from feedlog.log.feed import Feed, Write

from .conftest import KEY_A, KEY_B, make_feed


@pytest.fixture
def feed_dir(tmp_path: Path) -> Path:
    make_feed(tmp_path / "feed", 300, batch=100).close()
    return tmp_path / "feed"


def test_batch_reader_plans_and_reads_verified_arrow(feed_dir: Path) -> None:
    r = FeedBatchReader({"feed": str(feed_dir), "startingOffsets": "51", "maxEntriesPerPartition": "100"})
    r = pickle.loads(pickle.dumps(r))  # Spark ships the reader to executors
    parts = r.partitions()
    assert [(p.start, p.end) for p in parts] == [(51, 151), (151, 251), (251, 301)]
    batches = [b for p in parts for b in read_partition(r.feeds, p)]
    assert all(b.schema == SCHEMA for b in batches)
    rows = [row for b in batches for row in b.to_pylist()]
    assert [x["seq"] for x in rows] == list(range(51, 301))
    signed = [x for x in rows if x["signed"]]
    assert [x["seq"] for x in signed] == [100, 200, 300]
    assert signed[-1]["signed"]["length"] == 301 and len(signed[-1]["signed"]["signature"]) == 64


def test_offsets_options(feed_dir: Path) -> None:
    key = KEY_A.public_key.hex()
    r = FeedBatchReader({"feed": str(feed_dir), "startingOffsets": f'{{"{key}": 10}}', "endingOffsets": "20"})
    assert (r.start, r.end) == ({key: 10}, {key: 20})
    for bad in ("soon", '{"00": 1}', "-1"):
        with pytest.raises(InvalidArgument):
            FeedBatchReader({"feed": str(feed_dir), "startingOffsets": bad})
    with pytest.raises(InvalidArgument, match="past"):
        FeedBatchReader({"feed": str(feed_dir), "endingOffsets": "999"})
    with pytest.raises(InvalidArgument, match="feed"):
        FeedBatchReader({})


def test_stream_offsets_end_on_signed_batches(feed_dir: Path) -> None:
    key = KEY_A.public_key.hex()
    s = FeedStreamReader({"feed": str(feed_dir), "maxEntriesPerTrigger": "120", "startingOffsets": "earliest"})
    assert s.initialOffset() == {key: 1}
    assert isinstance(s.getDefaultReadLimit(), ReadMaxRows)
    assert s.latestOffset({key: 1}, ReadMaxRows(120)) == {key: 201}  # 121 rounds up to the batch end
    assert s.latestOffset({key: 201}, ReadMaxRows(120)) == {key: 301}
    assert s.latestOffset({key: 1}, ReadAllAvailable()) == {key: 301}
    assert s.latestOffset({key: 301}, ReadMaxRows(120)) == {key: 301}
    assert FeedStreamReader({"feed": str(feed_dir)}).initialOffset() == {key: 301}  # Kafka's default: latest


def test_an_available_now_stream_stops_at_what_was_signed_when_it_started(feed_dir: Path) -> None:
    """Trigger.AvailableNow: the feed's length when the query starts is the end, however much a
    writer appends while the query runs (else a busy feed's query would never stop)."""
    key = KEY_A.public_key.hex()
    s = FeedStreamReader({"feed": str(feed_dir), "maxEntriesPerTrigger": "150", "startingOffsets": "earliest"})
    s.prepareForTriggerAvailableNow()
    feed = Feed.open(feed_dir)
    feed.append([Write(f"/late{i}", b"x") for i in range(100)])  # signed length 401 now
    feed.close()
    assert s.latestOffset({key: 1}, ReadMaxRows(150)) == {key: 201}
    assert s.latestOffset({key: 201}, ReadMaxRows(150)) == {key: 301}
    assert s.latestOffset({key: 301}, ReadMaxRows(150)) == {key: 301}  # done: Spark ends the query
    assert s.latestOffset({key: 1}, ReadAllAvailable()) == {key: 301}
    fresh = FeedStreamReader({"feed": str(feed_dir), "startingOffsets": "earliest"})  # a plain trigger reads on
    assert fresh.latestOffset({key: 301}, ReadAllAvailable()) == {key: 401}


def test_several_feeds_and_bad_specs(tmp_path: Path, feed_dir: Path) -> None:
    make_feed(tmp_path / "b", 10, kp=KEY_B).close()
    srcs = parse_sources(f"{feed_dir}, {tmp_path / 'b'}")
    assert [s.key for s in srcs] == [KEY_A.public_key, KEY_B.public_key]
    with pytest.raises(InvalidArgument, match="twice"):
        parse_sources(f"{feed_dir},{feed_dir}")
    with pytest.raises(NotFound):
        FeedSource.parse(str(tmp_path / "nothing"))
    with pytest.raises(InvalidArgument):
        FeedSource.parse("http://x/y")


def test_a_block_altered_on_disk_is_refused(feed_dir: Path) -> None:
    """A local directory is verified like a peer: rewrite a block and its stored leaf, the signature catches it."""
    from feedlog.log import storage
    from feedlog.log.crypto import leaf_hash

    with Feed.open(feed_dir) as f:
        off, n, _flags = f.core._entry(42)
    with open(feed_dir / storage.LOG, "r+b") as log:
        log.seek(off)
        block = bytearray(log.read(n))
        block[-1] ^= 1
        log.seek(off)
        log.write(block)
    with open(feed_dir / storage.TREE, "r+b") as tree:
        tree.seek(84 * storage.NODE.size)
        tree.write(storage.NODE.pack(leaf_hash(bytes(block)), n))
    src = FeedSource.parse(str(feed_dir))
    with pytest.raises(Corruption, match="do not hash to the signed tree"):
        list(src.read(1, 301))
    assert [b.start for b in src.read(101, 301)] == [101, 201]  # the other batches still verify


def reference_rows(src: FeedSource, start: int, end: int) -> list[dict[str, Any]]:
    """A row per entry the slow way: `SegmentVerifier` (through the client or over the directory's
    segments) and `decode_entry` per block, as the reader's rows were built before issue 17."""
    from feedlog.log import merkle
    from feedlog.log.core import Core
    from feedlog.replication.client import FeedClient
    from feedlog.replication.verify import SegmentVerifier

    header = src.header()
    content_type = decode_header(header)
    if src.target is not None:
        with FeedClient(src.target) as c:
            batches = list(c.read_verified(src.key, start, end))
    else:
        assert src.path is not None
        core = Core.open(src.path, writable=False)
        v = SegmentVerifier(src.key, start, merkle.nodes_for_roots(start, core.node))
        batches = [b.trimmed(end) for s in core.segments(start, end, 1 << 30) if (b := v.add(s)) is not None]
        core.close()
    rows = []
    for batch in batches:
        leaves = {n.index // 2: n for n in batch.cleared}
        for k, block in enumerate(batch.blocks):
            seq = batch.start + k
            signed = None
            if seq == batch.state.length - 1:
                s = batch.state
                signed = {"length": s.length, "fork": s.fork, "tree_hash": s.tree_hash, "signature": s.signature}
                signed["header"] = header
            row: dict[str, Any] = {"feed": src.key_hex, "seq": seq, "signed": signed, "cleared": block is None}
            if block is None:
                row |= dict.fromkeys(("key", "value", "deleted", "timestamp", "expires_at", "stat", "block"))
                row |= {"leaf_hash": leaves[seq].hash, "size": leaves[seq].size}
            else:
                r = decode_entry(content_type, seq, block)
                row |= {"key": r.key, "value": r.value, "deleted": r.deleted, "block": block, "size": len(block)}
                row |= {"timestamp": r.timestamp, "expires_at": r.expires_at, "leaf_hash": None}
                row["stat"] = {f: (r.stat or {}).get(f) for f in STAT_FIELDS} if r.stat is not None else None
            rows.append(row)
    return rows


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A read row with timestamps as the writer's ms (the reference's form)."""
    out = dict(row)
    for k in ("timestamp", "expires_at"):
        if out[k] is not None:
            out[k] = (out[k] - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    return out


@pytest.mark.parametrize("content_type", ["entry", "drive-event"])
def test_rows_match_a_row_at_a_time_reference(tmp_path: Path, content_type: str) -> None:
    """Columns built a batch at a time are the rows decode_entry gives, cleared blocks, TTLs, drive stats,
    deletions and ranges that start and end inside a signed batch included; from a directory and a peer."""
    from feedlog.replication.sync import push
    from feedlog.rpc import Address
    from feedlog_server.app import PeerServer

    feed = Feed.create(tmp_path / "feed", key_pair=KEY_A, content_type=content_type, timestamps="exact")
    for lo in range(0, 300, 70):
        if content_type == "entry":
            writes = [
                Write(f"/k{i % 13}", bytes([i % 256]) * (i % 40), ttl_ms=10_000 + i if i % 4 else None)
                for i in range(lo, lo + 70)
            ]
        else:
            writes = [Write(f"/f{i}", {"mode": 33188, "size": i, "mtime": 2**40 + i}) for i in range(lo, lo + 70)]
        writes.append(Write("/gone", None, deleted=True))
        feed.append(writes)
    feed.close()
    peer = PeerServer(tmp_path / "peer").start()
    push(tmp_path / "feed", Address.parse(f"grpc://{peer.address}"), token=peer.token)
    peer.stop(1)
    for copy in (tmp_path / "feed", tmp_path / "peer" / KEY_A.public_key.hex()):  # compacted here and there
        with Feed.open(copy) as f:
            f.core.clear([5, 6, 7, 100, 211])
    peer = PeerServer(tmp_path / "peer").start()
    try:
        for spec in (str(tmp_path / "feed"), f"grpc://{peer.address}/{KEY_A.public_key.hex()}"):
            feeds = [SourceFeed(src := FeedSource.parse(spec), src.header(), content_type)]
            for start, end in ((1, 356), (3, 150), (72, 73)):
                got = [_plain(r) for b in read_partition(feeds, FeedPartition(0, start, end)) for r in b.to_pylist()]
                want = reference_rows(src, start, end)
                assert got == want, (spec, start, end)
                assert sum(r["cleared"] for r in got) == sum(start <= s < end for s in (5, 6, 7, 100, 211))
    finally:
        peer.stop(1)
