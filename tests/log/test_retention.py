"""Issue 37, peers forget: the retention rule, replicas storing cleared blocks as holes, filling holes,
and bounded compaction steps."""

from pathlib import Path

import pytest

from feedlog.clock import ManualClock
from feedlog.errors import Corruption, NotFound
from feedlog.log import retention, storage
from feedlog.log.core import Segment
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import Node

T0 = 1_700_000_000_000
SECRET = b"needle-7f3a9c"


def _source(tmp_path: Path, clock: ManualClock) -> Feed:
    """A feed of 9 entries in 3 batches; seqs 2 and 5 hold SECRET with a 1-minute TTL."""
    f = Feed.create(tmp_path / "src", timestamps="exact", clock=clock)
    f.append([Write("/a", b"Pa"), Write("/s1", SECRET, ttl_ms=60_000), Write("/b", b"b")])
    f.append([Write("/c", b"c"), Write("/s2", SECRET, ttl_ms=60_000), Write("/d", b"d")])
    f.append([Write("/e", b"e"), Write("/f", b"f"), Write("/g", b"g")])
    return f


def _segments(f: Feed) -> list[Segment]:
    segs = f.core.segments(0, f.length, 1 << 30)
    assert all(s.state is not None for s in segs)
    return segs


def _store(copy: Feed, segs: list[Segment]) -> None:
    for s in segs:
        assert s.state is not None
        copy.store_signed(s.blocks, s.state, leaves=s.cleared)


def _log_holds(path: Path, needle: bytes) -> bool:
    return needle in (path / storage.LOG).read_bytes()


