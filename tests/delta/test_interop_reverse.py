"""Interop the other way: delta-rs writes, feedlog reads (and DuckDB, which we did not write either, agrees).

test_interop.py checks that outside readers read feedlog's tables; here delta-rs (the
`deltalake` package) writes: creates, appends, overwrites, partitions with awkward values,
several column types, schema evolution, deletes (file rewrites), compaction, exactly-once
markers, checkpoints, and appends racing feedlog's own on one table. For every version,
feedlog's rows must be the rows delta-rs reads back.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable, fast_commit
from feedlog.delta.actions import decode_commit
from feedlog.errors import Conflict

from .conftest import SCHEMA, deltalake_read, deltalake_version, duckdb_read, rows, sorted_rows
from .test_interop import COLUMNS, WIDE, wide_rows

deltalake = pytest.importorskip("deltalake")

HAVE_DUCKDB = all(importlib.util.find_spec(m) is not None for m in ("duckdb", "duckdb_extension_delta"))


def ts_us(table: Any) -> list[int]:
    """The `ts` column as microseconds (readers differ in unit and zone spelling, not in instant)."""
    col = pa.table(table).column("ts")
    return sorted(col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist())


def assert_readers_agree(
    path: Path, columns: Sequence[str], versions: Iterable[int] | None = None, expected: dict[int, Any] | None = None
) -> None:
    """feedlog reads every version as delta-rs does (and DuckDB, when installed); `expected` if given."""
    ours = DeltaTable.open(path)
    latest = deltalake_version(path)
    assert ours.version() == latest
    for v in range(latest + 1) if versions is None else versions:
        mine = ours.to_arrow(v)
        theirs = deltalake_read(path, v)
        assert sorted_rows(mine, *columns) == sorted_rows(theirs, *columns), f"version {v}"
        if "ts" in mine.column_names:
            assert ts_us(mine) == ts_us(theirs), f"version {v}"
        if expected is not None and v in expected:
            assert sorted_rows(mine, *columns) == expected[v], f"version {v}"
        if HAVE_DUCKDB:
            assert sorted_rows(duckdb_read(path, v), *columns) == sorted_rows(mine, *columns), f"version {v}"
    assert_fast_path_takes(path)


def assert_fast_path_takes(path: Path) -> None:
    """Every commit file delta-rs wrote decodes through the msgspec fast path, exactly as the reference
    decoder reads it (a replay of a real log must not fall back to the slow path, nor differ)."""
    for f in sorted((path / "_delta_log").glob("*.json")):
        if len(f.name) != len("00000000000000000000.json"):
            continue  # a V2 checkpoint's or a compaction's JSON file: no commit
        data = f.read_bytes()
        for ict_only in (False, True):
            fast = fast_commit.decode(data, ict_only)
            assert fast is not None, f"{f.name} fell back to the reference decoder"
            assert fast == decode_commit(data, int(f.name[:20]), ict_only), f.name


def test_delta_rs_history_reads_in_feedlog(tmp_path: Path) -> None:
    """Create, appends across partitions, a partition overwrite, a full overwrite, a checkpoint, more appends."""
    path = tmp_path / "t"
    write = deltalake.write_deltalake
    expected: dict[int, list[tuple[Any, ...]]] = {}
    current: list[tuple[Any, ...]] = []

    def land(data: pa.Table, replace: bool = False) -> None:
        nonlocal current
        current = sorted((current if not replace else []) + sorted_rows(data, *COLUMNS))
        expected[deltalake_version(path)] = current

    write(path, wide_rows(0, 10, "eu west"), partition_by=["region"])
    land(wide_rows(0, 10, "eu west"))
    for start, region in [(10, "us/east"), (20, "a=b"), (30, "eu west"), (40, "ü %")]:
        write(path, wide_rows(start, 5, region), mode="append")
        land(wide_rows(start, 5, region))
    # replaceWhere: only the 'eu west' partition is replaced
    write(path, wide_rows(100, 3, "eu west"), mode="overwrite", predicate="region = 'eu west'")
    current = sorted([r for r in current if r[COLUMNS.index("region")] != "eu west"])
    land(wide_rows(100, 3, "eu west"))
    deltalake.DeltaTable(path).create_checkpoint()
    write(path, wide_rows(200, 4, "us/east"), mode="append")
    land(wide_rows(200, 4, "us/east"))
    write(path, wide_rows(300, 2, "new"), mode="overwrite")
    land(wide_rows(300, 2, "new"), replace=True)
    write(path, wide_rows(400, 2, "new"), mode="append")
    land(wide_rows(400, 2, "new"))

    assert sorted(expected) == list(range(9))
    assert any(p.name.endswith(".checkpoint.parquet") for p in (path / "_delta_log").iterdir())
    assert_readers_agree(path, COLUMNS, expected=expected)
    ours = DeltaTable.open(path)
    assert ours.snapshot().partition_columns == ("region",)
    assert ours.snapshot().schema == WIDE
    theirs = deltalake.DeltaTable(path).history()
    assert [h.version for h in ours.history()] == [h["version"] for h in theirs] == list(range(8, -1, -1))
    assert [h.operation for h in ours.history()] == [h["operation"] for h in theirs]


def test_delta_rs_deletes_compaction_evolution_and_txn_read_in_feedlog(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write = deltalake.write_deltalake
    write(path, rows(0, 3), partition_by=["p"])
    write(path, rows(3, 3), mode="append")
    write(path, rows(6, 6, "b"), mode="append")
    dl = deltalake.DeltaTable(path)
    dl.optimize.compact()  # rearranges files: removes + adds without dataChange
    dl.delete("seq % 3 = 0")  # rewrites files: removes + adds with dataChange
    # exactly-once markers from delta-rs, read by feedlog's txn lookup
    app = deltalake.CommitProperties(app_transactions=[deltalake.Transaction("ingest-job", 41)])
    write(path, rows(12, 2, "b"), mode="append", commit_properties=app)
    # a new nullable column: older files read it as nulls
    wider = rows(14, 2).append_column("extra", pa.array(["x", "y"]))
    write(path, wider, mode="append", schema_mode="merge")

    ours = DeltaTable.open(path)
    assert [h.operation for h in reversed(ours.history())] == [
        "WRITE",
        "WRITE",
        "WRITE",
        "OPTIMIZE",
        "DELETE",
        "WRITE",
        "WRITE",
    ]
    assert_readers_agree(path, ("seq", "key", "value", "p"))
    assert ours.txn_version("ingest-job") == 41
    assert ours.txn_version("nobody") is None
    final = ours.to_arrow()
    assert final.schema.names == [*SCHEMA.names, "extra"]
    assert sorted(final.column("seq").to_pylist()) == [s for s in range(16) if s % 3 or s >= 12]
    extra = dict(zip(final.column("seq").to_pylist(), final.column("extra").to_pylist(), strict=True))
    assert extra[14] == "x" and extra[15] == "y" and extra[1] is None
    assert sorted_rows(final, "seq", "extra") == sorted_rows(deltalake_read(path), "seq", "extra")


def test_delta_rs_updates_and_merges_read_in_feedlog(tmp_path: Path) -> None:
    """UPDATE and MERGE commits (file rewrites with delta-rs's operation metrics) and a z-order: every
    version reads in feedlog as in delta-rs."""
    path = tmp_path / "t"
    write = deltalake.write_deltalake
    write(path, rows(0, 6), partition_by=["p"])
    write(path, rows(6, 6, "b"), mode="append")
    deltalake.DeltaTable(path).update({"key": "'changed'"}, predicate="seq % 4 = 0")
    source = rows(10, 4, "b")
    (
        deltalake.DeltaTable(path)
        .merge(source, predicate="t.seq = s.seq", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    deltalake.DeltaTable(path).optimize.z_order(["seq"])
    ours = DeltaTable.open(path)
    assert [h.operation for h in reversed(ours.history())] == ["WRITE", "WRITE", "UPDATE", "MERGE", "OPTIMIZE"]
    assert_readers_agree(path, ("seq", "key", "value", "p"))
    final = sorted_rows(ours.to_arrow(), "seq", "key")
    assert [s for s, _ in final] == list(range(14))
    assert dict(final)[4] == "changed" and dict(final)[12] == "k12"


def test_feedlog_writes_on_a_delta_rs_table_and_both_read_it(tmp_path: Path) -> None:
    """delta-rs creates; feedlog appends, overwrites, checkpoints and turns ICT on; delta-rs reads every version."""
    path = tmp_path / "t"
    deltalake.write_deltalake(path, rows(0, 3).cast(SCHEMA), partition_by=["p"])
    ours = DeltaTable.open(path)
    ours.append(rows(3, 3, "b"))
    ours.append(rows(6, 2), mode="overwrite")
    ours.checkpoint()
    deltalake.write_deltalake(path, rows(8, 2, "c").cast(SCHEMA), mode="append")
    ict = ours.enable_ict()  # delta-rs can read ICT tables but not write them: it is the last writer here
    ours.append(rows(10, 1))
    assert ict.in_commit_timestamp is not None
    assert_readers_agree(
        path,
        ("seq", "key", "value", "p"),
        expected={
            1: [(s, f"k{s}", s.to_bytes(4, "big"), "a" if s < 3 else "b") for s in range(6)],
            2: [(s, f"k{s}", s.to_bytes(4, "big"), "a") for s in (6, 7)],
        },
    )
    assert [h["operation"] for h in deltalake.DeltaTable(path).history()][:3] == ["WRITE", "SET TBLPROPERTIES", "WRITE"]


def test_delta_rs_in_commit_timestamps_if_it_can_write_them(tmp_path: Path) -> None:
    path = tmp_path / "t"
    try:
        deltalake.write_deltalake(
            path, rows(0, 2).cast(SCHEMA), configuration={"delta.enableInCommitTimestamps": "true"}
        )
    except Exception as e:  # deltalake 1.6.6 cannot create ICT tables; a later one that writes ICTs is checked below
        pytest.skip(f"deltalake {deltalake.__version__} cannot write in-commit timestamps: {str(e)[:200]}")
    deltalake.write_deltalake(path, rows(2, 2).cast(SCHEMA), mode="append")
    ours = DeltaTable.open(path)
    assert ours.snapshot().ict_enabled
    icts = [h.in_commit_timestamp for h in reversed(ours.history())]
    assert None not in icts and icts == sorted(t or 0 for t in icts)
    assert_readers_agree(path, ("seq", "key", "value", "p"))


def test_delta_rs_and_feedlog_append_concurrently(tmp_path: Path) -> None:
    """Two threads, each alternating a delta-rs append and a feedlog append on one table: every append
    lands exactly once or fails as a clean conflict, and every version holds exactly one more batch."""
    path = tmp_path / "t"
    deltalake.DeltaTable.create(path, SCHEMA, partition_by=["p"])
    rounds = 6
    landed: list[int] = []  # batch ids; list.append is atomic
    refused: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def batch(i: int) -> pa.Table:
        return rows(1000 * i, 3, f"w{i % 2}").cast(SCHEMA)

    def writer(thread: int) -> None:
        try:
            ours = DeltaTable.open(path)
            barrier.wait(timeout=10)
            for k in range(rounds):
                i = 1 + thread * rounds + k
                by_deltalake = (k + thread) % 2 == 0
                try:
                    if by_deltalake:
                        deltalake.write_deltalake(path, batch(i), mode="append")
                    else:
                        ours.append(batch(i))
                    landed.append(i)
                except Conflict as e:  # feedlog: a clean refusal, nothing committed
                    refused.append((i, f"feedlog: {e}"))
                except deltalake.exceptions.CommitFailedError as e:  # delta-rs: likewise
                    refused.append((i, f"deltalake: {e}"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer did not finish"
    assert not errors, errors
    assert len(landed) + len(refused) == 2 * rounds
    assert len(landed) >= rounds, refused  # both sides retry non-conflicting appends: few refusals, if any

    latest = deltalake_version(path)
    assert latest == len(landed)  # one commit per landed append, none for a refused one
    ours = DeltaTable.open(path)
    seen: list[int] = []
    for v in range(1, latest + 1):
        before = set(ours.to_arrow(v - 1).column("seq").to_pylist())
        new = set(ours.to_arrow(v).column("seq").to_pylist()) - before
        (i,) = {s // 1000 for s in new}  # exactly one batch per version
        assert new == set(range(1000 * i, 1000 * i + 3)), f"version {v}"
        seen.append(i)
    assert sorted(seen) == sorted(landed)
    assert_readers_agree(path, ("seq", "key", "value", "p"))


def test_delta_rs_commit_info_quirks_are_tolerated(tmp_path: Path) -> None:
    """delta-rs writes operationParameters as JSON strings and extra commitInfo fields; history shows them."""
    path = tmp_path / "t"
    custom = deltalake.CommitProperties(custom_metadata={"origin": "delta-rs", "when": dt.date(2026, 1, 1).isoformat()})
    deltalake.write_deltalake(path, rows(0, 1).cast(SCHEMA), partition_by=["p"], commit_properties=custom)
    (entry,) = DeltaTable.open(path).history()
    assert entry.operation == "WRITE"
    assert entry.operation_parameters.get("partitionBy") == '["p"]'
    assert entry.commit_info.get("origin") == "delta-rs"
    assert entry.commit_info.get("engineInfo", "").startswith("delta-rs")
    assert os.path.isdir(path / "p=a")
