"""A replicated batch's writer-timestamp range, read a field at a time over the whole batch.

`entries.scan_blocks(..., strict=False)` parses every block with upb to find
its timestamp: about a microsecond of Python per block, some 40% of what a
replica spent storing a batch (issue 17). `timestamp_range` gives the same
answer with no Python object per block, in three tiers: blocks laid out as
`encode_entry` writes them (nearly all) are checked and read field by field in
that order (`_writer_shape`); the others go through `entry_columns`' general
field scan (any order, unknown fields, drive events); and whatever that cannot
read exactly (a field twice, a long varint, a non-ASCII key, ...) goes through
`entries._parse`, the one definition of a valid entry, as in `scan_blocks`.
tests/log/test_entry_scan.py compares it with `scan_blocks` on random batches
(valid, odd and malformed blocks, cleared ones, the header, 0 timestamps).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import cast

import numpy as np

from ..errors import Corruption
from .entries import DRIVE_EVENT, _parse
from .entry_columns import (
    DRIVE_FIELDS,
    ENTRY_FIELDS,
    ENTRY_REFUSED,
    ENTRY_REQUIRED,
    PAD,
    STAT_32,
    STAT_NUMBERS,
    STAT_REQUIRED,
    VARINT,
    scan_fields,
    varints,
)

#: below this many blocks the per-block parse is cheaper than numpy's fixed cost per step
MIN_COLUMNS = 16

#: `_writer_shape` in C (`_blake2batch.writer_shape`) where setup.py built it; None: numpy's, the reference
_native: ModuleType | None
try:
    from . import _blake2batch as _native
except ImportError:  # a machine without a C compiler
    _native = None


def _reference_ts(content_type: str, seq: int, block: bytes) -> int | None:
    """`scan_blocks`' timestamp of one block (None: none, or not a valid entry, which a replica keeps as data)."""
    try:
        e, ev = _parse(content_type, seq, block)
    except Corruption:
        return None
    if ev is not None:  # a drive event's own timestamp only, as scan_blocks reads it
        return ev.timestamp if ev.HasField("timestamp") else None
    return e.timestamp if e.HasField("timestamp") else None


def _fold(ts: np.ndarray) -> tuple[int, int]:
    """`scan_blocks`' (lo, hi) over timestamps in block order.

    Its running minimum takes 0 as "none yet", so a timestamp of 0 restarts it:
    lo is the minimum of the timestamps after the last 0 (0 if none follow).
    """
    if not ts.size:
        return 0, 0
    zeros = np.flatnonzero(ts == 0)
    tail = ts[zeros[-1] + 1 :] if zeros.size else ts
    return (int(tail.min()) if tail.size else 0), int(ts.max())


def timestamp_range(content_type: str, start: int, blocks: Sequence[bytes | None]) -> tuple[int, int]:
    """`entries.scan_blocks(content_type, start, blocks, strict=False)`, a batch at a time.

    (min, max) writer timestamp of blocks `start...` (0, 0: none). Block 0, the
    header, and cleared blocks (None) hold none; a block that is not a valid
    entry is data to a replica and holds none either.
    """
    return timestamp_ranges(content_type, start, blocks, [len(blocks)])[0]


def timestamp_ranges(
    content_type: str, start: int, blocks: Sequence[bytes | None], lengths: Sequence[int]
) -> list[tuple[int, int]]:
    """`timestamp_range` of each of consecutive batches, `lengths` blocks each (summing to
    `len(blocks)`), scanned as one: a replica stores a message's batches (some ten of a thousand
    blocks) with one scan, not one each, whose fixed numpy cost per step was most of it."""
    if sum(lengths) != len(blocks):
        raise ValueError(f"batch lengths {sum(lengths)} do not add up to {len(blocks)} blocks")
    has, ts = _block_timestamps(content_type, start, blocks)
    out, a = [], 0
    for n in lengths:
        out.append(_fold(ts[a : a + n][has[a : a + n]]))
        a += n
    return out


