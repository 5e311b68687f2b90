"""Wire compatibility: bytes hyperdb 3.5.0 wrote decode and re-encode unchanged."""

from typing import Any

import pytest

from feedlog.errors import Corruption, InvalidArgument
from feedlog.log import entries
from feedlog.pb import drive_pb2, hyperdb_pb2


def test_hyperdb_blocks_roundtrip_byte_for_byte(hyperdb_vectors: Any) -> None:
    header, *blocks = (bytes.fromhex(b) for b in hyperdb_vectors["feed_blocks"])
    assert entries.decode_header(header) == entries.ENTRY
    assert entries.encode_header(entries.ENTRY) == header
    for raw in [*blocks, bytes.fromhex(hyperdb_vectors["inflated_entry"])]:
        msg = hyperdb_pb2.InflatedEntry()
        msg.ParseFromString(raw)
        assert msg.SerializeToString() == raw
    keys = [entries.decode_entry(entries.ENTRY, i + 1, b) for i, b in enumerate(blocks)]
    assert [(r.key, r.value, r.deleted, r.timestamp) for r in keys] == [
        ("a", b"one", False, None),
        ("b/c", b"two", False, None),
        ("a", b"three", False, None),
        ("b/c", None, True, None),
        ("hello", b"\x00\xff\x01", False, None),
    ]


def test_clock_is_unpacked_and_required_fields_enforced() -> None:
    e = hyperdb_pb2.Entry(key="k", trie=b"", clock=[1, 2])
    # unpacked repeated uint64 (proto2 default): one tag per element, as hyperdb writes it
    assert e.SerializeToString() == bytes.fromhex("0a016b2200280128 02".replace(" ", ""))
    with pytest.raises(Exception, match=r"key|trie"):
        hyperdb_pb2.Entry(value=b"x").SerializeToString()


def test_timestamp_expiry_and_forget_use_fields_hyperdb_never_did() -> None:
    ours = ("timestamp", "expires_at", "forget")
    used = {f.number for f in hyperdb_pb2.InflatedEntry.DESCRIPTOR.fields if f.name not in ours}
    assert used == set(range(1, 9))
    for msg in (hyperdb_pb2.Entry, hyperdb_pb2.InflatedEntry):
        fields = msg.DESCRIPTOR.fields_by_name
        assert fields["timestamp"].number == 9 and fields["timestamp"].has_presence
        assert fields["expires_at"].number == 10
        assert fields["forget"].number == 11 and fields["forget"].has_presence


def test_entry_roundtrip_with_timestamp() -> None:
    raw = entries.encode_entry(entries.ENTRY, "k", b"v", deleted=False, timestamp=1234, expires_at=None)
    r = entries.decode_entry(entries.ENTRY, 7, raw)
    assert (r.seq, r.key, r.value, r.timestamp, r.expires_at, r.deleted) == (7, "k", b"v", 1234, None, False)
    # absent timestamp stays absent (not 0): readers must tell "none" from 1970
    r0 = entries.decode_entry(
        entries.ENTRY, 1, entries.encode_entry(entries.ENTRY, "k", b"", deleted=False, timestamp=None, expires_at=None)
    )
    assert r0.timestamp is None and r0.value == b""
    epoch = entries.decode_entry(
        entries.ENTRY, 1, entries.encode_entry(entries.ENTRY, "k", b"", deleted=False, timestamp=0, expires_at=None)
    )
    assert epoch.timestamp == 0


def test_drive_events_and_timestamped_deletions() -> None:
    put = entries.encode_entry(
        entries.DRIVE_EVENT,
        "/f.txt",
        {"mode": 0o100644, "size": 5, "mtime": 9},
        deleted=False,
        timestamp=77,
        expires_at=None,
    )
    rec = entries.decode_entry(entries.DRIVE_EVENT, 1, put)
    assert rec.stat == {"mode": 0o100644, "size": 5, "mtime": 9} and rec.timestamp == 77 and not rec.deleted
    ev = drive_pb2.DriveEvent()
    ev.ParseFromString(rec.value or b"")
    assert ev.timestamp == 77 and ev.stat.size == 5
    gone = entries.decode_entry(
        entries.DRIVE_EVENT,
        2,
        entries.encode_entry(entries.DRIVE_EVENT, "/f.txt", None, deleted=True, timestamp=78, expires_at=None),
    )
    assert gone.deleted and gone.stat is None and gone.timestamp == 78
    with pytest.raises(InvalidArgument, match="mode"):
        entries.encode_entry(entries.DRIVE_EVENT, "/f", {"size": 1}, deleted=False, timestamp=None, expires_at=None)
    with pytest.raises(InvalidArgument, match="unknown stat"):
        entries.encode_entry(
            entries.DRIVE_EVENT, "/f", {"mode": 1, "colour": 2}, deleted=False, timestamp=None, expires_at=None
        )


def test_garbage_is_corruption_not_a_crash() -> None:
    with pytest.raises(Corruption):
        entries.decode_entry(entries.ENTRY, 3, b"\xff\xff\xff")
    with pytest.raises(Corruption):
        entries.decode_header(entries.encode_header(entries.DRIVE_EVENT)[:-2] + b"zz")
