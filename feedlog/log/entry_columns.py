"""Entry blocks decoded a column at a time: one field of every block in a batch per numpy step.

`entries.decode_entry` parses one block with upb and builds a `Record`: a few
microseconds of Python per block, most of a reader's time (issue 17). This
reads the same fields of a whole batch at once: every block's next tag, then
its varint or length-delimited payload, one vectorised step per field position,
and hands back Arrow arrays built from offsets into the blocks' bytes.

It reads only the common shape of an entry: fields 1-4, 9 and 10 of
`InflatedEntry` (each at most once, with its declared wire type), unknown
fields of plain wire types, varints of at most 9 bytes. Any other block (a
field twice, hyperdb's clock/inflate/feeds/contentFeed, groups, a long varint,
truncation, a missing required field, a key that is not UTF-8, a drive event
outside the same shape) is decoded by `decode_entry` instead, which stays the
one definition of a valid entry and raises its `Corruption` for a block that is
none. tests/log/test_entry_columns.py compares the two on random blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import InvalidArgument
from .entries import DRIVE_EVENT, STAT_FIELDS, Record, decode_entry

VARINT, LEN, I64, I32 = 0, 2, 1, 5
#: a longer varint (a value of 2**63 or more) is left to the reference decoder
MAX_VARINT = 9
#: zero bytes after the data, so a varint read never indexes past the buffer
PAD = bytes(16)

#: InflatedEntry: key, value, deleted, trie, timestamp, expires_at (the fields a row has)
ENTRY_FIELDS = {1: LEN, 2: LEN, 3: VARINT, 4: LEN, 9: VARINT, 10: VARINT}
#: clock, inflate, feeds, contentFeed: hyperdb's, rare in feeds; their blocks take the reference path
ENTRY_REFUSED = frozenset({5, 6, 7, 8})
ENTRY_REQUIRED = (1, 4)
#: DriveEvent: stat, timestamp
DRIVE_FIELDS = {1: LEN, 2: VARINT}
STAT_NUMBERS = {i + 1: name for i, name in enumerate(STAT_FIELDS)}
STAT_32 = (1, 2, 3)  # mode, uid, gid are uint32
STAT_REQUIRED = 1  # mode
#: fields a message may hold before the scan gives it to the reference decoder (unknown ones count)
MAX_FIELDS = 16
MAX_INT64 = 2**63 - 1
#: block bytes one call decodes (with the reference's copies of fallback keys and values, under 2 GiB)
MAX_BATCH_BYTES = 1 << 30

STAT_TYPE = pa.struct([pa.field(f, pa.int64()) for f in STAT_FIELDS])


@dataclass(frozen=True)
class EntryColumns:
    """Decoded columns of n blocks (None: a cleared block, null in every column)."""

    present: np.ndarray  # bool: the block has bytes
    block: pa.BinaryArray  # the exact block bytes
    size: np.ndarray  # int64: each block's length (0 for a cleared one)
    key: pa.StringArray
    value: pa.BinaryArray
    deleted: np.ndarray  # bool
    timestamp: np.ndarray  # uint64 ms, valid where has_timestamp
    has_timestamp: np.ndarray
    expires_at: np.ndarray  # uint64 ms, valid where has_expires_at
    has_expires_at: np.ndarray
    #: drive-event feeds: hyperdrive's Stat, null where none; a field over int64's range is null
    stat: pa.StructArray | None


@dataclass
class _Field:
    present: np.ndarray  # bool
    value: np.ndarray  # int64: a varint's value, or a length-delimited field's length
    offset: np.ndarray  # int64: a length-delimited field's first byte


def varints(buf: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The varints at `pos`: values, positions after them, and where one is not readable here
    (longer than MAX_VARINT bytes, or running past its message's `end`)."""
    b = buf[pos]
    val = (b & 0x7F).astype(np.int64)
    size = np.ones(len(pos), np.int64)
    more = np.flatnonzero(b & 0x80)
    for k in range(1, MAX_VARINT):
        if not more.size:
            break
        b = buf[pos[more] + k]
        val[more] |= (b & 0x7F).astype(np.int64) << (7 * k)
        size[more] += 1
        more = more[(b & 0x80) != 0]
    after = pos + size
    bad = after > end
    bad[more] = True
    return val, after, bad


