"""Interop is the definition of done: delta-rs and DuckDB, which we did not write, read our tables."""

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.log import list_log
from feedlog.delta.maintenance import DAY_MS

from .conftest import SCHEMA, T0, deltalake_read, deltalake_version, duckdb_read, rows, sorted_rows

WIDE = pa.schema(
    [
        ("seq", pa.int64()),
        ("flag", pa.bool_()),
        ("small", pa.int32()),
        ("ratio", pa.float64()),
        ("name", pa.string()),
        ("blob", pa.binary()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("region", pa.string()),
    ]
)


def wide_rows(start: int, n: int, region: str) -> pa.Table:
    seqs = list(range(start, start + n))
    return pa.table(
        {
            "seq": seqs,
            "flag": [s % 2 == 0 for s in seqs],
            "small": [s * 3 if s % 5 else None for s in seqs],
            "ratio": [s / 7 for s in seqs],
            "name": [f"name {s} é" for s in seqs],
            "blob": [bytes([s % 256]) * 3 for s in seqs],
            "day": [dt.date(2026, 1, 1) + dt.timedelta(days=s) for s in seqs],
            "ts": pa.array([T0 * 1000 + s for s in seqs], pa.timestamp("us", tz="UTC")),
            "region": [region] * n,
        },
        schema=WIDE,
    )


COLUMNS = ("seq", "flag", "small", "ratio", "name", "blob", "day", "region")


def test_readers_agree_on_rows_versions_and_time_travel(tmp_path):
    clock = ManualClock(T0)
    path = tmp_path / "t"
    t = DeltaTable.create(path, WIDE, partition_by=["region"], clock=clock)
    expected: dict[int, list[tuple[Any, ...]]] = {0: []}
    data: list[tuple[Any, ...]] = []
    for v, (start, region) in enumerate([(0, "eu west"), (10, "us/east"), (20, "eu west"), (30, "a=b")], 1):
        clock.advance(DAY_MS)
        t.append(wide_rows(start, 10, region))
        data += sorted_rows(wide_rows(start, 10, region), *COLUMNS)
        expected[v] = sorted(data)
    t.checkpoint()
    clock.advance(DAY_MS)
    t.append(wide_rows(100, 5, "eu west"), mode="overwrite")
    expected[5] = sorted_rows(wide_rows(100, 5, "eu west"), *COLUMNS)
    clock.advance(DAY_MS)
    t.append(wide_rows(200, 3, "us/east"), txn=("job", 1))
    expected[6] = sorted(expected[5] + sorted_rows(wide_rows(200, 3, "us/east"), *COLUMNS))

    def check(versions):
        assert deltalake_version(path) == t.version() == max(versions)
        for v in versions:
            assert sorted_rows(t.to_arrow(v), *COLUMNS) == expected[v], v
            assert sorted_rows(deltalake_read(path, v), *COLUMNS) == expected[v], v
            assert sorted_rows(duckdb_read(path, v), *COLUMNS) == expected[v], v
        assert sorted_rows(duckdb_read(path), *COLUMNS) == expected[max(versions)]
        ts_dl = pa.table(deltalake_read(path)).column("ts").cast(pa.int64()).to_pylist()
        assert sorted(ts_dl) == sorted(t.to_arrow().column("ts").cast(pa.int64()).to_pylist())

    check(range(7))
    clock.advance(DAY_MS)
    assert t.cleanup(retain_ms=2 * DAY_MS + 1)  # cutoff commit 5 -> checkpoint 4 stays
    check(range(4, 7))
    t.checkpoint()
    clock.advance(10 * DAY_MS)
    t.cleanup(retain_ms=DAY_MS)
    check([6])


def test_ict_enabled_late_table_reads_everywhere(tmp_path):
    clock = ManualClock(T0)
    path = tmp_path / "t"
    t = DeltaTable.create(path, SCHEMA, in_commit_timestamps=False, clock=clock)
    t.append(rows(0, 2))
    t.enable_ict()
    t.append(rows(2, 2))
    t.checkpoint()
    assert deltalake_version(path) == 3
    for v, n in ((1, 2), (2, 2), (3, 4)):
        assert deltalake_read(path, v).num_rows == duckdb_read(path, v).num_rows == n


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 4)),
            st.tuples(st.just("overwrite"), st.integers(0, 3)),
            st.tuples(st.just("txn"), st.integers(0, 3)),
            st.tuples(st.just("checkpoint"), st.just(0)),
            st.tuples(st.just("cleanup"), st.integers(0, 6)),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_random_histories_replay_like_a_simple_model(ops):
    """Appends, overwrites, exactly-once batches, checkpoints and cleanups vs a list-of-rows model."""
    clock = ManualClock(T0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t"
        # a day passes per step: a retention longer than the history keeps every version readable
        keep = {"delta.deletedFileRetentionDuration": "interval 365 days"}
        t = DeltaTable.create(path, SCHEMA, clock=clock, properties=keep)
        states: dict[int, list[int]] = {0: []}
        current: list[int] = []
        txn_done = -1
        seq = 0
        for op, arg in ops:
            clock.advance(DAY_MS)
            if op in ("append", "overwrite", "txn"):
                n = arg if op != "txn" else 1
                batch = rows(seq, n)
                if op == "txn":
                    result = t.append(batch, txn=("app", arg))
                    if arg <= txn_done:
                        assert result.skipped
                        continue
                    txn_done = arg
                else:
                    result = t.append(batch, mode=op)
                current = list(range(seq, seq + n)) if op == "overwrite" else current + list(range(seq, seq + n))
                seq += n
                assert result.version == max(states) + 1
                states[result.version] = sorted(current)
            elif op == "checkpoint":
                t.checkpoint()
            else:
                t.cleanup(retain_ms=arg * DAY_MS)
        listing = list_log(t.storage)
        assert listing.latest == max(states)
        for v in range(listing.earliest, listing.latest + 1):
            assert sorted(t.to_arrow(v).column("seq").to_pylist()) == states[v]
        assert t.txn_version("app") == (None if txn_done < 0 else txn_done)
        assert sorted(deltalake_read(path).column("seq").to_pylist()) == states[max(states)]
