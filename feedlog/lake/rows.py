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

from typing import Any

import pyarrow as pa

from ..log.entries import DRIVE_EVENT, STAT_FIELDS, Record, decode_entry
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
    """Accumulates verified batches of one feed into Arrow record batches of `SCHEMA`."""

    def __init__(self, feed_hex: str, content_type: str, header: bytes) -> None:
        self.feed_hex = feed_hex
        self.drive = content_type == DRIVE_EVENT
        self.content_type = content_type
        self.header = header
        self._cols: dict[str, list[Any]] = {n: [] for n in COLUMNS if n != "feed"}

    def __len__(self) -> int:
        return len(self._cols["seq"])

    def add(self, batch: Verified) -> None:
        c = self._cols
        last = batch.state.length - 1
        leaves = {n.index // 2: n for n in batch.cleared}
        for k, block in enumerate(batch.blocks):
            seq = batch.start + k
            if block is None:
                self._cleared(seq, leaves[seq])
            else:
                self._entry(decode_entry(self.content_type, seq, block), block)
            c["signed"].append(signed_value(batch.state, self.header) if seq == last else None)

    def _entry(self, r: Record, block: bytes) -> None:
        c = self._cols
        c["seq"].append(r.seq)
        c["key"].append(r.key)
        c["value"].append(r.value)
        c["deleted"].append(r.deleted)
        c["timestamp"].append(ts_us(r.timestamp))
        c["expires_at"].append(ts_us(r.expires_at))
        c["stat"].append(r.stat if self.drive and r.stat is not None else None)
        c["cleared"].append(False)
        c["block"].append(block)
        c["leaf_hash"].append(None)
        c["size"].append(len(block))

    def _cleared(self, seq: int, leaf: Node) -> None:
        c = self._cols
        c["seq"].append(seq)
        for name in ("key", "value", "deleted", "timestamp", "expires_at", "stat", "block"):
            c[name].append(None)
        c["cleared"].append(True)
        c["leaf_hash"].append(leaf.hash)
        c["size"].append(leaf.size)

    def flush(self) -> pa.RecordBatch:
        n = len(self)
        arrays = [pa.array([self.feed_hex] * n, pa.string())]
        for name in COLUMNS[1:]:
            arrays.append(pa.array(self._cols[name], SCHEMA.field(name).type))
        self._cols = {n: [] for n in COLUMNS if n != "feed"}
        return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