def scan_fields(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    fields: Mapping[int, int],
    refused: frozenset[int] = frozenset(),
) -> tuple[dict[int, _Field], np.ndarray]:
    """The `fields` (number -> wire type) of the messages buf[starts:ends], and which messages the
    scan cannot read exactly (a field twice or of another wire type, a refused field, a group,
    a truncated field, more than MAX_FIELDS fields): those are the reference decoder's."""
    n = len(starts)
    found = {k: _Field(np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)) for k in fields}
    bad = np.zeros(n, bool)
    pos = starts.copy()
    act = np.flatnonzero(pos < ends)
    for _ in range(MAX_FIELDS):
        if not act.size:
            break
        e = ends[act]
        tag, p, wrong = varints(buf, pos[act], e)
        number, wt = tag >> 3, tag & 7
        # upb refuses field 0, a number over 2**29 - 1 and a tag longer than 5 bytes (a valid number, padded)
        wrong |= (number == 0) | (number >= 1 << 29) | (p - pos[act] > 5)
        val = np.zeros(len(act), np.int64)
        after = p.copy()
        i = np.flatnonzero((wt == VARINT) & ~wrong)
        if i.size:
            val[i], after[i], w = varints(buf, p[i], e[i])
            wrong[i] |= w
        i = np.flatnonzero((wt == LEN) & ~wrong)
        if i.size:
            length, first, w = varints(buf, p[i], e[i])
            w |= length > e[i] - first
            val[i], p[i], after[i] = length, first, first + np.where(w, 0, length)
            wrong[i] |= w
        after[wt == I64] += 8
        after[wt == I32] += 4
        wrong |= ((wt != VARINT) & (wt != LEN) & (wt != I64) & (wt != I32)) | (after > e)
        for k, want in fields.items():
            hit = (number == k) & ~wrong
            if not hit.any():
                continue
            f = found[k]
            wrong |= hit & (wt != want)
            ok = hit & (wt == want)
            rows = act[ok]
            wrong[ok] |= f.present[rows]  # a field twice: upb's merge rules are the reference's business
            f.present[rows] = True
            f.value[rows] = val[ok]
            f.offset[rows] = p[ok]
        for k in refused:
            wrong |= number == k
        bad[act[wrong]] = True
        pos[act] = after
        act = act[~wrong & (after < e)]
    bad[act] = True  # more fields than MAX_FIELDS
    return found, bad


