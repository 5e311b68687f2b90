"""Deletion vectors (issue 16): inline, relative-path and absolute-path DVs in the protocol's
RoaringBitmap format, applied in to_arrow, time travel and row counts, read alike by deltalake and
DuckDB. No writer here writes DVs (delta-rs rewrites files on delete), so the logs are written by
hand from PROTOCOL.md's examples and the bitmaps with pyroaring's portable 64-bit format."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta import dv as dvmod
from feedlog.errors import Corruption, Unsupported

from .conftest import deltalake_read, duckdb_read
from .test_real_data_scan import add, assert_all_agree, canon, field, metadata, parquet_file, protocol, write_commit

DV_PROTOCOL = protocol(["deletionVectors"], ["deletionVectors"])
FIELDS = [field("x", "long"), field("s", "string")]


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"x": pa.array(range(start, start + n), pa.int64()), "s": [f"r{i}" for i in range(n)]})


def inline(rows_: list[int]) -> dict[str, Any]:
    raw = dvmod.encode_bitmap(rows_)
    padded = raw + b"\0" * (-len(raw) % 4)
    return {"storageType": "i", "pathOrInlineDv": dvmod.z85_encode(padded), "sizeInBytes": len(raw),
            "cardinality": len(rows_)}  # fmt: skip


def on_disk(root: Path, bitmaps: list[list[int]], prefix: str = "") -> list[dict[str, Any]]:
    """One DV file with several DVs; the 'u' descriptor of each."""
    u = uuid.UUID(int=len(bitmaps) * 1000 + len(prefix))
    encoded = [dvmod.encode_bitmap(b) for b in bitmaps]
    body, offsets = dvmod.dv_file(encoded)
    target = root / prefix / f"deletion_vector_{u}.bin" if prefix else root / f"deletion_vector_{u}.bin"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(body)
    return [
        {"storageType": "u", "pathOrInlineDv": prefix + dvmod.z85_encode(u.bytes), "offset": off,
         "sizeInBytes": len(e), "cardinality": len(b)}
        for b, e, off in zip(bitmaps, encoded, offsets, strict=True)
    ]  # fmt: skip


def remove(a: dict[str, Any], dv: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"path": a["add"]["path"], "deletionTimestamp": 1, "dataChange": True, "extendedFileMetadata": True,
            "partitionValues": {}, "size": a["add"]["size"]}  # fmt: skip
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def with_dv(a: dict[str, Any], dv: dict[str, Any]) -> dict[str, Any]:
    return {"add": {**a["add"], "deletionVector": dv}}


def test_z85_and_the_protocol_inline_example() -> None:
    # PROTOCOL.md "JSON Example 3 — Inline": rows 3, 4, 7, 11, 18, 29
    d = dvmod.Descriptor.from_json(
        {
            "storageType": "i",
            "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert dvmod.load(d, lambda p: b"").tolist() == [3, 4, 7, 11, 18, 29]
    # "JSON Example 1": the uuid and random prefix give the file's path
    u = dvmod.Descriptor.from_json(
        {
            "storageType": "u",
            "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
            "offset": 4,
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert u.relative_path() == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert u.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"
    data = bytes(range(256)) * 4
    assert dvmod.z85_decode(dvmod.z85_encode(data)) == data


def test_deletion_vectors_inline_relative_and_absolute(tmp_path: Path) -> None:
    sa = parquet_file(tmp_path, "a.parquet", rows(0, 10))
    sb = parquet_file(tmp_path, "b.parquet", rows(100, 5))
    a, b = add("a.parquet", sa, 10), add("b.parquet", sb, 5)
    write_commit(tmp_path, 0, [DV_PROTOCOL, metadata(FIELDS, None, **{"delta.enableDeletionVectors": "true"}), a, b])
    dv1 = inline([0, 9])
    write_commit(tmp_path, 1, [remove(a), with_dv(a, dv1)])
    dv2, dv_b = on_disk(tmp_path, [[0, 3, 9], [4]], prefix="ab")
    write_commit(tmp_path, 2, [remove(a, dv1), with_dv(a, dv2)])
    # the same DV file named by an absolute path ('p'), as the add path format
    absolute = dict(
        dv_b, storageType="p", pathOrInlineDv=(tmp_path / dvmod.Descriptor.from_json(dv_b).relative_path()).as_uri()
    )
    write_commit(tmp_path, 3, [remove(b), with_dv(b, absolute)])
    t = DeltaTable.open(tmp_path)
    want = {
        0: list(range(10)) + list(range(100, 105)),
        1: list(range(1, 9)) + list(range(100, 105)),
        2: [1, 2, 4, 5, 6, 7, 8, *range(100, 105)],
        3: [1, 2, 4, 5, 6, 7, 8, 100, 101, 102, 103],
    }
    for v, xs in want.items():
        assert sorted(t.to_arrow(v).column("x").to_pylist()) == xs, v
        assert t.snapshot(v).num_records() == len(xs)
    assert_all_agree(tmp_path, range(4))


def test_deletion_vector_across_roaring_containers(tmp_path: Path) -> None:
    n = 140_000  # three 16-bit containers: array, bitmap and run encodings
    size = parquet_file(tmp_path, "big.parquet", pa.table({"x": pa.array(range(n), pa.int64()), "s": ["v"] * n}))
    big = add("big.parquet", size, n)
    write_commit(tmp_path, 0, [DV_PROTOCOL, metadata(FIELDS), big])
    deleted = [i for i in range(0, 65536, 3)] + list(range(70000, 120000)) + [139_999]
    (dv,) = on_disk(tmp_path, [deleted])
    write_commit(tmp_path, 1, [remove(big), with_dv(big, dv)])
    got = DeltaTable.open(tmp_path).to_arrow().column("x").to_pylist()
    assert sorted(got) == sorted(set(range(n)) - set(deleted))
    assert_all_agree(tmp_path, range(2))


@pytest.mark.parametrize(
    "damage, message",
    [("crc", "CRC-32"), ("cardinality", "cardinality"), ("size", "descriptor says"), ("row", "deletes row")],
)
def test_a_damaged_deletion_vector_is_corruption(tmp_path: Path, damage: str, message: str) -> None:
    size = parquet_file(tmp_path, "a.parquet", rows(0, 10))
    a = add("a.parquet", size, 10)
    write_commit(tmp_path, 0, [DV_PROTOCOL, metadata(FIELDS), a])
    (dv,) = on_disk(tmp_path, [[12] if damage == "row" else [1, 2]])
    path = tmp_path / dvmod.Descriptor.from_json(dv).relative_path()
    if damage == "crc":
        body = bytearray(path.read_bytes())
        body[-1] ^= 1
        path.write_bytes(bytes(body))
    elif damage == "cardinality":
        dv["cardinality"] = 3
    elif damage == "size":
        dv["sizeInBytes"] += 1
    write_commit(tmp_path, 1, [remove(a), with_dv(a, dv)])
    t = DeltaTable.open(tmp_path)
    assert t.to_arrow(0).num_rows == 10  # the version before the DV is untouched
    with pytest.raises(Corruption, match=message):
        t.to_arrow()


def test_deletion_vector_tables_are_read_but_not_written(tmp_path: Path) -> None:
    size = parquet_file(tmp_path, "a.parquet", rows(0, 10))
    a = add("a.parquet", size, 10)
    write_commit(tmp_path, 0, [DV_PROTOCOL, metadata(FIELDS), a])
    write_commit(tmp_path, 1, [remove(a), with_dv(a, inline([5]))])
    t = DeltaTable.open(tmp_path)
    assert t.to_arrow().num_rows == 9
    with pytest.raises(Unsupported, match=r"writing refused.*deletionVectors"):
        t.append(rows(50, 1))
    assert not (tmp_path / "_delta_log" / f"{2:020d}.json").exists()


def test_deletion_vectors_on_a_column_mapped_partitioned_table(tmp_path: Path) -> None:
    """DVs, column mapping (name) and a partition keyed by physical name together, as Databricks
    creates new tables; the physical file has physical column names."""
    physical = {"x": "col-7a1", "s": "col-7a2", "p": "col-7a3"}
    fields = [
        field(n, t, **{"delta.columnMapping.id": i + 1, "delta.columnMapping.physicalName": physical[n]})
        for i, (n, t) in enumerate([("x", "long"), ("s", "string"), ("p", "string")])
    ]
    data = rows(0, 6).rename_columns([physical["x"], physical["s"]])
    size = parquet_file(tmp_path, "ab/f.parquet", data)
    features = ["deletionVectors", "columnMapping"]
    conf = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "3"}
    a = add("ab/f.parquet", size, 6, {physical["p"]: "west"})
    write_commit(tmp_path, 0, [protocol(features, features), metadata(fields, ["p"], **conf), a])
    write_commit(tmp_path, 1, [remove(a), with_dv(a, inline([0, 5]))])
    t = DeltaTable.open(tmp_path)
    got = t.to_arrow()
    assert sorted(got.column("x").to_pylist()) == [1, 2, 3, 4]
    assert set(got.column("p").to_pylist()) == {"west"}
    for v in range(2):
        assert canon(t.to_arrow(v)) == canon(deltalake_read(tmp_path, v))
        # DuckDB 1.5.5 returns null for a column-mapped partition column; the rest agrees
        assert canon(t.to_arrow(v).drop_columns(["p"])) == canon(pa.table(duckdb_read(tmp_path, v)).drop_columns(["p"]))


def test_a_dv_update_reads_the_same_whichever_order_its_commit_lists_add_and_remove(tmp_path: Path) -> None:
    """A commit's actions are unordered: `add(path, new DV)` before `remove(path, old DV)` (as a
    writer may emit a DELETE) must not drop the file (it did: files were keyed by path alone)."""
    sa = parquet_file(tmp_path, "a.parquet", rows(0, 10))
    a = add("a.parquet", sa, 10)
    write_commit(tmp_path, 0, [DV_PROTOCOL, metadata(FIELDS, None, **{"delta.enableDeletionVectors": "true"}), a])
    dv1 = inline([0])
    write_commit(tmp_path, 1, [with_dv(a, dv1), remove(a)])  # the add first
    dv2 = inline([0, 5])
    write_commit(tmp_path, 2, [with_dv(a, dv2), remove(a, dv1)])
    t = DeltaTable.open(tmp_path)
    assert sorted(t.to_arrow(1).column("x").to_pylist()) == list(range(1, 10))
    assert sorted(t.to_arrow().column("x").to_pylist()) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert t.snapshot().num_records() == 8
    assert_all_agree(tmp_path, range(3))
