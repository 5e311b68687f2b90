"""The column decoder against the reference, `decode_entry`, on random blocks (valid and not)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.errors import Corruption
from feedlog.log.entries import DRIVE_EVENT, ENTRY, STAT_FIELDS, Record, decode_entry, encode_entry
from feedlog.log.entry_columns import decode_columns
from feedlog.pb import drive_pb2


def varint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    for _ in range(11):
        b, n = n & 0x7F, n >> 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)
    raise AssertionError("over 70 bits")


U64 = st.integers(0, 2**64 - 1)
SMALL = st.integers(0, 2**40)


@st.composite
def raw_field(draw: Any) -> Any:
    """One protobuf field of any number and wire type, well formed or not."""
    number = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 15, 16, 100, 2**20]))
    wt = draw(st.sampled_from([0, 0, 2, 2, 1, 5, 3, 4, 6]))
    tag = varint(number << 3 | wt)
    if wt == 0:
        return tag + varint(draw(st.one_of(SMALL, U64, st.integers(0, 2**70 - 1))))
    if wt == 2:
        payload = draw(st.one_of(st.binary(max_size=20), st.text(max_size=8).map(str.encode)))
        return tag + varint(max(len(payload) + draw(st.sampled_from([0, 0, 0, 1, -1])), 0)) + payload
    if wt == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wt == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    return tag


@st.composite
def entry_block(draw: Any, content_type: str) -> Any:
    """A block as a writer makes it, or one with odd fields around it, or junk."""
    kind = draw(st.sampled_from(["valid", "valid", "odd", "raw", "cut"]))
    key = draw(st.text(max_size=12))
    ts = draw(st.one_of(st.none(), SMALL, U64))
    exp = draw(st.one_of(st.none(), SMALL, U64))
    deleted = draw(st.booleans())
    if content_type == DRIVE_EVENT:
        names = draw(st.lists(st.sampled_from(STAT_FIELDS[1:]), unique=True))
        stat: dict[str, int] = {"mode": draw(st.integers(0, 2**32 - 1))}
        for n in names:
            stat[n] = draw(st.integers(0, 2**32 - 1 if n in ("uid", "gid") else 2**64 - 1))
        value: Any = stat
    else:
        value = draw(st.one_of(st.none(), st.binary(max_size=40)))
    block = encode_entry(content_type, key, value, deleted=deleted, timestamp=ts, expires_at=exp)
    if kind == "valid":
        return block
    if kind == "cut":
        return block[: draw(st.integers(0, max(len(block) - 1, 0)))]
    extra = b"".join(draw(st.lists(raw_field(), max_size=4)))
    if kind == "raw":
        return extra
    return draw(st.sampled_from([block + extra, extra + block]))


def reference(content_type: str, seq: int, block: bytes | None) -> Record | str | None:
    if block is None:
        return None
    try:
        return decode_entry(content_type, seq, block)
    except Corruption as e:
        return str(e)


def check(content_type: str, blocks: list[bytes | None]) -> None:
    seqs = list(range(7, 7 + len(blocks)))
    want = [reference(content_type, s, b) for s, b in zip(seqs, blocks, strict=True)]
    errors = [w for w in want if isinstance(w, str)]
    if errors:
        with pytest.raises(Corruption) as got:
            decode_columns(content_type, seqs, blocks)
        assert str(got.value) in errors
        return
    cols = decode_columns(content_type, seqs, blocks)
    keys, values = cols.key.to_pylist(), cols.value.to_pylist()
    stats = cols.stat.to_pylist() if cols.stat is not None else [None] * len(blocks)
    assert cols.block.to_pylist() == blocks
    for i, r in enumerate(want):
        assert cols.present[i] == (r is not None)
        if r is None:
            assert keys[i] is None and values[i] is None and stats[i] is None
            assert not cols.has_timestamp[i] and not cols.has_expires_at[i]
            continue
        assert isinstance(r, Record)
        assert (keys[i], values[i], bool(cols.deleted[i])) == (r.key, r.value, r.deleted)
        assert cols.size[i] == len(blocks[i] or b"")
        ts = int(cols.timestamp[i]) if cols.has_timestamp[i] else None
        exp = int(cols.expires_at[i]) if cols.has_expires_at[i] else None
        assert (ts, exp) == (r.timestamp, r.expires_at)
        st_i = stats[i]
        got_stat = None if st_i is None else {k: v for k, v in st_i.items() if v is not None}
        # an int64 column holds no uint64 of 2**63 or more: that field is null (the block keeps it)
        assert got_stat == (None if r.stat is None else {k: v for k, v in r.stat.items() if v < 2**63})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_entry_blocks_decode_as_the_reference_does(data: st.DataObject) -> None:
    blocks = data.draw(st.lists(st.one_of(st.none(), entry_block(ENTRY)), max_size=12))
    check(ENTRY, blocks)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_drive_event_blocks_decode_as_the_reference_does(data: st.DataObject) -> None:
    blocks = data.draw(st.lists(st.one_of(st.none(), entry_block(DRIVE_EVENT)), max_size=12))
    check(DRIVE_EVENT, blocks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=8))
def test_junk_is_refused_as_the_reference_refuses_it(blocks: list[bytes]) -> None:
    check(ENTRY, list(blocks))


def test_valid_batches_take_the_column_path_and_odd_blocks_the_reference() -> None:
    """Concrete cases the random ones may miss: a field twice (last wins in upb), hyperdb's clock,
    a key that is not UTF-8 (or a surrogate), a 10-byte varint, a drive event with no value."""
    ok = encode_entry(ENTRY, "k", b"v", deleted=False, timestamp=5, expires_at=None)
    twice = ok + b"\x0a\x02k2"  # key again: upb keeps the last
    clock = ok + b"\x28\x05"  # repeated uint64 clock = 5
    big = encode_entry(ENTRY, "k", None, deleted=True, timestamp=2**64 - 1, expires_at=2**63)
    explicit = [ok + b"\x18\x00", ok + b"\x18\x02", ok + b"\x4a\x00"]  # deleted=0, deleted=2, unknown field 9/LEN
    check(ENTRY, [ok, twice, clock, big, None, ok, *explicit])
    assert list(decode_columns(ENTRY, [1, 2], explicit[:2]).deleted) == [False, True]
    assert decode_columns(ENTRY, [1, 2], [ok, twice]).key.to_pylist() == ["k", "k2"]
    for bad_key in (b"\xff", b"\xed\xa0\x80", b"\xc0\x80"):
        block = b"\x0a" + varint(len(bad_key)) + bad_key + b"\x22\x00"
        with pytest.raises(Corruption, match="block 2 has a key that is not UTF-8"):
            decode_columns(ENTRY, [1, 2], [ok, block])
    no_value = b"\x0a\x01k\x22\x00\x48\x07"  # key, trie, timestamp 7: an empty DriveEvent
    cols = decode_columns(DRIVE_EVENT, [1], [no_value])
    assert (bool(cols.deleted[0]), int(cols.timestamp[0]), cols.stat.to_pylist()) == (True, 7, [None])  # type: ignore[union-attr]
    uid_big = drive_pb2.DriveEvent(stat=drive_pb2.Stat(mode=1)).SerializeToString() + b"\x0a\x06\x10" + varint(2**33)
    check(DRIVE_EVENT, [encode_entry(ENTRY, "f", uid_big, deleted=False, timestamp=None, expires_at=None)])


def test_more_bytes_than_an_arrow_batch_holds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets are int32: a call over the bound says so rather than wrapping them."""
    from feedlog.errors import InvalidArgument
    from feedlog.log import entry_columns

    block = encode_entry(ENTRY, "k", b"v" * 100, deleted=False, timestamp=None, expires_at=None)
    monkeypatch.setattr(entry_columns, "MAX_BATCH_BYTES", 10 * len(block))
    assert len(decode_columns(ENTRY, range(10), [block] * 10).key) == 10
    with pytest.raises(InvalidArgument, match="more than one Arrow batch holds"):
        decode_columns(ENTRY, range(11), [block] * 11)
