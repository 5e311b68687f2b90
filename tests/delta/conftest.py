"""Shared pieces for the Delta tests: a manual clock, deterministic ids, and the two outside readers."""

from __future__ import annotations

import glob
import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable, LocalStorage

T0 = 1_790_000_000_000  # 2026-09-21, a fixed "now" for golden files and ICT arithmetic

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("key", pa.string()),
        ("value", pa.binary()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("p", pa.string()),
    ]
)


def rows(start: int, n: int, part: str = "a") -> pa.Table:
    seqs = list(range(start, start + n))
    return pa.table(
        {
            "seq": seqs,
            "key": [f"k{s}" for s in seqs],
            "value": [s.to_bytes(4, "big") for s in seqs],
            "ts": pa.array([T0 + s for s in seqs], pa.timestamp("ms", tz="UTC")),
            "p": [part] * n,
        }
    )


def counter_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: str(uuid.UUID(int=next(counter)))


class CountingStorage(LocalStorage):
    """The real local storage, counting which files are read (for O(log n) claims)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return super().read(path)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def new_table(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., DeltaTable]]:
    def make(name: str = "t", schema: pa.Schema = SCHEMA, **kw: Any) -> DeltaTable:
        kw.setdefault("clock", clock)
        kw.setdefault("new_id", counter_ids())
        return DeltaTable.create(tmp_path / name, schema, **kw)

    yield make


def sorted_rows(table: Any, *columns: str) -> list[tuple[Any, ...]]:
    t = pa.table(table)
    cols = [t.column(c).to_pylist() for c in columns]
    return sorted(zip(*cols, strict=True))


def deltalake_read(path: str | os.PathLike[str], version: int | None = None) -> pa.Table:
    """Rows as delta-rs (its own Rust reader via DataFusion) sees them."""
    import deltalake

    dt = deltalake.DeltaTable(os.fspath(path), version=version)
    # QueryBuilder, not to_pyarrow_table(): the latter's Arrow dataset threads abort the process at exit
    return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())


def deltalake_version(path: str | os.PathLike[str]) -> int:
    import deltalake

    return int(deltalake.DeltaTable(os.fspath(path)).version())


_duck: Any = None


def duckdb_read(path: str | os.PathLike[str], version: int | None = None) -> pa.Table:
    """Rows as DuckDB's delta extension (delta-kernel-rs) sees them, loaded offline from its wheel."""
    global _duck
    import duckdb
    import duckdb_extension_delta

    if _duck is None:
        (ext,) = glob.glob(
            os.path.join(os.path.dirname(duckdb_extension_delta.__file__), "extensions", "*", "delta.duckdb_extension")
        )
        _duck = duckdb.connect()
        _duck.execute(f"LOAD '{ext}'")
    arg = "" if version is None else f", version => {int(version)}"
    return _duck.sql(f"select * from delta_scan('{os.fspath(path)}'{arg})").arrow().read_all()
