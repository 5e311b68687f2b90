"""Do rows' decoded columns match their entry blocks? A batch at a time, without parsing a block.

A row of an entry feed is right when decoding its `block` gives its `key`,
`value`, `deleted`, `timestamp` and `expires_at`. Rather than parse every block,
`suspects` builds the canonical encoding of each row's columns (what
`entries.encode_entry` writes: fields 1, 2, 3, 4 and 9, 10 in field order, an
empty trie, minimal varints) for the whole batch with numpy, and compares it
with the block bytes. Equal bytes prove the columns: decoding the canonical
encoding of values gives those values back. A row whose block differs
(another writer's field order, hyperdb's inflated fields, a non-empty trie,
or a column that really was changed) is only a suspect: the caller decodes
those with `entries.decode_entry`, which stays the one definition of an entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Bools = np.ndarray[Any, np.dtype[np.bool_]]
Ints = np.ndarray[Any, np.dtype[np.int64]]

# the tag bytes of InflatedEntry's fields, as (field number << 3) | wire type
_KEY, _VALUE, _DELETED, _TRIE, _TIMESTAMP, _EXPIRES = 0x0A, 0x12, 0x18, 0x22, 0x48, 0x50
#: a uint64 varint takes at most 10 bytes
_VARINT_MAX = 10


def suspect_rows(rows: pa.RecordBatch | pa.Table) -> Bools:
    """`suspects` of feed rows (`rows.SCHEMA`'s columns; timestamps as stored, microseconds)."""
    return suspects(
        rows.column("block"),
        rows.column("key"),
        rows.column("value"),
        rows.column("deleted"),
        rows.column("timestamp").cast(pa.int64()),
        rows.column("expires_at").cast(pa.int64()),
    )


def suspects(
    block: pa.Array, key: pa.Array, value: pa.Array, deleted: pa.Array, timestamp: pa.Array, expires_at: pa.Array
) -> Bools:
    """True for each row whose block is not the canonical encoding of its columns (or has no block).

    `timestamp`/`expires_at` are the columns as int64 microseconds (a row's writer
    milliseconds times 1,000). All arrays are of one length, none chunked. The
    tags and varints around the key and value bytes are built with numpy, a row
    at a time per numpy step; Arrow joins them with the key and value bytes and
    compares the result with the blocks.
    """
    n = len(block)
    sus = np.asarray(block.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    # columns no canonical block gives: a null key or deleted, a time that is not whole ms >= 0
    for col in (key, deleted):
        if col.null_count:
            sus |= np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    key = (pc.fill_null(key, "") if key.null_count else key).cast(pa.binary())
    has_val = _valid(value)
    value = pc.fill_null(value, b"") if value.null_count else value
    key_len = np.asarray(pc.binary_length(key).to_numpy(zero_copy_only=False), dtype=np.int64)
    val_len = np.asarray(pc.binary_length(value).to_numpy(zero_copy_only=False), dtype=np.int64)
    is_del = np.asarray(pc.fill_null(deleted, False).to_numpy(zero_copy_only=False), dtype=bool)
    times = []
    for col in (timestamp, expires_at):
        has = _valid(col)
        us = np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        sus |= has & ((us < 0) | (us % 1000 != 0))
        times.append((has, (np.maximum(us, 0) // 1000).astype(np.uint64)))
    (has_ts, ts), (has_exp, exp) = times

    # the bytes before the key, between key and value, and after the value
    ks = np.ones(n, dtype=bool)
    before = _Builder(1 + _varint_len(key_len))
    before.byte(ks, _KEY)
    before.varint(ks, key_len.astype(np.uint64))
    between = _Builder(has_val * (1 + _varint_len(val_len)))
    between.byte(has_val, _VALUE)
    between.varint(has_val, val_len.astype(np.uint64))
    after = _Builder(is_del * 2 + 2 + has_ts * (1 + _varint_len(ts)) + has_exp * (1 + _varint_len(exp)))
    after.byte(is_del, _DELETED)
    after.byte(is_del, 1)
    after.byte(ks, _TRIE)
    after.byte(ks, 0)
    after.byte(has_ts, _TIMESTAMP)
    after.varint(has_ts, ts)
    after.byte(has_exp, _EXPIRES)
    after.varint(has_exp, exp)
    expected = pc.binary_join_element_wise(
        before.array(), key, between.array(), value.cast(pa.binary()), after.array(), b""
    )
    same = pc.fill_null(pc.equal(expected, block.cast(pa.binary())), False)
    sus |= ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    return sus


class _Builder:
    """A binary array of n short values of known lengths, written a field at a time for many rows."""

    def __init__(self, lengths: Ints) -> None:
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.out = np.zeros(int(self.offsets[-1]), dtype=np.uint8)
        self.pos = self.offsets[:-1].copy()

    def byte(self, mask: Bools, value: int) -> None:
        self.out[self.pos[mask]] = value
        self.pos += mask

    def varint(self, mask: Bools, x: np.ndarray[Any, Any]) -> None:
        x = x.copy()
        active = mask.copy()
        for _ in range(_VARINT_MAX):
            if not active.any():
                return
            low = (x & np.uint64(0x7F)).astype(np.uint8)
            x >>= np.uint64(7)
            more = active & (x != 0)
            self.out[self.pos[active]] = low[active] | (more[active].astype(np.uint8) << 7)
            self.pos += active
            active = more

    def array(self) -> pa.Array:
        n = len(self.pos)
        return pa.Array.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(self.offsets), pa.py_buffer(self.out)]
        ).cast(pa.binary())


def _valid(col: pa.Array) -> Bools:
    if not col.null_count:
        return np.ones(len(col), dtype=bool)
    return np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _varint_len(x: np.ndarray[Any, Any]) -> Ints:
    x = x.astype(np.uint64)
    n = np.ones(len(x), dtype=np.int64)
    for k in range(1, _VARINT_MAX):
        n += x >= np.uint64(1 << (7 * k))
    return n
