"""VACUUM of a table with N data files, half of them removed long ago: feedlog vs delta-rs.

    python tools/bench/bench_vacuum.py [--files 100000] [--repeat 3] [--dir DIR]

The table (protocol 1/2, no in-commit timestamps, so that delta-rs may write it) is built
quickly: one tiny Parquet file copied N times into 10 partition directories, commit 1 adds them
all, commit 2 removes every other one with a deletion timestamp 30 days ago, and a checkpoint at
2 (which drops the expired tombstones, as real tables' checkpoints do). Every data file's
modification time is set 30 days back. An identical copy goes to delta-rs. feedlog runs
`DeltaTable.vacuum()` (the table's 7-day retention), delta-rs `vacuum(retention_hours=168,
full=True, dry_run=False, enforce_retention_duration=False)`; both must delete the same N/2
files. Each of `--repeat` rounds vacuums a fresh copy with each (the machine may be busy: paired
runs, medians reported). Prints both wall times and the ratio (delta-rs time / feedlog time: >= 1.0
means feedlog is at least as fast), and feedlog's RSS in a child process: with the latest state
loaded, and its peak during the vacuum (Linux: the peak is reset after the load).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

DAY_MS = 86_400_000


def build(root: str, n: int) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), buf)
    data = buf.getvalue()
    now = int(time.time() * 1000)
    old = now - 30 * DAY_MS
    os.makedirs(os.path.join(root, "_delta_log"))
    fields = [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "p", "type": "string", "nullable": True, "metadata": {}},
    ]
    schema = {"type": "struct", "fields": fields}
    meta = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": ["p"],
        "configuration": {},
        "createdTime": old,
    }
    commit0: list[dict[str, object]] = [
        {"commitInfo": {"timestamp": old, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": meta},
    ]
    adds: list[dict[str, object]] = []
    removes: list[dict[str, object]] = []
    for i in range(n):
        part = f"p={i % 10}"
        name = f"part-{i:06d}-{uuid.UUID(int=i)}.parquet"
        rel = f"{part}/{name}"
        os.makedirs(os.path.join(root, part), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        os.utime(os.path.join(root, rel), ns=(old * 1_000_000, old * 1_000_000))
        add = {"path": rel, "partitionValues": {"p": str(i % 10)}, "size": len(data)}
        adds.append({"add": {**add, "modificationTime": old, "dataChange": True}})
        if i % 2:
            removes.append({"remove": {**add, "deletionTimestamp": old + 1000, "dataChange": True}})
    commit1: list[dict[str, object]] = [{"commitInfo": {"timestamp": old + 500, "operation": "WRITE"}}, *adds]
    commit2: list[dict[str, object]] = [{"commitInfo": {"timestamp": old + 1000, "operation": "DELETE"}}, *removes]
    for v, actions in enumerate((commit0, commit1, commit2)):
        path = os.path.join(root, "_delta_log", f"{v:020d}.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(a) for a in actions) + "\n")
        when = old + 500 * v
        os.utime(path, ns=(when * 1_000_000, when * 1_000_000))
    from feedlog.delta import DeltaTable

    DeltaTable.open(root).checkpoint()


_RSS_CHILD = """
import sys, time
from feedlog.delta import DeltaTable

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

t = DeltaTable.open(sys.argv[1])
t.snapshot()  # the latest state, loaded first: its decoding peak is not the vacuum's
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak RSS (VmHWM) to the RSS now (Linux)
before = status("VmRSS")
t0 = time.perf_counter()
r = t.vacuum()
took = time.perf_counter() - t0
print(len(r.files), before, status("VmHWM"), took)
"""


def feedlog_rss(path: str) -> tuple[int, int, int, float]:
    """Vacuum in a child process (Linux): (files deleted, RSS KiB with the latest state loaded, peak
    RSS KiB during the vacuum, its seconds)."""
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, path], check=True, capture_output=True, text=True)
    n, loaded, peak, took = out.stdout.split()
    return int(n), int(loaded), int(peak), float(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="paired runs on fresh copies; medians are reported")
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory)")
    args = ap.parse_args()
    import deltalake

    from feedlog.delta import DeltaTable

    base = tempfile.mkdtemp(prefix="bench-vacuum-", dir=args.dir)
    try:
        pristine = os.path.join(base, "pristine")
        ours_path, theirs_path = os.path.join(base, "feedlog"), os.path.join(base, "delta-rs")
        t0 = time.perf_counter()
        build(pristine, args.files)
        print(f"built {args.files} files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        want = args.files // 2
        ours_s: list[float] = []
        theirs_s: list[float] = []
        for _ in range(args.repeat):
            for p in (ours_path, theirs_path):
                shutil.rmtree(p, ignore_errors=True)
                shutil.copytree(pristine, p)  # copy2: modification times kept
            os.sync()  # the copies' writeback done before either is timed, not during the first

            t0 = time.perf_counter()
            ours = DeltaTable.open(ours_path).vacuum()
            ours_s.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            theirs = deltalake.DeltaTable(theirs_path).vacuum(
                retention_hours=168, dry_run=False, full=True, enforce_retention_duration=False
            )
            theirs_s.append(time.perf_counter() - t0)
            assert len(theirs) == want, (len(theirs), want)
            assert sorted(ours.files) == sorted(theirs), "feedlog and delta-rs deleted different files"
        shutil.rmtree(ours_path)
        shutil.copytree(pristine, ours_path)
        os.sync()
        n, loaded, peak, rss_s = feedlog_rss(ours_path)
        assert n == want, (n, want)
        o, t = statistics.median(ours_s), statistics.median(theirs_s)
        print(f"files                {args.files} ({want} unreferenced, deleted by each)")
        print(f"feedlog vacuum       {o:.2f} s median of {' '.join(f'{x:.2f}' for x in ours_s)}")
        print(f"delta-rs vacuum      {t:.2f} s median of {' '.join(f'{x:.2f}' for x in theirs_s)} (full=True)")
        print(f"ratio                {t / o:.2f}x (delta-rs time / feedlog time; >= 1.0: feedlog as fast)")
        print(
            f"feedlog RSS          {loaded / 1024:.0f} MiB with the latest state loaded, peak {peak / 1024:.0f} MiB "
            f"during the vacuum (+{(peak - loaded) / 1024:.0f} MiB; {rss_s:.2f} s)"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
