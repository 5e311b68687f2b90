"""The batch check of decoded columns against blocks says what decoding each block one by one says.

Random entries, canonical (as feedlog writes them) and not (another field order, hyperdb's
inflated fields, a non-empty trie, an explicit `deleted: false`, bytes that are no entry),
with random columns changed: `_column_mismatches` (the numpy canonical check, then a batch
parse, then one-by-one decoding) must name exactly the rows and columns `_differs` names.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from feedlog.lake import entry_check
from feedlog.lake.audit import _column_mismatches, _decoded_columns, _differs
from feedlog.lake.rows import SCHEMA, ts_us
from feedlog.log.entries import ENTRY, decode_record, encode_entry
from feedlog.pb import hyperdb_pb2

TIMES = [None, 0, 1, 127, 128, 1_700_000_000_000, 2**53, 2**62, 2**63 + 5, 2**64 - 1]
KEYS = ["", "/k", "é/ключ/🔑", "x" * 127, "y" * 128, "z" * 20_000]


def random_block(rnd: random.Random) -> bytes:
    key = rnd.choice(KEYS)
    value = rnd.choice([None, b"", rnd.randbytes(rnd.choice([1, 127, 128, 300]))])
    deleted = rnd.random() < 0.2
    ts, exp = rnd.choice(TIMES), rnd.choice(TIMES)
    kind = rnd.random()
    if kind < 0.6:  # canonical
        return encode_entry(ENTRY, key, value, deleted=deleted, timestamp=ts, expires_at=exp)
    e = hyperdb_pb2.InflatedEntry(key=key, trie=b"")
    if value is not None:
        e.value = value
    if ts is not None:
        e.timestamp = ts
    if exp is not None:
        e.expires_at = exp
    if kind < 0.7:
        e.deleted = False  # explicit: not canonical, same decoding
    elif kind < 0.78:
        e.trie = b"\x01\x02"
    elif kind < 0.84:
        e.clock.extend([1, 2])
    elif kind < 0.9:  # the same fields, last first
        parts = [_len(1, key.encode()), b"" if value is None else _len(2, value), _len(4, b"")]
        parts += [b"" if ts is None else _var(9, ts), b"" if exp is None else _var(10, exp)]
        return b"".join(reversed(parts))
    elif kind < 0.95:
        return rnd.randbytes(rnd.randrange(0, 40))  # no entry at all
    return e.SerializePartialToString() if kind < 0.97 else b"\x0a\x02\xff\xfe\x22\x00"  # a key that is not UTF-8


def _varint(x: int) -> bytes:
    out = bytearray()
    while True:
        out.append((x & 0x7F) | (0x80 if x > 0x7F else 0))
        x >>= 7
        if not x:
            return bytes(out)


def _len(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _var(field: int, x: int) -> bytes:
    return _varint(field << 3) + _varint(x)


def rows_of(blocks: list[bytes], rnd: random.Random) -> pa.RecordBatch:
    cols: dict[str, list[Any]] = {
        n: [] for n in ("block", "key", "value", "deleted", "timestamp", "expires_at", "stat")
    }
    for seq, b in enumerate(blocks, 1):
        r = decode_record(ENTRY, seq, b)
        row: dict[str, Any] = {
            "block": b,
            "key": r.key,
            "value": r.value,
            "deleted": r.deleted,
            "timestamp": ts_us(r.timestamp),
            "expires_at": ts_us(r.expires_at),
            "stat": None,
        }
        if rnd.random() < 0.15:  # a changed column
            name = rnd.choice(["key", "value", "deleted", "timestamp", "expires_at", "stat"])
            row[name] = {
                "key": rnd.choice([None, "/other", r.key + "x"]),
                "value": rnd.choice([None, b"", b"forged"]),
                "deleted": rnd.choice([None, not r.deleted]),
                "timestamp": rnd.choice([None, 0, 1, 1500, -1000, (row["timestamp"] or 0) + 1000]),
                "expires_at": rnd.choice([None, 0, 999, (row["expires_at"] or 0) + 1000]),
                "stat": {"mode": 1},
            }[name]
        for k, v in row.items():
            cols[k].append(v)
    arrays = [pa.array(cols[n], pa.int64() if n in ("timestamp", "expires_at") else SCHEMA.field(n).type) for n in cols]
    arrays[4] = arrays[4].cast(SCHEMA.field("timestamp").type)
    arrays[5] = arrays[5].cast(SCHEMA.field("expires_at").type)
    return pa.RecordBatch.from_arrays(arrays, names=list(cols))


@pytest.mark.parametrize("seed", range(6))
def test_the_batch_check_names_what_decoding_each_block_names(seed: int) -> None:
    rnd = random.Random(seed)
    blocks = [random_block(rnd) for _ in range(400)]
    rows = rows_of(blocks, rnd)
    seqs = np.arange(1, len(blocks) + 1)
    decoded = _decoded_columns(rows)
    want = [(i, d) for i in range(len(blocks)) if (d := _differs(ENTRY, i + 1, blocks[i], decoded, i))]
    assert want, "the inputs must hold changed rows"
    assert _column_mismatches(ENTRY, seqs, blocks, rows) == want


def test_canonical_rows_are_proved_by_their_bytes_alone() -> None:
    """feedlog's own blocks are never even parsed: none is a suspect (what makes the audit fast)."""
    rnd = random.Random(3)
    blocks = [
        encode_entry(
            ENTRY,
            rnd.choice(KEYS),
            rnd.choice([None, b"", b"v" * 200]),
            deleted=False,
            timestamp=rnd.choice(TIMES[:7]),
            expires_at=rnd.choice(TIMES[:7]),
        )
        for _ in range(300)
    ]
    rows = rows_of(blocks, random.Random(0)).slice(0, 300)
    clean = [i for i in range(300) if not _differs(ENTRY, i + 1, blocks[i], _decoded_columns(rows), i)]
    sus = entry_check.suspect_rows(rows)
    assert len(clean) > 200 and not sus[clean].any()
