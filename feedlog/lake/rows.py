"""The rows a feed becomes: one per entry, as Arrow, in the documented `SCHEMA`.

    feed        string     the feed's public key, hex
    seq         long       the entry's position in the feed: the order (timestamps are not)
    key         string     the entry's key (a path, for drive-event feeds)
    value       binary     the value (for drive-event feeds: the DriveEvent's bytes)
    deleted     boolean    a tombstone (drive-event: no stat)
    timestamp   timestamp  writer timestamp, UTC; untrusted data, null when absent
                           (or beyond what a timestamp column holds: the block keeps it exactly)
    expires_at  timestamp  when the entry's TTL runs out, UTC; null: never
    stat        struct     drive-event feeds: hyperdrive's Stat fields; null otherwise
    cleared     boolean    the payload was cleared (TTL compaction, here or on the peer)
    block       binary     the exact signed block bytes (protobuf encoding is not canonical,
                           so these, not the decoded columns, are what the signature covers)
    leaf_hash   binary     the block's Merkle leaf hash, kept when the block is cleared
    size        long       the block's length in bytes (part of the Merkle tree)
    signed      struct     on the last row of each signed append batch: the feed's signed
                           state at length seq + 1 (length, fork, tree_hash, signature) and
                           block 0 (header), so the rows alone prove the feed prefix

`feedlog audit` re-derives every leaf from `block` (or `leaf_hash` + `size`),
rebuilds the tree and checks each signature against a key the user supplies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..log.entries import DRIVE_EVENT, STAT_FIELDS
from ..log.entry_columns import decode_columns
from ..log.merkle import Node, TreeState
from ..replication.verify import Verified

TIMESTAMP = pa.timestamp("us", tz="UTC")
#: the largest ms value a microsecond timestamp column holds
MAX_TS_MS = (2**63 - 1) // 1000
STAT = pa.struct([pa.field(f, pa.int64()) for f in STAT_FIELDS])
SIGNED = pa.struct(
    [
        pa.field("length", pa.int64()),
        pa.field("fork", pa.int64()),
        pa.field("tree_hash", pa.binary()),
        pa.field("signature", pa.binary()),
        pa.field("header", pa.binary()),
    ]
)
SCHEMA = pa.schema(
    [
        pa.field("feed", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("key", pa.string()),
        pa.field("value", pa.binary()),
        pa.field("deleted", pa.bool_()),
        pa.field("timestamp", TIMESTAMP),
        pa.field("expires_at", TIMESTAMP),
        pa.field("stat", STAT),
        pa.field("cleared", pa.bool_(), nullable=False),
        pa.field("block", pa.binary()),
        pa.field("leaf_hash", pa.binary()),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("signed", SIGNED),
    ]
)
COLUMNS = tuple(SCHEMA.names)


def ts_us(ms: int | None) -> int | None:
    """A writer timestamp (ms) as the microseconds of a timestamp column; None if it does not fit."""
    return ms * 1000 if ms is not None and 0 <= ms <= MAX_TS_MS else None


def signed_value(state: TreeState, header: bytes) -> dict[str, Any]:
    return {
        "length": state.length,
        "fork": state.fork,
        "tree_hash": state.tree_hash,
        "signature": state.signature,
        "header": header,
    }


class RowBuilder:
    """Accumulates verified batches of one feed; `flush` makes them an Arrow record batch of `SCHEMA`.

    Columns are built a batch at a time (`entry_columns.decode_columns`, arrays from
    buffers): no Python object per row or per field (issue 17).
    """

    def __init__(self, feed_hex: str, content_type: str, header: bytes) -> None:
        self.feed_hex = feed_hex
        self.drive = content_type == DRIVE_EVENT
        self.content_type = content_type
        self.header = header
        self._batches: list[Verified] = []
        self._rows = 0
        #: block bytes held (a flush's binary columns stay under Arrow's 2 GiB offsets)
        self.nbytes = 0

    def __len__(self) -> int:
        return self._rows

    def add(self, batch: Verified) -> None:
        self._batches.append(batch)
        self._rows += len(batch.blocks)
        try:
            self.nbytes += sum(map(len, batch.blocks))  # type: ignore[arg-type]
        except TypeError:  # cleared blocks
            self.nbytes += sum(len(b) for b in batch.blocks if b is not None)

    def flush(self) -> pa.RecordBatch:
        batches, self._batches, self._rows, self.nbytes = self._batches, [], 0, 0
        return build_rows(self.feed_hex, self.content_type, self.header, batches)


def build_rows(feed_hex: str, content_type: str, header: bytes, batches: Sequence[Verified]) -> pa.RecordBatch:
    """The rows of verified `batches` of one feed, in `SCHEMA`."""
    blocks = [b for v in batches for b in v.blocks]
    n = len(blocks)
    ranges = [np.arange(v.start, v.start + len(v.blocks), dtype=np.int64) for v in batches]
    seqs = np.concatenate(ranges) if ranges else np.zeros(0, np.int64)
    cols = decode_columns(content_type, seqs, blocks)
    present = cols.present
    # cleared blocks: their leaf's hash and size; the last row of each signed batch: its signed state
    cleared = _cleared_rows(batches)
    signed = [(k, v.state) for k, v in _signed_rows(batches)]
    sizes = cols.size.copy()
    for k, leaf in cleared:
        sizes[k] = leaf.size
    leaf_hash = _sparse(n, pa.binary(), [k for k, _ in cleared], [leaf.hash for _, leaf in cleared])
    signed_col = _sparse(n, SIGNED, [k for k, _ in signed], [signed_value(st, header) for _, st in signed])
    arrays = [
        _repeated(feed_hex, n),
        pa.array(seqs, pa.int64()),
        cols.key,
        cols.value,
        pa.array(cols.deleted, pa.bool_(), mask=~present),
        _timestamps(cols.timestamp, cols.has_timestamp),
        _timestamps(cols.expires_at, cols.has_expires_at),
        cols.stat if cols.stat is not None and content_type == DRIVE_EVENT else pa.nulls(n, STAT),
        pa.array(~present, pa.bool_()),
        cols.block,
        leaf_hash,
        pa.array(sizes, pa.int64()),
        signed_col,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def _cleared_rows(batches: Sequence[Verified]) -> list[tuple[int, Node]]:
    out: list[tuple[int, Node]] = []
    row = 0
    for v in batches:
        if v.cleared:
            leaves = {leaf.index // 2: leaf for leaf in v.cleared}
            out.extend((row + k, leaves[v.start + k]) for k, b in enumerate(v.blocks) if b is None)
        row += len(v.blocks)
    return out


def _signed_rows(batches: Sequence[Verified]) -> list[tuple[int, Verified]]:
    out: list[tuple[int, Verified]] = []
    row = 0
    for v in batches:
        row += len(v.blocks)
        if v.blocks and v.start + len(v.blocks) == v.state.length:  # a trimmed batch has no last row here
            out.append((row - 1, v))
    return out


def _sparse(n: int, kind: pa.DataType, rows: Sequence[int], values: Sequence[Any]) -> pa.Array:
    """A column of n nulls but `values` at `rows`: the few values and one null, taken by index."""
    few = pa.array([*values, None], kind)
    idx = np.full(n, len(values), np.int64)
    idx[list(rows)] = np.arange(len(values))
    return few.take(pa.array(idx))


def _repeated(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _timestamps(ms: np.ndarray, has: np.ndarray) -> pa.Array:
    """Writer ms as a microsecond timestamp column (`ts_us`): null where absent or too far out."""
    valid = has & (ms <= MAX_TS_MS)
    us = np.where(valid, ms, 0).astype(np.int64) * 1000
    nulls = len(valid) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(TIMESTAMP, len(valid), [bitmap, pa.py_buffer(us)], nulls)
