"""OPTIMIZE of a table of N small files: feedlog vs delta-rs's `optimize.compact()`.

    python tools/bench/bench_optimize.py [--files 200] [--rows 200] [--repeat 3] [--dir DIR]

The table is written by delta-rs itself (`write_deltalake`, N appends of `--rows` rows each: feed,
seq, value; one small file per append, as a stream makes them), so neither side reads a table
the other made for itself. Each of `--repeat` rounds compacts a fresh copy with each, with the
same target size (100 MiB, both defaults): feedlog `DeltaTable.optimize()` and delta-rs
`DeltaTable.optimize.compact(target_size=...)`; both must end with one live file holding every
row. Paired runs (the machine may be busy), medians reported: input files/s and MB/s for each,
and the ratio (delta-rs time / feedlog time: >= 1.0 means feedlog is at least as fast).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

TARGET = 100 * 1024 * 1024


def build(root: str, files: int, rows: int) -> int:
    """N appends by delta-rs; returns the table's bytes of data."""
    import deltalake

    for i in range(files):
        seqs = list(range(i * rows, (i + 1) * rows))
        data = pa.table(
            {
                "feed": ["f" * 64] * rows,
                "seq": pa.array(seqs, pa.int64()),
                "value": [f"value {s} " * 4 for s in seqs],
            }
        )
        deltalake.write_deltalake(root, data, mode="append")
    from feedlog.delta import DeltaTable

    return sum(a.size for a in DeltaTable.open(root).snapshot().files())


def run_feedlog(path: str) -> tuple[float, int, int]:
    from feedlog.delta import DeltaTable

    t0 = time.perf_counter()
    r = DeltaTable.open(path).optimize(TARGET)
    took = time.perf_counter() - t0
    return took, r.files_removed, r.files_after


def run_delta_rs(path: str) -> tuple[float, int, int]:
    import deltalake

    t0 = time.perf_counter()
    dt = deltalake.DeltaTable(path)
    m = dt.optimize.compact(target_size=TARGET)
    took = time.perf_counter() - t0
    return took, int(m["numFilesRemoved"]), len(deltalake.DeltaTable(path).file_uris())


def rows_of(path: str) -> int:
    from feedlog.delta import DeltaTable

    return int(DeltaTable.open(path).to_arrow().num_rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=200, help="small files (one append each)")
    ap.add_argument("--rows", type=int, default=200, help="rows per file")
    ap.add_argument("--repeat", type=int, default=3, help="paired runs on fresh copies; medians are reported")
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory)")
    args = ap.parse_args()
    import deltalake  # noqa: F401 (both libraries imported before anything is timed)

    import feedlog.delta.optimize  # noqa: F401

    base = args.dir or tempfile.mkdtemp(prefix="bench-optimize-")
    source = os.path.join(base, "source")
    shutil.rmtree(source, ignore_errors=True)
    t0 = time.perf_counter()
    size = build(source, args.files, args.rows)
    print(
        f"table: {args.files} files x {args.rows} rows, {size / 1e6:.1f} MB of Parquet, "
        f"written by delta-rs in {time.perf_counter() - t0:.1f} s"
    )
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(args.repeat):
        for name, run, out in (("feedlog", run_feedlog, ours), ("delta-rs", run_delta_rs, theirs)):
            copy = os.path.join(base, f"{name}-{i}")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(source, copy)
            took, removed, left = run(copy)
            if removed != args.files or left != 1 or rows_of(copy) != args.files * args.rows:
                raise SystemExit(f"{name}: removed {removed} files, {left} left: not a full compaction")
            out.append(took)
            shutil.rmtree(copy)
    f, d = statistics.median(ours), statistics.median(theirs)
    for name, s in (("feedlog ", f), ("delta-rs", d)):
        print(f"{name}  {s:6.3f} s  {args.files / s:8.0f} files/s  {size / 1e6 / s:7.1f} MB/s")
    print(f"ratio (delta-rs time / feedlog time): {d / f:.2f}  (medians of {args.repeat} paired runs; machine shared)")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
