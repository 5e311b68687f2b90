"""Rows made tombstones (issue 37): what TTL compaction and forget rewrites do to a file's rows.

A tombstone keeps `feed`, `seq`, `key`, `deleted`, `timestamp`, `expires_at` and `size`, loses
`value`, `block` and `stat`, gains `cleared = true`, and keeps the Merkle leaf of the block it drops
in `leaf_hash`, so `feedlog audit` still verifies the feed, as a cleared block does in a feed.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.compute as pc

from .. import failpoints
from ..delta.actions import Add
from ..delta.storage import Storage
from ..delta.writer import WriteOptions, write_files
from ..errors import Unsupported
from ..log.crypto import leaf_hash


def tombstones(data: pa.Table, gone: pa.ChunkedArray | pa.Array, schema: pa.Schema) -> pa.Table:
    """`data` (a file's rows, as readers see them) with the rows `gone` marks made tombstones, as TTL
    compaction and forget rewrites make them: `value`, `block` and `stat` dropped, `cleared` set, and
    the Merkle leaf of the dropped block kept in `leaf_hash`, so the feed's tree still verifies. Pure."""
    mask = gone.to_pylist()
    blocks = data.column("block").to_pylist()
    leaves = data.column("leaf_hash").to_pylist()
    new_leaves = [leaf_hash(b) if m and b is not None else lh for m, b, lh in zip(mask, blocks, leaves, strict=True)]
    cols = {}
    for name in data.column_names:
        col = data.column(name)
        if name in ("value", "block", "stat"):
            col = pc.if_else(gone, pa.nulls(len(col), col.type), col)
        elif name == "cleared":
            col = pc.or_(col, gone)
        elif name == "leaf_hash":
            col = pa.array(new_leaves, pa.binary())
        cols[name] = col
    return pa.table(cols).select(list(schema.names))


def write_tombstoned(
    storage: Storage,
    data: pa.Table,
    gone: pa.ChunkedArray | pa.Array,
    schema: pa.Schema,
    options: WriteOptions,
    written_ms: int,
    point: str,
) -> Add:
    """One file's rows with those `gone` marks made tombstones (`rows.tombstones`), written as one new
    file of the table (uncommitted: the caller's commit removes the old file and adds it). `point`:
    the fail point between deciding and writing (TTL compaction's, a forget rewrite's)."""
    out = tombstones(data, gone, schema)
    failpoints.point(point)
    adds = write_files(storage, schema, (), out, written_ms, lambda: str(uuid.uuid4()), options)
    if len(adds) != 1:
        raise Unsupported("a rewritten file must stay one file")
    return adds[0]
