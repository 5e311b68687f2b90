"""Delta library benchmark, each figure next to delta-rs (`deltalake`) measured in the same run.

- bulk append: the same Arrow table (1,000,000 rows) into a new table, ours vs `write_deltalake`
- small commits: 1,000 one-row appends, ours vs `write_deltalake(mode="append")`
- version_at on a 10,000-commit table (checkpoint every 100 commits, as delta-rs does) vs
  `DeltaTable.load_as_version(datetime)`
- snapshot load of that table with and without a checkpoint, vs `DeltaTable(path)`

Ours writes durably (fsync of data files and commits); delta-rs does not fsync.

    python tools/bench/bench_delta.py              # the issue's sizes
    python tools/bench/bench_delta.py --quick      # 10x smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import deltalake
import pyarrow as pa

from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta.log import Listing, list_log, load_state


def data(n: int) -> pa.Table:
    seqs = pa.array(range(n), pa.int64())
    return pa.table(
        {
            "feed": pa.array(["a" * 64] * n),
            "seq": seqs,
            "key": pa.array([f"key-{i % 1000}" for i in range(n)]),
            "value": pa.array([i.to_bytes(8, "little") * 8 for i in range(n)], pa.binary()),
            "timestamp": pa.array(range(1_790_000_000_000, 1_790_000_000_000 + n), pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")
            ),
        }
    ).cast(
        pa.schema(
            [
                ("feed", pa.string()),
                ("seq", pa.int64()),
                ("key", pa.string()),
                ("value", pa.binary()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
            ]
        )
    )


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def line(what: str, ours: str, ref: str, ratio: float, better: str) -> None:
    print(f"{what:<44} ours {ours:>14}   delta-rs {ref:>14}   ratio {ratio:6.2f}x ({better})")


def _ours_bulk(path: Path, table: pa.Table) -> None:
    DeltaTable.create(path, table.schema).append(table)


def bulk(root: Path, rows: int, repeats: int = 3) -> None:
    table = data(rows)
    ours_runs, ref_runs = [], []
    for i in range(repeats):  # interleaved, median: the machine's load hits both alike
        ours_runs.append(timed(partial(_ours_bulk, root / f"bulk-ours-{i}", table)))
        ref_runs.append(timed(partial(deltalake.write_deltalake, str(root / f"bulk-dl-{i}"), table)))
    ours, ref = statistics.median(ours_runs), statistics.median(ref_runs)
    line(f"bulk append {rows:,} rows", f"{rows / ours:,.0f} rows/s", f"{rows / ref:,.0f} rows/s",
         ref / ours, "ours/ref")  # fmt: skip


def small_commits(root: Path, commits: int) -> None:
    one = data(1)
    t = DeltaTable.create(root / "small-ours", one.schema)
    ours = timed(lambda: [t.append(one) for _ in range(commits)])
    deltalake.write_deltalake(str(root / "small-dl"), one)
    dl = str(root / "small-dl")
    ref = timed(lambda: [deltalake.write_deltalake(dl, one, mode="append") for _ in range(commits)])
    line(f"{commits:,} one-row commits", f"{commits / ours:,.0f} commits/s", f"{commits / ref:,.0f} commits/s",
         ref / ours, "ours/ref")  # fmt: skip


def many_commits(root: Path, commits: int) -> tuple[Path, list[int]]:
    """A table of `commits` one-row commits, a checkpoint every 100; returns the ICT of each version."""
    path = root / "many"
    one = data(1)
    t = DeltaTable.create(LocalStorage(path, fsync=False), one.schema)
    for v in range(1, commits + 1):
        t.append(one)
        if v % 100 == 0:
            t.checkpoint()
    return path, [e.timestamp for e in reversed(t.history())]


def version_at(path: Path, times: list[int], probes: int) -> None:
    t = DeltaTable.open(path)
    rng = random.Random(7)
    targets = [rng.randrange(times[0], times[-1]) for _ in range(probes)]
    ours = statistics.median(timed(lambda ts=ts: t.version_at(ts)) for ts in targets)  # type: ignore[misc]
    ref_targets = targets[: max(1, probes // 10)]

    def dl_load(ts: int) -> None:
        d = deltalake.DeltaTable(str(path))
        d.load_as_version(dt.datetime.fromtimestamp(ts / 1000, dt.UTC))

    ref = statistics.median(timed(lambda ts=ts: dl_load(ts)) for ts in ref_targets)  # type: ignore[misc]
    # a fresh handle per call, as the delta-rs side does: includes loading the latest snapshot
    cold = statistics.median(timed(lambda ts=ts: DeltaTable.open(path).version_at(ts)) for ts in ref_targets)  # type: ignore[misc]
    n = len(times) - 1
    line(f"version_at on {n:,} commits (open handle)", f"{ours * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / ours,
         "ref/ours")  # fmt: skip
    line(f"version_at on {n:,} commits (fresh handle)", f"{cold * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / cold,
         "ref/ours")  # fmt: skip


def snapshot_load(path: Path) -> None:
    storage = LocalStorage(path)
    full = list_log(storage)
    bare = Listing(full.commits, {})
    with_cp = statistics.median(timed(lambda: load_state(storage, list_log(storage))) for _ in range(5))
    without = timed(lambda: load_state(storage, bare))
    ref = statistics.median(timed(lambda: deltalake.DeltaTable(str(path))) for _ in range(5))
    n = full.latest
    line(f"snapshot load, {n:,} commits, checkpoint", f"{with_cp * 1000:.1f} ms", f"{ref * 1000:.1f} ms",
         ref / with_cp, "ref/ours")  # fmt: skip
    line(f"snapshot load, {n:,} commits, no checkpoint", f"{without * 1000:.1f} ms", f"{ref * 1000:.1f} ms",
         ref / without, "ref/ours")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10x smaller sizes")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    root = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        print(f"deltalake {deltalake.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} cpus")
        bulk(root, 1_000_000 // scale)
        small_commits(root, 1_000 // scale)
        path, times = many_commits(root, 10_000 // scale)
        version_at(path, times, probes=50)
        snapshot_load(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