def test_keeps_and_dropped_decode_only_what_may_expire(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as f:
        blocks = [f.core.get(s) for s in range(f.length)]
        assert retention.dropped(f.content_type, 0, blocks, T0) == []
        # strictly after expires_at, as `get` hides it
        assert retention.dropped(f.content_type, 0, blocks, T0 + 60_000) == []
        assert retention.dropped(f.content_type, 0, blocks, T0 + 60_001) == [2, 5]
        # a block that is no entry is data its author signed: kept; a cleared one is never listed
        assert retention.dropped(f.content_type, 1, [b"P\x50garbage", None], T0 + 10**9) == []
        r = f.record(2)
        assert retention.keeps(r, T0 + 60_000) and not retention.keeps(r, T0 + 60_001)


def test_replica_stores_cleared_blocks_as_holes_that_verify(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as src:
        clock.advance(61_000)
        assert src.compact().cleared == 2
        segs = _segments(src)
        assert [n.index for s in segs for n in s.cleared] == [4, 10]
        with Feed.create_replica(tmp_path / "copy", src.key, clock=ManualClock(T0)) as copy:
            _store(copy, segs)
            assert copy.length == src.length and copy.core.state == src.core.state
            recs = list(copy.records())
            assert [r.seq for r in recs if r.cleared] == [2, 5]
            assert copy.get("/b") is not None and copy.get("/s1") is None
            rep = copy.verify()
            assert (rep.cleared, rep.holes) == (2, 2) and rep.byte_length == src.core.byte_length
            with pytest.raises(NotFound, match="cleared"):
                copy.core.proof(2)
            assert copy.core.holes(0, copy.length, 10) == [2, 5]
        assert not _log_holds(tmp_path / "copy", SECRET)
        # the log is the source of truth: replayed without the checkpoint, the holes come back as holes
        (tmp_path / "copy" / storage.CHECKPOINT).unlink()
        with Feed.open(tmp_path / "copy", clock=ManualClock(T0)) as copy:
            assert copy.core.recovered_batches == 4  # the header's batch and the three
            assert copy.core.holes(0, copy.length, 10) == [2, 5]
            assert copy.verify().holes == 2 and copy.record(3).value == b"b"


def test_replica_refuses_a_forged_or_misplaced_leaf(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as src:
        clock.advance(61_000)
        src.compact()
        segs = _segments(src)
        with Feed.create_replica(tmp_path / "copy", src.key, clock=ManualClock(T0)) as copy:
            _store(copy, segs[:2])  # the header's batch and the first
            s = segs[2]
            assert s.state is not None
            forged = [Node(n.index, bytes(32), n.size) for n in s.cleared]
            with pytest.raises(Corruption, match="signed tree"):
                copy.store_signed(s.blocks, s.state, leaves=forged)
            with pytest.raises(Corruption, match="neither bytes nor a leaf"):
                copy.store_signed(s.blocks, s.state)
            # a leaf standing for a block that came with its bytes
            with pytest.raises(Corruption, match="does not stand for"):
                copy.store_signed(s.blocks, s.state, leaves=[*s.cleared, Node(2 * s.start, bytes(32), 1)])
            assert copy.length == segs[2].start
            _store(copy, segs[2:])
            assert copy.verify().holes == 2


def test_a_replica_keeps_no_expired_payload_it_receives(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as src:
        segs = _segments(src)  # the source has compacted nothing: every payload comes
        with Feed.create_replica(tmp_path / "copy", src.key, clock=ManualClock(T0 + 61_000)) as copy:
            _store(copy, segs)
            assert [r.seq for r in copy.records() if r.cleared] == [2, 5]
            assert copy.core.holes(0, copy.length, 10) == []  # expired here: cleared, not holes
            assert copy.verify().cleared == 2
    assert not _log_holds(tmp_path / "copy", SECRET)


def test_fill_holes_only_with_the_signed_block_and_only_if_kept(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as src:
        full = [src.core.get(s) for s in range(src.length)]
        # a withholding upstream: it sends blocks 2 and 5 cleared although they have not expired
        with Feed.create_replica(tmp_path / "peer", src.key, clock=ManualClock(T0)) as hostile:
            _store(hostile, _segments(src))
            hostile.core.clear([2, 5])
            withheld = _segments(hostile)
        copy_clock = ManualClock(T0)
        with Feed.create_replica(tmp_path / "copy", src.key, clock=copy_clock) as copy:
            _store(copy, withheld)
            assert copy.get("/s1") is None and copy.core.holes(0, copy.length, 10) == [2, 5]
            wrong = list(full)
            wrong[2] = full[3]
            with pytest.raises(Corruption, match="not the block its author signed"):
                copy.fill(0, wrong)
            assert copy.fill(0, full) == 2
            s1 = copy.get("/s1")
            assert s1 is not None and s1.value == SECRET
            assert copy.core.holes(0, copy.length, 10) == [] and copy.verify().cleared == 0
            assert copy.fill(0, full) == 0  # no holes left
        # filled in place after a checkpoint: reopening (and recovering) keeps the payloads
        with Feed.open(tmp_path / "copy", clock=ManualClock(T0)) as copy:
            assert copy.record(5).value == SECRET and copy.verify().cleared == 0
        # a hole whose payload has expired by our clock is checked, then stays cleared, no longer a hole
        late_clock = ManualClock(T0)
        with Feed.create_replica(tmp_path / "late", src.key, clock=late_clock) as late:
            _store(late, withheld)
            late_clock.advance(61_000)
            assert late.fill(0, full) == 0
            assert late.core.holes(0, late.length, 10) == [] and late.verify().cleared == 2
        assert not _log_holds(tmp_path / "late", SECRET)


def test_compact_step_clears_expired_payloads_in_bounded_steps(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with _source(tmp_path, clock) as f:
        step = f.compact_step(0, 100)
        assert (step.end, step.cleared, step.next_expiry) == (f.length, 0, T0 + 60_000)
        assert f.compact_step(0, 4).next_expiry == T0 + 60_000 and f.compact_step(6, 4).next_expiry is None
        clock.advance(61_000)
        pos, total = 0, 0
        steps = 0
        while pos < f.length:
            step = f.compact_step(pos, 2)
            pos, total, steps = step.end, total + step.cleared, steps + 1
            assert step.next_expiry is None
        assert total == 2 and steps == 5
        assert [r.seq for r in f.records() if r.cleared] == [2, 5]
        assert f.verify().cleared == 2 and f.core.holes(0, f.length, 10) == []
        assert f.compact_step(0, 100).cleared == 0  # already cleared
    assert not _log_holds(tmp_path / "src", SECRET)


def test_a_filled_hole_that_is_a_forget_entry_withdraws_its_key(tmp_path: Path) -> None:
    """A peer that withholds a forget entry (sends it cleared) leaves the key's old values on a copy
    only until the hole is filled from another peer: then the forget is honoured there too."""
    with Feed.create(tmp_path / "src", timestamps="exact", clock=ManualClock(T0)) as src:
        src.put("/x", SECRET)
        original = src.core.get(1)
        src.forget("/x")
        key, forget_leaf = src.key, src.core.leaf(2)
        full = [original if s == 1 else src.core.get(s) for s in range(src.length)]
        segs = _segments(src)
    assert [(s.start, s.end) for s in segs] == [(0, 1), (1, 2), (2, 3)]
    # what the withholding peer sends: the old value whole, the forget entry cleared
    withheld = [segs[0], Segment(1, [original], [], segs[1].state), Segment(2, [None], [forget_leaf], segs[2].state)]
    with Feed.create_replica(tmp_path / "copy", key, clock=ManualClock(T0)) as copy:
        _store(copy, withheld)
        got = copy.get("/x")
        assert got is not None and got.value == SECRET and copy.core.holes(0, copy.length, 10) == [2]
        assert copy.fill(0, full) == 1
        assert copy.get("/x") is None and copy.forgotten("/x") == 2
        assert [r.seq for r in copy.records() if r.cleared] == [1]
    assert not _log_holds(tmp_path / "copy", SECRET)


def test_a_block_cleared_while_it_is_read_is_served_cleared_not_as_zeroes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clear (scheduled compaction, a forget) marks the index, then zeroes the log, without the feed's
    lock; a Read that took the index rows before the mark must not send the zeroes it then reads (a
    reader would blame an honest peer for a block that fails its hash), nor call them corrupt."""
    from feedlog.log.core import Core

    with Feed.create(tmp_path / "f", timestamps="off") as f:
        f.append([Write("/a", b"payload-a" * 10), Write("/b", b"payload-b" * 10), Write("/c", b"c")])
        real = Core._index_rows
        calls = {"n": 0}

        def racing(self: Core, lo: int, hi: int) -> object:
            rows = real(self, lo, hi).copy()  # what the reader saw before the clear...
            calls["n"] += 1
            if calls["n"] == 1:
                monkeypatch.setattr(Core, "_index_rows", real)
                self.clear([2])  # ...then compaction marks and zeroes block 2
            return rows

        monkeypatch.setattr(Core, "_index_rows", racing)
        seg = f.core.segments(1, f.length, 1 << 20, check=False)[-1]  # the batch of seqs 1..3
        assert seg.start == 1 and seg.blocks[1] is None and [n.index for n in seg.cleared] == [4]
        assert seg.blocks[0] == f.core.get(1)


def test_a_closed_feed_refuses_to_clear_or_fill(tmp_path: Path) -> None:
    """A compaction pass that outlives a server's stop finds the feed closed: its fd numbers may name
    other files by then, so nothing is written through them."""
    from feedlog.errors import Unavailable

    f = Feed.create(tmp_path / "f", timestamps="off")
    f.append([Write("/a", b"a")])
    core = f.core
    f.close()
    with pytest.raises(Unavailable, match="closed"):
        core.clear([1])
    with pytest.raises(Unavailable, match="closed"):
        core.fill(1, b"a")
