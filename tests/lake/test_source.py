"""The feedlog source's planning and reading, without Spark (the same objects Spark pickles and calls)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from feedlog.errors import Corruption, InvalidArgument, NotFound
from feedlog.lake.feeds import FeedSource, parse_sources
from feedlog.lake.rows import SCHEMA
from feedlog.lake.source import FeedBatchReader, FeedStreamReader, read_partition
from feedlog.log.feed import Feed

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
