"""Delta library benchmark, each figure next to delta-rs (`deltalake`) measured in the same run.

- bulk append: the same Arrow table (1,000,000 rows) into a new table, ours vs `write_deltalake`
- small commits: 1,000 one-row appends, ours vs `write_deltalake(mode="append")`
- version_at on a 10,000-commit table (checkpoint every 100 commits, as delta-rs does) vs
  `DeltaTable.load_as_version(datetime)`
- snapshot load of that table (`DeltaTable(path).snapshot()`) with its checkpoint and, on a copy
  without checkpoints, replaying all commits, vs `deltalake.DeltaTable(path)` on the checkpointed table

Ours writes durably (fsync of data files and commits); delta-rs does not fsync.

    python tools/bench/bench_delta.py              # the issue's sizes
    python tools/bench/bench_delta.py --quick      # 10x smaller, for a smoke run
    python tools/bench/bench_delta.py --only snapshot,version_at --table /tmp/many   # those parts
        alone, on a 10,000-commit table built once in /tmp/many and reused by later runs
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

try:  # the process's cache of latest states: emptied before each cold load (older code has none)
    from feedlog.delta.log import forget_states
except ImportError:

    def forget_states() -> None:
        pass


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


def many_commits(root: Path, commits: int, path: Path | None = None) -> tuple[Path, list[int]]:
    """A table of `commits` one-row commits, a checkpoint every 100; returns the ICT of each version.
    An existing table at `path` of that many commits is reused (building it takes minutes)."""
    if path is not None and (path / "_delta_log").exists():
        t = DeltaTable.open(path)
        if t.version() == commits:
            return path, [e.timestamp for e in reversed(t.history())]
        shutil.rmtree(path)
    path = path or root / "many"
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
    # a fresh handle per call, as the delta-rs side does (and no cached state: _cold); ours is quick,
    # so more targets: a median of many is steadier on a loaded machine
    cold = statistics.median(timed(_cold(lambda ts=ts: DeltaTable.open(path).version_at(ts))) for ts in targets[:25])  # type: ignore[misc]
    n = len(times) - 1
    line(f"version_at on {n:,} commits (open handle)", f"{ours * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / ours,
         "ref/ours")  # fmt: skip
    line(f"version_at on {n:,} commits (fresh handle)", f"{cold * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / cold,
         "ref/ours")  # fmt: skip


def _without_checkpoints(path: Path) -> Path:
    """A copy of the table at `path` with the same commits and no checkpoint (nor `_last_checkpoint`)."""
    bare = path.with_name(path.name + "-nocp")
    if not bare.exists():
        shutil.copytree(path, bare, ignore=shutil.ignore_patterns("*.checkpoint.*", "_last_checkpoint", "_sidecars"))
    return bare


def _cold(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        forget_states()
        return fn()

    return run


def read_every_commit(path: Path) -> None:
    """The floor of a replay without a checkpoint: list `_delta_log` and open, read and close every
    commit file in it, nothing decoded (the system calls alone: ~3.5-4.5 us a file here, and a C
    loop doing the same took 34-48 ms for 10,000 files on this machine, ~90% of Python's figure)."""
    log = path / "_delta_log"
    dfd = os.open(log, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in sorted(os.listdir(log)):
            if name.endswith(".json"):
                fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
                os.read(fd, 1 << 16)
                os.close(fd)
    finally:
        os.close(dfd)


def snapshot_load(path: Path, repeats: int = 11) -> None:
    """The latest snapshot as a user gets it (`DeltaTable(path).snapshot()`: list, read, replay) vs
    `deltalake.DeltaTable(path)`, which loads its snapshot (files included) when it is made. Cold:
    the process's cache of latest states emptied first (delta-rs keeps none across handles); warm:
    the table read before in this process, so only the log's tail is listed and checked."""
    bare = _without_checkpoints(path)
    ours_cp, ours_bare, ref_runs, ref_bare, files_runs, ref_files, warm, opened, floor = ([] for _ in range(9))
    for _ in range(repeats):  # interleaved, median: the machine's load hits both alike
        ref_runs.append(timed(lambda: deltalake.DeltaTable(str(path))))
        ours_cp.append(timed(_cold(lambda: DeltaTable(path).snapshot())))
        ref_bare.append(timed(lambda: deltalake.DeltaTable(str(bare))))
        ours_bare.append(timed(_cold(lambda: DeltaTable(bare).snapshot())))
        warm.append(timed(lambda: DeltaTable(bare).snapshot()))  # the cold load above primed it
        opened.append(timed(_cold(lambda: DeltaTable.open(bare).snapshot())))  # open() reads the head first
        # the same plus every live file as an object (ours builds them on demand)
        files_runs.append(timed(_cold(lambda: DeltaTable(path).snapshot().files())))
        ref_files.append(timed(lambda: deltalake.DeltaTable(str(path)).get_add_actions()))
        floor.append(timed(partial(read_every_commit, bare)))
    ref, with_cp, without = statistics.median(ref_runs), statistics.median(ours_cp), statistics.median(ours_bare)
    n = DeltaTable(path).version()
    line(f"snapshot load, {n:,} commits, checkpoint", f"{with_cp * 1000:.1f} ms", f"{ref * 1000:.1f} ms",
         ref / with_cp, "ref/ours")  # fmt: skip
    line(f"snapshot load, {n:,} commits, no checkpoint", f"{without * 1000:.1f} ms", f"{ref * 1000:.1f} ms",
         ref / without, "ref/ours")  # fmt: skip
    rb = statistics.median(ref_bare)
    line("  (the same, delta-rs also without checkpoint)", f"{without * 1000:.1f} ms", f"{rb * 1000:.1f} ms",
         rb / without, "ref/ours")  # fmt: skip
    fl = statistics.median(floor)
    line("  (floor: list + open/read/close each commit)", f"{fl * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / fl,
         "ref/floor")  # fmt: skip
    o = statistics.median(opened)
    line("  (no checkpoint, DeltaTable.open(path).snapshot())", f"{o * 1000:.1f} ms", f"{ref * 1000:.1f} ms",
         ref / o, "ref/ours")  # fmt: skip
    w = statistics.median(warm)
    line("  (no checkpoint, warm: read before in-process)", f"{w * 1000:.1f} ms", f"{ref * 1000:.1f} ms", ref / w,
         "ref/ours")  # fmt: skip
    fr, ff = statistics.median(ref_files), statistics.median(files_runs)
    line("  (checkpoint, + every file: files()/get_add_actions)", f"{ff * 1000:.1f} ms", f"{fr * 1000:.1f} ms",
         fr / ff, "ref/ours")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10x smaller sizes")
    parts = ("bulk", "small", "version_at", "snapshot")
    ap.add_argument("--only", default=",".join(parts), help=f"comma-separated parts to run, of {','.join(parts)}")
    ap.add_argument("--table", type=Path, help="build the many-commit table here and keep it (reused if present)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(parts):
        ap.error(f"unknown part(s) {sorted(only - set(parts))}; choose among {','.join(parts)}")
    scale = 10 if args.quick else 1
    root = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        print(f"deltalake {deltalake.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} cpus")
        if "bulk" in only:
            bulk(root, 1_000_000 // scale)
        if "small" in only:
            small_commits(root, 1_000 // scale)
        if only & {"version_at", "snapshot"}:
            path, times = many_commits(root, 10_000 // scale, args.table)
            if "version_at" in only:
                version_at(path, times, probes=50)
            if "snapshot" in only:
                snapshot_load(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
