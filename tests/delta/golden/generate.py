"""Regenerates the Delta golden commits beside this script, named by the writer that wrote them.

    python tests/delta/golden/generate.py              # feedlog-<feedlog version>/
    python tests/delta/golden/generate.py --deltalake  # also deltalake-<deltalake version>/

`feedlog-<version>/<table>/_delta_log/*.json` are the commit files feedlog's own writer makes
for the histories in `FEEDLOG_TABLES`, deterministically: a `ManualClock`, counted ids and an
in-memory storage whose file times come from the same clock. Data files are described by
hand-made `add` actions (fixed sizes and stats), so the commits do not depend on the Parquet
writer. tests/delta/test_actions.py runs the same histories and compares the result with the
golden of the running version byte for byte; a change to what feedlog writes shows up as a
diff here, and a new version needs its own golden (run this script). Goldens of older
versions stay: every one of them must still read.

`deltalake-<version>/<table>/` is a table delta-rs wrote (commits, checkpoint and data files)
for `DELTALAKE_STEPS`; it is not deterministic (delta-rs names files by uuid and stamps wall
time), so it is regenerated only on request, for a new deltalake version. The tests read it
with feedlog and compare with the rows the steps wrote.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

HERE = Path(__file__).resolve().parent
T0 = 1_790_000_000_000  # 2026-09-21: a fixed "now"

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("key", pa.string()),
        ("value", pa.binary()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("p", pa.string()),
    ]
)


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: str(uuid.UUID(int=next(counter)))


def _stats(lo: int, hi: int) -> str:
    n = hi - lo + 1
    return f'{{"numRecords":{n},"minValues":{{"seq":{lo}}},"maxValues":{{"seq":{hi}}},"nullCount":{{"seq":0}}}}'


def _partitioned(table: Any, clock: Any) -> None:
    """Create (partitioned, ICT on), an exactly-once append, an overwrite, a property change."""
    from feedlog.delta.actions import Add

    clock.advance(1000)
    tx = table.transaction()
    tx.operation_parameters = {"mode": "Append", "partitionBy": ["p"]}
    tx.set_txn("ingest-1", 7)
    first = Add("p=a/part-00000-x-c000.zstd.parquet", {"p": "a"}, 1234, T0 + 500, True, _stats(1, 2))
    tx.add_files([first])
    tx.commit()

    clock.advance(1000)
    tx = table.transaction()
    tx.operation_parameters = {"mode": "Overwrite", "partitionBy": ["p"]}
    tx.reads_whole_table = True
    tx.remove_files([first])
    tx.add_files([Add("p=b/part-00000-y-c000.zstd.parquet", {"p": "b"}, 999, T0 + 1500, True, _stats(3, 5))])
    tx.commit()

    clock.advance(1000)
    table.set_properties({"delta.logRetentionDuration": "interval 30 days"})


def _ict_enabled_late(table: Any, clock: Any) -> None:
    """Created without ICT, one append, ICT turned on with the writer's clock behind the last commit's
    file time (ICT writer requirement 5 lifts it above), one append with ICT."""
    from feedlog.delta.actions import Add

    clock.advance(1000)
    tx = table.transaction()
    tx.operation_parameters = {"mode": "Append", "partitionBy": []}
    tx.add_files([Add("part-00000-a-c000.zstd.parquet", {}, 100, T0 + 900, True, _stats(0, 0))])
    tx.commit()

    clock.set(T0 + 500)  # behind the file time of commit 1
    table.enable_ict()

    clock.advance(1000)
    tx = table.transaction()
    tx.operation_parameters = {"mode": "Append", "partitionBy": []}
    tx.add_files([Add("part-00000-b-c000.zstd.parquet", {}, 100, T0 + 1400, True, _stats(1, 1))])
    tx.commit()


#: table name -> (DeltaTable.create keywords, the history written after creation)
FEEDLOG_TABLES: dict[str, tuple[dict[str, Any], Callable[[Any, Any], None]]] = {
    "partitioned": ({"partition_by": ["p"]}, _partitioned),
    "ict-enabled-late": ({"in_commit_timestamps": False}, _ict_enabled_late),
}


def feedlog_golden() -> dict[str, dict[str, bytes]]:
    """table name -> {path under the table root: bytes} of every commit feedlog writes for FEEDLOG_TABLES."""
    from feedlog.clock import ManualClock
    from feedlog.delta import DeltaTable
    from feedlog.delta.storage import MemoryStorage

    out = {}
    for name, (create, history) in FEEDLOG_TABLES.items():
        clock = ManualClock(T0)
        storage = MemoryStorage(name, clock=clock)
        table = DeltaTable.create(storage, SCHEMA, clock=clock, new_id=_ids(), **create)
        history(table, clock)
        out[name] = {f.path: storage.read(f.path) for f in storage.list("_delta_log") if f.path.endswith(".json")}
    return out


def feedlog_dir(version: str | None = None) -> Path:
    if version is None:
        from feedlog import __version__ as version
    return HERE / f"feedlog-{version}"


def write_feedlog() -> Path:
    target = feedlog_dir()
    shutil.rmtree(target, ignore_errors=True)
    for table, files in feedlog_golden().items():
        for rel, data in files.items():
            path = target / table / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return target


def delta_rs_rows(start: int, n: int, part: str) -> pa.Table:
    seqs = list(range(start, start + n))
    return pa.table(
        {
            "seq": seqs,
            "key": [f"k{s}" for s in seqs],
            "value": [s.to_bytes(4, "big") for s in seqs],
            "ts": pa.array([T0 * 1000 + s for s in seqs], pa.timestamp("us", tz="UTC")),
            "p": [part] * n,
        },
        schema=SCHEMA,
    )


#: what delta-rs writes, in order: (mode, first seq, rows, partition); "checkpoint" after a step
DELTALAKE_STEPS: list[tuple[str, int, int, str]] = [
    ("create", 0, 3, "a"),
    ("append", 3, 2, "b/c"),
    ("append", 5, 2, "a"),
    ("checkpoint", 0, 0, ""),
    ("overwrite", 100, 2, "d=e"),
    ("append", 102, 1, "a"),
]


def deltalake_expected() -> dict[int, list[tuple[int, str, bytes, str]]]:
    """version -> its rows as sorted (seq, key, value, p), from DELTALAKE_STEPS."""
    out: dict[int, list[tuple[int, str, bytes, str]]] = {}
    current: list[tuple[int, str, bytes, str]] = []
    version = -1
    for mode, start, n, part in DELTALAKE_STEPS:
        if mode == "checkpoint":
            continue
        version += 1
        batch = [(s, f"k{s}", s.to_bytes(4, "big"), part) for s in range(start, start + n)]
        current = sorted((current if mode != "overwrite" else []) + batch)
        out[version] = current
    return out


def deltalake_dir() -> Path:
    import deltalake

    return HERE / f"deltalake-{deltalake.__version__}"


def write_deltalake() -> Path:
    import deltalake

    target = deltalake_dir()
    shutil.rmtree(target, ignore_errors=True)
    path = target / "partitioned"
    for mode, start, n, part in DELTALAKE_STEPS:
        if mode == "checkpoint":
            deltalake.DeltaTable(path).create_checkpoint()
        elif mode == "create":
            deltalake.write_deltalake(path, delta_rs_rows(start, n, part), partition_by=["p"])
        elif mode == "overwrite":
            deltalake.write_deltalake(path, delta_rs_rows(start, n, part), mode="overwrite")
        else:
            deltalake.write_deltalake(path, delta_rs_rows(start, n, part), mode="append")
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--deltalake", action="store_true", help="also write a golden table with delta-rs")
    args = parser.parse_args(argv)
    print(f"wrote {write_feedlog().relative_to(HERE.parents[2])}")
    if args.deltalake:
        print(f"wrote {write_deltalake().relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[2]))  # run from a checkout: import the feedlog beside it
    sys.exit(main(sys.argv[1:]))