def _bitmap(valid: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _binary(kind: pa.DataType, buf: np.ndarray, offset: np.ndarray, length: np.ndarray, valid: np.ndarray) -> pa.Array:
    """The ranges buf[offset:offset+length] (null where not `valid`) as a `kind` (binary or string) array.

    Built as a binary view array over `buf` (16 bytes per row: the length, then up to 12 bytes
    inline or a 4-byte prefix and the offset), so numpy never touches the payload bytes; Arrow's
    cast copies them out in C++, and checks UTF-8 for a string (ArrowInvalid if one is not).
    """
    n = len(offset)
    length = np.where(valid, length, 0)
    views = np.empty((n, 16), np.uint8)
    words = views.view(np.int32)
    raw = sliding_window_view(buf, 12)[np.where(valid, offset, 0)]  # buf has >= 12 bytes of padding
    short = length <= 12
    if short.any():  # inline data is zero-padded
        raw[short] *= np.arange(12)[None, :] < length[short, None]
    views[:, 4:] = raw
    words[:, 0] = length
    far = np.flatnonzero(~short)
    words[far, 2] = 0  # the buffer index: data is the array's only buffer
    words[far, 3] = offset[far]
    nulls = n - int(np.count_nonzero(valid))
    data = pa.py_buffer(buf)
    out = pa.Array.from_buffers(
        pa.binary_view(), n, [_bitmap(valid) if nulls else None, pa.py_buffer(views), data], nulls
    )
    return out.cast(kind)


def _utf8_errors(keys: pa.Array) -> list[int]:
    """Rows whose key (binary) is not UTF-8 to Python's strict decoder, as upb's."""
    out = []
    for i, k in enumerate(keys.to_pylist()):
        try:
            if k is not None:
                k.decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    return out


def decode_columns(content_type: str, seqs: Sequence[int] | np.ndarray, blocks: Sequence[bytes | None]) -> EntryColumns:
    """The entries in `blocks` (with seqs `seqs`) as columns: `decode_entry`'s values, row for row.

    `Corruption` (from `decode_entry`) for a block that is not a valid entry of `content_type`.
    """
    n = len(blocks)
    try:  # no cleared block, the usual case
        sizes = np.fromiter(map(len, blocks), np.int64, n)  # type: ignore[arg-type]
        present = np.ones(n, bool)
        data = b"".join(blocks)  # type: ignore[arg-type]
    except TypeError:
        present = np.fromiter((b is not None for b in blocks), bool, n)
        sizes = np.fromiter((len(b) if b is not None else 0 for b in blocks), np.int64, n)
        data = b"".join([b for b in blocks if b is not None])
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > MAX_BATCH_BYTES:  # Arrow's binary offsets (and our views') are int32
        raise InvalidArgument(
            f"{n} blocks of {offsets[-1]} bytes in all: more than one Arrow batch holds; decode fewer"
        )
    starts, ends = offsets[:-1], offsets[1:]
    nulls = n - int(np.count_nonzero(present))
    block = pa.Array.from_buffers(
        pa.binary(),
        n,
        [_bitmap(present) if nulls else None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        nulls,
    )
    buf = np.frombuffer(data + PAD, np.uint8)
    f, bad = scan_fields(buf, starts, ends, ENTRY_FIELDS, ENTRY_REFUSED)
    for k in ENTRY_REQUIRED:
        bad |= ~f[k].present
    key, value, expires = f[1], f[2], f[10]
    deleted = f[3].present & (f[3].value != 0)
    timestamp, has_timestamp = f[9].value, f[9].present.copy()
    stat_cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    has_stat = np.zeros(n, bool)
    if content_type == DRIVE_EVENT:
        # the DriveEvent in each value (an absent value is an empty event: no stat, no timestamp)
        ev, ev_bad = scan_fields(
            buf, value.offset, value.offset + np.where(value.present, value.value, 0), DRIVE_FIELDS
        )
        st, ev_ts = ev[1], ev[2]
        timestamp = np.where(ev_ts.present, ev_ts.value, timestamp)
        has_timestamp |= ev_ts.present
        deleted |= ~st.present
        has_stat = st.present.copy()
        stat_end = st.offset + np.where(st.present, st.value, 0)
        s, s_bad = scan_fields(buf, st.offset, stat_end, dict.fromkeys(STAT_NUMBERS, VARINT))
        bad |= ev_bad | s_bad | (st.present & ~s[STAT_REQUIRED].present)
        for k in STAT_32:
            bad |= s[k].present & (s[k].value >= 1 << 32)
        stat_cols = {name: (s[k].value, s[k].present & has_stat) for k, name in STAT_NUMBERS.items()}
    timestamp = timestamp.astype(np.uint64)
    expires_at = expires.value.astype(np.uint64)
    bad &= present
    if bad.any():  # the reference decoder's values; their key and value bytes go after the blocks'
        extra = bytearray()
        pos = len(data)
        for i in (int(i) for i in np.flatnonzero(bad)):
            r = decode_entry(content_type, int(seqs[i]), blocks[i])  # type: ignore[arg-type]
            pos = _patch(i, r, pos, extra, key, value)
            deleted[i] = r.deleted
            has_timestamp[i] = r.timestamp is not None
            timestamp[i] = r.timestamp or 0
            expires.present[i] = r.expires_at is not None
            expires_at[i] = r.expires_at or 0
            has_stat[i] = r.stat is not None
            for name, (vals, has) in stat_cols.items():
                v = (r.stat or {}).get(name)
                has[i] = v is not None and v <= MAX_INT64  # a larger uint64 does not fit the column
                vals[i] = v if has[i] else 0
        buf = np.frombuffer(data + bytes(extra) + PAD, np.uint8)
    try:
        keys = _binary(pa.string(), buf, key.offset, key.value, present)
    except pa.ArrowInvalid:  # a key that is not UTF-8: the reference raises its Corruption naming the block
        raw = _binary(pa.binary(), buf, key.offset, key.value, present)
        for i in _utf8_errors(raw):
            decode_entry(content_type, int(seqs[i]), blocks[i])  # type: ignore[arg-type]
        # (unreached while Arrow's UTF-8 check is Python's) the keys as Python decodes them
        keys = pa.array([k.decode() if k is not None else None for k in raw.to_pylist()], pa.string())
    stat = None
    if content_type == DRIVE_EVENT:
        stat = pa.StructArray.from_arrays(
            [pa.array(vals, pa.int64(), mask=~has) for vals, has in stat_cols.values()],
            fields=list(STAT_TYPE),
            mask=pa.array(~(has_stat & present)),
        )
    return EntryColumns(
        present=present,
        block=block,
        size=sizes,
        key=keys,
        value=_binary(pa.binary(), buf, value.offset, value.value, value.present & present),
        deleted=deleted & present,
        timestamp=timestamp,
        has_timestamp=has_timestamp & present,
        expires_at=expires_at,
        has_expires_at=expires.present & present,
        stat=stat,
    )


def _patch(i: int, r: Record, pos: int, extra: bytearray, key: _Field, value: _Field) -> int:
    """Point row i's key and value at copies of the record's, appended to `extra` from `pos`."""
    k = r.key.encode()
    key.offset[i], key.value[i] = pos, len(k)
    extra += k
    pos += len(k)
    value.present[i] = r.value is not None
    if r.value is not None:
        value.offset[i], value.value[i] = pos, len(r.value)
        extra += r.value
        pos += len(r.value)
    return pos