def _block_timestamps(content_type: str, start: int, blocks: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """(has a timestamp, timestamp as uint64) of each block, as `scan_blocks(strict=False)` reads it."""
    total = len(blocks)
    has = np.zeros(total, bool)
    ts = np.zeros(total, np.uint64)
    first = 1 if start == 0 else 0
    where: Sequence[int] = range(first, total)  # positions in `blocks` of the blocks scanned
    rows = blocks[first:]
    if None in rows:  # cleared blocks (a C-level scan: a generator here cost a quarter of the whole)
        where = [i for i, b in zip(where, rows, strict=True) if b is not None]
        rows = [b for b in rows if b is not None]
    present = cast(Sequence[bytes], rows)
    n = len(present)
    if n < MIN_COLUMNS:
        for i, b in zip(where, present, strict=True):
            t = _reference_ts(content_type, start + i, b)
            if t is not None:
                has[i], ts[i] = True, t
        return has, ts
    if content_type != DRIVE_EVENT and _native is not None:  # most blocks, a block at a time in C
        ok_b, has_b, ts_b = _native.writer_shape(present)
        ok = np.frombuffer(ok_b, bool)
        p_has = np.frombuffer(has_b, bool).copy()
        p_ts = np.frombuffer(ts_b, "<u8").astype(np.uint64)
        rest = np.flatnonzero(~ok)
        if rest.size:
            others = [present[i] for i in rest.tolist()]
            buf, starts, ends = _laid_out(others)
            _other_tiers(content_type, start, where, present, rest, buf, starts, ends, p_has, p_ts)
    else:
        buf, starts, ends = _laid_out(present)
        p_has = np.zeros(n, bool)
        p_ts = np.zeros(n, np.uint64)
        rest = np.arange(n)
        if content_type != DRIVE_EVENT:  # most blocks: as encode_entry lays them out
            ok, w_has, w_ts = _writer_shape(buf, starts, ends)
            p_has[ok], p_ts[ok] = w_has[ok], w_ts[ok]
            rest = np.flatnonzero(~ok)
        if rest.size:
            _other_tiers(content_type, start, where, present, rest, buf, starts[rest], ends[rest], p_has, p_ts)
    at = slice(first, total) if isinstance(where, range) else np.asarray(where, np.int64)
    has[at], ts[at] = p_has, p_ts
    return has, ts


def expiry_candidates(blocks: Sequence[bytes]) -> np.ndarray:
    """Which blocks may carry an `expires_at` (retention's filter: the others surely do not).

    An entry laid out as `encode_entry` writes it (`_writer_shape`, in C where
    built) has its fields in that order, so an `expires_at` (field 10, a varint)
    is its last field if present: a block whose trailing varint is not preceded
    by tag 0x50 has none. Every other block is a candidate (decoded by the caller).
    """
    if not blocks:
        return np.zeros(0, bool)
    native = getattr(_native, "expiry_shape", None)  # None: no C build, or one from before it had this
    out: np.ndarray
    if native is not None:
        out = np.frombuffer(native(blocks), np.uint8) != 0
        return out
    buf, starts, ends = _laid_out(blocks)
    ok = _writer_shape(buf, starts, ends)[0]
    out = ~ok | (_trailing_varint_tag(buf, starts, ends) == EXPIRES_TAG)
    return out


def _trailing_varint_tag(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The byte before the varint ending each message buf[starts:ends] (-1: it ends in no varint)."""
    n = len(ends)
    tag = np.full(n, -1, np.int64)
    last = ends - 1
    open_ = (ends - starts >= 2) & (buf[np.maximum(last, 0)] < 0x80)  # a varint's last byte has no high bit
    for d in range(1, MAX_VARINT_BYTES + 1):  # back over the varint's other bytes (high bit set)
        p = last - d
        live = open_ & (p >= starts)
        b = buf[np.maximum(p, 0)]
        hit = live & (b < 0x80)
        tag[hit] = b[hit]
        open_ &= ~hit & (p >= starts)
    return tag


#: InflatedEntry.expires_at's tag (field 10, varint), and the longest varint
EXPIRES_TAG = 0x50
MAX_VARINT_BYTES = 10


def _laid_out(blocks: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks joined (and padded: entry_columns.PAD) as one uint8 array, with each one's start and end."""
    sizes = np.fromiter(map(len, blocks), np.int64, len(blocks))
    offsets = np.zeros(len(blocks) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return np.frombuffer(b"".join(blocks) + PAD, np.uint8), offsets[:-1], offsets[1:]


def _other_tiers(
    content_type: str,
    start: int,
    where: Sequence[int],
    present: Sequence[bytes],
    rest: np.ndarray,
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    p_has: np.ndarray,
    p_ts: np.ndarray,
) -> None:
    """The blocks `rest` (positions in `present`, laid out in buf[starts:ends]) that are not as
    encode_entry lays them out: any field order, unknown fields, drive events; and what that scan
    cannot read exactly, upb's. Fills in p_has and p_ts at `rest`."""
    g_has, g_ts, bad = _any_shape(content_type, buf, starts, ends)
    p_has[rest], p_ts[rest] = g_has & ~bad, g_ts
    for i in rest[bad].tolist():
        t = _reference_ts(content_type, start + where[i], present[i])
        if t is not None:
            p_has[i], p_ts[i] = True, t


#: InflatedEntry's fields as encode_entry writes them, in its order: (tag byte, length-delimited, required)
WRITER_ORDER = ((0x0A, True, True), (0x12, True, False), (0x18, False, False), (0x22, True, True))
WRITER_TAIL = ((0x48, False, False), (0x50, False, False))  # timestamp, expires_at
TIMESTAMP_TAG = 0x48


def _writer_shape(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which messages buf[starts:ends] are entries laid out as `encode_entry` writes them, and their timestamps.

    That layout: key (ASCII), value?, deleted?, trie, timestamp?, expires_at?, each
    once, in that order, with one-byte tags, varints of at most MAX_VARINT bytes and
    nothing after. Each such message is a valid entry whatever its field values, so
    its timestamp is the one upb reads; a field at a time, no per-field loop as in
    `scan_fields`. Returns (ok, has timestamp, timestamp as uint64).
    """
    n = len(starts)
    pos = starts.copy()
    ok = np.ones(n, bool)
    has_ts = np.zeros(n, bool)
    ts = np.zeros(n, np.int64)
    key_at = key_len = np.zeros(n, np.int64)
    for tag, delimited, required in WRITER_ORDER + WRITER_TAIL:
        hit = ok & (pos < ends) & (buf[pos] == tag)
        if required:
            ok &= hit
        elif not hit.any():  # deleted and expires_at are seldom set
            continue
        val, after, bad = varints(buf, pos + 1, ends)
        if delimited:
            bad |= val > ends - after
            if tag == 0x0A:
                key_at, key_len = np.where(hit & ~bad, after, 0), np.where(hit & ~bad, val, 0)
            after = after + np.where(bad, 0, val)
        ok &= ~(hit & bad)
        hit &= ~bad
        pos = np.where(hit, after, pos)  # never past the message's end: a bad field does not move it
        if tag == TIMESTAMP_TAG:
            has_ts, ts = hit, val
    ok &= pos == ends
    # a key byte over 0x7F may be no UTF-8 (upb's check, in _parse): such blocks take the other paths
    bounds = np.empty(2 * n, np.int64)  # each key's [first, end), then the gap to the next one
    bounds[0::2], bounds[1::2] = key_at, key_at + key_len
    top = np.maximum.reduceat(buf, bounds)[0::2]  # an empty range yields its first byte: ignored below
    ok &= ~((top >= 0x80) & (key_len > 0))
    return ok, has_ts & ok, ts.astype(np.uint64)


def _any_shape(
    content_type: str, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`entry_columns.scan_fields` of the messages buf[starts:ends]: (has timestamp, timestamp, bad), where bad
    ones (the scan cannot read them exactly, or their key may be no UTF-8) are the reference's."""
    n = len(starts)
    f, bad = scan_fields(buf, starts, ends, ENTRY_FIELDS, ENTRY_REFUSED)
    for k in ENTRY_REQUIRED:
        bad |= ~f[k].present
    key = f[1]
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2], bounds[1::2] = key.offset, key.offset + key.value
    top = np.maximum.reduceat(buf, bounds)[0::2]
    bad |= (top >= 0x80) & (key.value > 0)
    if content_type == DRIVE_EVENT:
        value = f[2]
        ev, ev_bad = scan_fields(
            buf, value.offset, value.offset + np.where(value.present, value.value, 0), DRIVE_FIELDS
        )
        st = ev[1]
        stat_fields = dict.fromkeys(STAT_NUMBERS, VARINT)
        s, s_bad = scan_fields(buf, st.offset, st.offset + np.where(st.present, st.value, 0), stat_fields)
        bad |= ev_bad | s_bad | (st.present & ~s[STAT_REQUIRED].present)
        for k in STAT_32:  # upb takes a uint32 from a wider varint its own way
            bad |= s[k].present & (s[k].value >= 1 << 32)
        has, ts = ev[2].present, ev[2].value  # a drive event's own timestamp only, as scan_blocks reads it
    else:
        has, ts = f[9].present, f[9].value
    return has, ts.astype(np.uint64), bad
