"""A replica stores a message's signed batches together (one timestamp scan): each verified in turn,
the first one refused named by its blocks, the ones before it kept."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from feedlog.errors import Corruption
from feedlog.log import storage
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.sync import store_responses


def author_of(path: Path, batches: int, size: int) -> Feed:
    feed = Feed.create(path, timestamps="exact", fsync=False)
    for b in range(batches):
        time.sleep(0.003)  # each batch its own timestamps
        feed.append([Write(f"/k{b}-{i}", b"v" * (i % 7)) for i in range(size)])
    return feed


def batch_ranges(feed: Feed) -> list[tuple[int, int]]:
    """(min, max) writer timestamp of each batch record in the feed's log, as stored."""
    buf, at, out = (feed.core.path / storage.LOG).read_bytes(), 0, []
    while at < len(buf):
        rec = storage.decode_batch(buf[at:], at)
        assert rec is not None
        out.append((rec.min_ts, rec.max_ts))
        at = rec.end
    return out


def one_message(feed: Feed) -> pb.ReadResponse:
    """Every signed batch of `feed` in one message (as a peer sends them: a segment per batch)."""
    segs = feed.core.segments(0, feed.length, 1 << 30)
    assert sum(1 for s in segs if s.state is not None) > 2
    return pb.ReadResponse(segments=[wire.segment_pb(s) for s in segs])


def test_batches_of_one_message_store_with_each_batch_its_timestamp_range(tmp_path: Path) -> None:
    with author_of(tmp_path / "a", 4, 40) as author:
        msg = one_message(author)
        with Feed.create_replica(tmp_path / "b", author.key) as copy:
            assert store_responses(copy, [msg], "peer") == author.length
            assert copy.core.state == author.core.state
            assert copy.verify().length == author.length
            # each batch's range is its own: a time seek on the copy lands where it does on the author
            assert batch_ranges(copy) == batch_ranges(author)
            assert len(batch_ranges(copy)) == 5 and len(set(batch_ranges(copy))) == 5


def test_a_bad_batch_in_a_message_is_named_and_the_batches_before_it_stay(tmp_path: Path) -> None:
    with author_of(tmp_path / "a", 4, 40) as author:
        msg = one_message(author)
        signed = [i for i, s in enumerate(msg.segments) if s.HasField("state")]
        third = msg.segments[signed[2]]  # the third batch's last segment: flip a byte of a block
        third.blocks[0] = bytes([third.blocks[0][0] ^ 1]) + third.blocks[0][1:]
        lo = msg.segments[signed[1]].state.length
        hi = third.state.length - 1
        with Feed.create_replica(tmp_path / "b", author.key) as copy:
            with pytest.raises(Corruption, match=f"peer: rejected blocks {lo}..{hi}: "):
                store_responses(copy, [msg], "peer")
            assert copy.length == lo
            assert copy.verify().length == lo
