"""The batch timestamp scan against the reference, `scan_blocks(strict=False)`, on random batches."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.log import entry_scan
from feedlog.log.entries import DRIVE_EVENT, ENTRY, encode_entry, encode_header, scan_blocks
from feedlog.log.entry_columns import PAD
from feedlog.log.entry_scan import MIN_COLUMNS, timestamp_range, timestamp_ranges
from tests.log.test_entry_columns import entry_block, varint

TS = st.one_of(st.just(0), st.integers(0, 2**40), st.integers(0, 2**64 - 1))


@st.composite
def batch(draw: Any, content_type: str) -> Any:
    """A batch as a replica receives it: entries (valid, odd, junk), cleared blocks, small timestamps
    (0 too: scan_blocks' running minimum restarts there), maybe the header first."""
    start = draw(st.sampled_from([0, 1, 5, 1000]))
    timed = st.builds(
        lambda key, ts: encode_entry(
            content_type,
            key,
            {"mode": 1} if content_type == DRIVE_EVENT else b"v",
            deleted=False,
            timestamp=ts,
            expires_at=None,
        ),
        st.text(max_size=4),
        TS,
    )
    # sizes on both sides of MIN_COLUMNS, where the scan changes paths
    blocks = draw(st.lists(st.one_of(st.none(), entry_block(content_type), timed), max_size=3 * MIN_COLUMNS))
    if start == 0:
        header = draw(st.sampled_from([encode_header(content_type), encode_header(ENTRY), b"\xff", None]))
        blocks = [header, *blocks]
    return start, blocks


def same(content_type: str, start: int, blocks: Sequence[bytes | None]) -> None:
    assert timestamp_range(content_type, start, blocks) == scan_blocks(content_type, start, blocks, strict=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch(ENTRY))
def test_entry_batches_scan_as_the_reference(b: tuple[int, list[bytes | None]]) -> None:
    same(ENTRY, *b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch(DRIVE_EVENT))
def test_drive_event_batches_scan_as_the_reference(b: tuple[int, list[bytes | None]]) -> None:
    same(DRIVE_EVENT, *b)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.lists(st.binary(max_size=30), min_size=MIN_COLUMNS, max_size=40))
def test_junk_batches_hold_no_timestamps_the_reference_misses(start: int, blocks: list[bytes]) -> None:
    same(ENTRY, start, list(blocks))
    same(DRIVE_EVENT, start, list(blocks))


def ok(ts: int | None, key: str = "k", content_type: str = ENTRY) -> bytes:
    value: Any = {"mode": 1} if content_type == DRIVE_EVENT else b"v"
    return encode_entry(content_type, key, value, deleted=False, timestamp=ts, expires_at=None)


@pytest.mark.parametrize("content_type", [ENTRY, DRIVE_EVENT])
def test_blocks_off_the_common_shape_take_the_reference_path(content_type: str) -> None:
    """Concrete cases: a field number or tag upb refuses (over 2**29 - 1, a 6-byte tag), a key that is
    not UTF-8 or is non-ASCII UTF-8, a timestamp over 2**63, a 0 timestamp, a drive entry's own
    timestamp (not its event's: scan_blocks ignores it), a field twice."""
    pad = [ok(50 + i, content_type=content_type) for i in range(MIN_COLUMNS)]
    odd = [
        ok(7, content_type=content_type) + varint((2**29) << 3) + b"\x01",  # refused: its timestamp does not count
        ok(3, content_type=content_type) + bytes([0xD8, 0x80, 0x80, 0x80, 0x80, 0x00]) + b"\x01",  # 6-byte tag
        ok(4, content_type=content_type) + bytes([0xD8, 0x80, 0x80, 0x80, 0x00]) + b"\x01",  # 5 bytes: fine
        ok(9, key="é", content_type=content_type),
        b"\x0a\x01\xff\x22\x00\x48\x02",  # key 0xff: not UTF-8, not an entry
        ok(2**64 - 1, content_type=content_type),
        ok(0, content_type=content_type),
        ok(60, content_type=content_type),
        ok(61, content_type=content_type) + b"\x48\x01",  # timestamp twice: upb keeps the last
        b"\x0a\x01k\x22\x00\x48\x05",  # an entry's timestamp; in a drive feed an empty event, no timestamp
    ]
    for i in range(len(odd)):
        same(content_type, 1, pad + odd[: i + 1])
        same(content_type, 1, odd[i:] + pad)
    assert timestamp_range(content_type, 1, pad + odd[:1]) == (50, 50 + MIN_COLUMNS - 1)
    assert timestamp_range(content_type, 1, pad + odd[:3]) == (4, 50 + MIN_COLUMNS - 1)
    assert timestamp_range(content_type, 1, [*pad, ok(0, content_type=content_type), ok(60)]) == (
        (60, 65) if content_type == ENTRY else (0, 65)
    )


def test_the_column_decoder_refuses_tags_upb_refuses() -> None:
    """The field scan the two share: a field number over 2**29 - 1, or a 6-byte tag, is upb's to refuse."""
    from feedlog.errors import Corruption
    from feedlog.log.entry_columns import decode_columns

    for extra in (varint((2**29) << 3) + b"\x01", bytes([0xD8, 0x80, 0x80, 0x80, 0x80, 0x00]) + b"\x01"):
        with pytest.raises(Corruption, match="block 1 is not an entry"):
            decode_columns(ENTRY, [1], [ok(1) + extra])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([ENTRY, DRIVE_EVENT]), batch(ENTRY), st.lists(st.integers(0, 40), max_size=6))
