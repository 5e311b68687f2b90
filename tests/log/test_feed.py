"""Entries, timestamps policies, clock seeding, the key/value view, TTL and compaction."""

from pathlib import Path

import pytest

from feedlog.clock import ClockWentBackwards, ManualClock
from feedlog.errors import InvalidArgument, NotFound
from feedlog.log.feed import Feed, Write
from feedlog.pb import hyperdb_pb2

T0 = 1_700_000_000_000


def test_put_get_delete_history(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with Feed.create(tmp_path / "f", timestamps="exact", clock=clock) as f:
        a = f.put("/a", b"1")
        clock.advance(10)
        f.put("/a", b"2")
        f.append([Write("/b", b"x"), Write("/c", b"y")])
        clock.advance(10)
        d = f.delete("/a")
        assert a.seq == 1 and a.timestamp == T0 and d.timestamp == T0 + 20
        assert f.get("/a") is None
        assert [(r.value, r.deleted, r.timestamp) for r in f.history("/a")] == [
            (b"1", False, T0),
            (b"2", False, T0 + 10),
            (None, True, T0 + 20),
        ]
        got = f.get("/b")
        assert got is not None and got.value == b"x"
        assert f.get("/never") is None and f.history("/never") == []
        assert f.timestamp(d.seq) == T0 + 20
    # the key index is rebuilt from the log after reopening
    with Feed.open(tmp_path / "f", clock=ManualClock(T0 + 30)) as f:
        c = f.get("/c")
        assert c is not None and c.value == b"y" and f.get("/a") is None and f.length == 6


def test_policies_per_feed_and_per_append(tmp_path: Path) -> None:
    clock = ManualClock(T0 + 1234)
    with Feed.create(tmp_path / "f", timestamps="truncate:1s", clock=clock) as f:
        assert f.put("k", b"v").timestamp == T0 + 1000
        assert f.put("k", b"v", timestamps="off").timestamp is None
        assert f.put("k", b"v", timestamps="exact").timestamp == T0 + 1234
        assert f.record(2).timestamp is None
        # `off` writes no field at all, not a zero: the bytes carry no time
        assert not hyperdb_pb2.Entry.FromString(f.record(2).block or b"").HasField("timestamp")
        with pytest.raises(InvalidArgument):
            f.put("k", b"v", timestamps="sometimes")
    with Feed.create(tmp_path / "off", timestamps="off", clock=clock) as f:
        f.put("k", b"v")
        rec = f.record(1)
        assert rec.timestamp is None
        assert f.info()["min_timestamp"] is None


def test_clock_is_seeded_from_persisted_timestamps(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "f", timestamps="exact", clock=ManualClock(T0)) as f:
        f.put("k", b"v")
    # a clock behind what was already written is refused, not silently used
    with Feed.open(tmp_path / "f", clock=ManualClock(T0 - 5)) as f, pytest.raises(ClockWentBackwards):
        f.put("k", b"w")
    with Feed.open(tmp_path / "f", clock=ManualClock(T0 + 1)) as f:
        assert f.put("k", b"w").timestamp == T0 + 1


def test_untrusted_timestamps_read_fine(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "f", timestamps="exact", clock=ManualClock(0)) as f:
        f.put("epoch", b"1970")  # a device with no clock set
    with Feed.open(tmp_path / "f", clock=ManualClock(1 << 62)) as f:
        f.put("future", b"far")
        f.put("k", b"v", timestamps="off")
        assert [r.timestamp for r in f.records()] == [0, 1 << 62, None]


def test_ttl_default_and_per_put_hide_and_compact(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with Feed.create(tmp_path / "f", timestamps="exact", ttl="1h", clock=clock) as f:
        f.put("short", b"s", ttl="1m")
        f.put("default", b"d")
        f.put("over", b"old", ttl="7d")
        f.put("over", b"new", ttl="7d")
        clock.advance(2 * 60_000)
        assert f.get("short") is None  # expired: hidden
        assert f.get("default") is not None
        assert f.history("short")[0].expires_at == T0 + 60_000
        rep = f.compact()
        assert rep.cleared == 1 and rep.bytes_cleared > 0
        assert f.record(1).cleared and f.get("default") is not None
        clock.advance(3600_000)
        assert f.compact().cleared == 1  # "default" now
        assert f.compact(overwritten=True).cleared == 1  # the old "over"
        assert f.compact(overwritten=True).cleared == 0
        got = f.get("over")
        assert got is not None and got.value == b"new"
        assert f.verify().cleared == 3
    with Feed.open(tmp_path / "f", clock=clock) as f:
        assert [r.cleared for r in f.records()] == [True, True, True, False]
        assert f.verify().length == 5


def test_drive_event_feed(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "d", content_type="drive-event", timestamps="exact", clock=ManualClock(T0)) as f:
        f.put("/docs/a.txt", {"mode": 0o100644, "size": 12, "mtime": 5})
        f.delete("/docs/a.txt")
        recs = list(f.records())
        assert recs[0].stat == {"mode": 0o100644, "size": 12, "mtime": 5} and recs[0].timestamp == T0
        assert recs[1].deleted and recs[1].timestamp == T0  # deletions are timestamped too
        assert f.get("/docs/a.txt") is None
    with Feed.open(tmp_path / "d") as f:
        assert f.content_type == "drive-event"


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        Feed.create(tmp_path / "x", content_type="tabular")
    assert not (tmp_path / "x").exists()  # validated before touching disk
    with pytest.raises(InvalidArgument):
        Feed.create(tmp_path / "y", ttl="forever")
    with Feed.create(tmp_path / "f") as f:
        with pytest.raises(InvalidArgument):
            f.put("", b"v")
        with pytest.raises(InvalidArgument):
            f.append([])
        with pytest.raises(InvalidArgument, match="header"):
            f.record(0)
        with pytest.raises(NotFound):
            f.record(99)
        with pytest.raises(InvalidArgument):
            f.put("k", {"mode": 1})  # a stat into an entry feed
        assert f.length == 1  # nothing half-written


def test_info_fields(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "f", timestamps="fuzz:30s", ttl="7d") as f:
        f.put("a", b"1")
        info = f.info()
    for k in (
        "key",
        "discovery_key",
        "length",
        "byte_length",
        "tree_hash",
        "fork",
        "signature",
        "timestamps",
        "first_timestamp",
        "last_timestamp",
    ):
        assert k in info
    assert info["length"] == 2 and info["timestamps"] == "fuzz:30s" and info["ttl"] == "7d"
    assert len(bytes.fromhex(info["signature"])) == 64


def test_a_copy_without_the_secret_key_reads_but_does_not_adopt_its_clock(tmp_path: Path) -> None:
    import shutil

    far = 1 << 60
    with Feed.create(tmp_path / "f", timestamps="exact", clock=ManualClock(far)) as f:
        f.put("k", b"v", ttl="1h")
    shutil.copytree(tmp_path / "f", tmp_path / "copy")
    (tmp_path / "copy" / "secret_key").unlink()
    with Feed.open(tmp_path / "copy", writable=False) as copy:
        assert not copy.info()["writable"]
        assert copy.clock.now_ms() < far  # the writer's (bogus) clock does not leak into ours
        got = copy.get("k")
        assert got is not None and got.timestamp == far


def test_a_replica_records_the_timestamp_range_scan_blocks_finds(tmp_path: Path) -> None:
    """store_signed's batch scan (entry_scan) gives each stored batch the (min, max) writer timestamp
    the per-block reference does, over batches of entries as written, blocks their author signed that
    are no entries, and a timestamp of 0 (where the reference's running minimum restarts)."""
    from feedlog.log import entries

    def entry(ts: int | None, key: str = "/k") -> bytes:
        return entries.encode_entry(entries.ENTRY, key, b"v", deleted=False, timestamp=ts, expires_at=None)

    batches = [
        [entry(T0 + 100 + i) for i in range(40)],
        [entry(T0 + 500 - i, f"/\u00e9{i}") for i in range(30)],  # non-ASCII keys, falling timestamps
        [b"\xff junk", entry(None), *(entry(T0 + 7 * i) for i in range(20)), entry(0), entry(T0 + 3)],
        [entry(T0 + 1), b"", entry(2**64 - 1)],  # short: the per-block path; the largest uint64
    ]
    with Feed.create(tmp_path / "src", timestamps="exact") as src:
        key = src.key
        want = [(0, 0)]  # the header's batch
        lo = hi = 0
        for b in batches:
            b_lo, b_hi = entries.scan_blocks(entries.ENTRY, src.core.length, b, strict=False)
            src.core.append(b)
            lo = b_lo if b_lo and (not lo or b_lo < lo) else lo
            hi = max(hi, b_hi)
            want.append((lo, hi))
        segs = src.core.segments(0, src.core.length, 1 << 30)
    assert want[3] == (T0 + 3, T0 + 500)  # batch 3's minimum is what follows its 0
    with Feed.create_replica(tmp_path / "copy", key) as copy:
        seen = []
        for seg in segs:
            assert seg.state is not None
            copy.store_signed([b for b in seg.blocks if b is not None], seg.state)
            seen.append((copy.core.min_ts, copy.core.max_ts))
        assert seen == want and copy.length == src.length