def test_batches_scanned_together_get_their_own_ranges(
    content_type: str, b: tuple[int, list[bytes | None]], cuts: list[int]
) -> None:
    """A message's batches scanned as one (a replica's store) give each batch the range it has alone."""
    start, blocks = b
    bounds = sorted({0, len(blocks), *(min(c, len(blocks)) for c in cuts)})
    lengths = [hi - lo for lo, hi in pairwise(bounds)] or [0]
    got = timestamp_ranges(content_type, start, blocks, lengths)
    want, lo = [], 0
    for n in lengths:
        # a batch after the first starts past block 0: only the first may hold the header
        want.append(scan_blocks(content_type, start + lo, blocks[lo : lo + n], strict=False))
        lo += n
    assert got == want


def test_batch_lengths_must_cover_the_blocks() -> None:
    with pytest.raises(ValueError, match="do not add up"):
        timestamp_ranges(ENTRY, 1, [ok(1), ok(2)], [1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch(ENTRY))
def test_without_the_extension_entry_batches_scan_as_the_reference(b: tuple[int, list[bytes | None]]) -> None:
    """The numpy tier the C one replaces (and which machines without a compiler run) stays right."""
    saved, entry_scan._native = entry_scan._native, None
    try:
        same(ENTRY, *b)
    finally:
        entry_scan._native = saved


def _near_entries() -> Any:
    """Blocks near encode_entry's layout: valid ones cut, extended or with a byte changed."""
    base = st.builds(
        lambda key, value, deleted, ts, exp: encode_entry(
            ENTRY, key, value, deleted=deleted, timestamp=ts, expires_at=exp
        ),
        st.text(max_size=5),
        st.binary(max_size=140),
        st.booleans(),
        st.one_of(st.none(), TS),
        st.one_of(st.none(), TS),
    )

    def mutate(data: Any, b: bytes) -> bytes:
        how = data.draw(st.sampled_from(["keep", "cut", "extend", "flip"]))
        if how == "cut" and b:
            return b[: data.draw(st.integers(0, len(b) - 1))]
        if how == "extend":
            extra: bytes = data.draw(st.binary(min_size=1, max_size=4))
            return b + extra
        if how == "flip" and b:
            i = data.draw(st.integers(0, len(b) - 1))
            return b[:i] + bytes([data.draw(st.integers(0, 255))]) + b[i + 1 :]
        return b

    return st.tuples(st.data(), base).map(lambda t: mutate(*t))


@pytest.mark.skipif(entry_scan._native is None, reason="no C compiler: feedlog.log._blake2batch was not built")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_near_entries(), st.binary(max_size=40)), min_size=1, max_size=30))
def test_the_compiled_writer_shape_reads_as_the_numpy_one(blocks: list[bytes]) -> None:
    assert entry_scan._native is not None
    ok_b, has_b, ts_b = entry_scan._native.writer_shape(blocks)
    sizes = np.fromiter(map(len, blocks), np.int64, len(blocks))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    buf = np.frombuffer(b"".join(blocks) + PAD, np.uint8)
    ok_n, has_n, ts_n = entry_scan._writer_shape(buf, offsets[:-1], offsets[1:])
    ok_c = np.frombuffer(ok_b, bool)
    has_c = np.frombuffer(has_b, bool)
    ts_c = np.frombuffer(ts_b, "<u8")
    assert ok_c.tolist() == ok_n.tolist()
    assert has_c.tolist() == has_n.tolist()
    assert ts_c[has_c].tolist() == ts_n[has_n].tolist()


def _carries_expiry(content_type: str, block: bytes) -> bool:
    """The reference: upb's reading of the block has an expires_at."""
    from feedlog.log.entries import decode_record

    return decode_record(content_type, 1, block).expires_at is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([ENTRY, DRIVE_EVENT]), st.data())
def test_expiry_candidates_miss_no_block_with_an_expiry(content_type: str, data: Any) -> None:
    """Retention's filter (issue 37): every block upb finds an expires_at in is a candidate, in C and in
    numpy alike, and a block as the writer lays it out without one is not (no decode for it)."""
    blocks = data.draw(st.lists(entry_block(content_type), max_size=3 * MIN_COLUMNS))
    got = entry_scan.expiry_candidates(blocks).tolist()
    for b, cand in zip(blocks, got, strict=True):
        if _carries_expiry(content_type, b):
            assert cand
    native = entry_scan._native
    try:
        entry_scan._native = None
        assert entry_scan.expiry_candidates(blocks).tolist() == got
    finally:
        entry_scan._native = native
    plain = [
        encode_entry(
            content_type,
            "k",
            b"v" if content_type == ENTRY else {"mode": 1},
            deleted=False,
            timestamp=t,
            expires_at=None,
        )
        for t in (None, 0, 2**40, 1_795_934_833_732)
    ]
    expiring = [
        encode_entry(
            content_type, "k", b"P" if content_type == ENTRY else {"mode": 1}, deleted=False, timestamp=t, expires_at=e
        )
        for t, e in ((None, 0), (5, 2**63), (1_795_934_833_732, 1))
    ]
    assert entry_scan.expiry_candidates(plain + expiring).tolist() == [False] * 4 + [True] * 3
