"""`feedlog expire` benchmark: TTL compaction of a feedlog table in process, against pyarrow alone.

The table holds one signed feed of ~100-byte entries, every other one with a 1 ms TTL, ingested as
`feedlog ingest` lands it (one data file per 200k-entry partition). Each round copies the table and
compacts the copy at a time when half its rows have expired. The reference, measured in the same run
on the same files, has none of feedlog's code in it:

  here       `expire(None, table)`: the files rewritten by threads of this process, then one commit
  reference  pyarrow alone, one thread per file as ours: read each data file, null `value`, `block`
             and `stat` of the expired rows, BLAKE2b each expired block (the leaf hash a tombstone
             keeps), set `cleared`, write the file again with zstd (what any compaction must do)
  spark      (with --spark, shown in addition) the same compaction as a Spark job

    python tools/bench/bench_expire.py            # 1M rows
    python tools/bench/bench_expire.py --quick    # 10x smaller
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from feedlog.delta import DeltaTable
from feedlog.lake.expire import expire
from feedlog.lake.ingest import ingest_batch
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write

KEY = KeyPair.from_seed(bytes([9]) * 32)
VALUE = b"v" * 80


def build(base: Path, n: int) -> Path:
    feed_dir, table = base / "feed", base / "table"
    with Feed.create(feed_dir, key_pair=KEY, timestamps="exact", fsync=False) as f:
        for lo in range(0, n, 1000):
            f.append([Write(f"/k{i:07d}", VALUE, ttl_ms=1 if i % 2 else None) for i in range(lo, min(lo + 1000, n))])
    # a filesystem table (no commit owner), so each round can compact a copy of it
    ingest_batch(None, [str(feed_dir)], str(table), owner="filesystem", progress=lambda _m: None)
    return table


def reference(files: list[str], now_us: int, out: Path) -> int:
    """Rows cleared by pyarrow alone, rewriting `files` into `out`."""

    def one(i: int, path: str) -> int:
        data = pq.read_table(path)
        expired = pc.fill_null(
            pc.less(data.column("expires_at"), pa.scalar(now_us, data.schema.field("expires_at").type)), False
        )
        mask = expired.to_pylist()
        blocks = data.column("block").to_pylist()
        leaves = [hashlib.blake2b(b, digest_size=32).digest() if m else None for m, b in zip(mask, blocks, strict=True)]
        cols = []
        for name in data.column_names:
            col = data.column(name)
            if name in ("value", "block", "stat"):
                col = pc.if_else(expired, pa.nulls(len(col), col.type), col)
            elif name == "cleared":
                col = pc.or_(col, expired)
            elif name == "leaf_hash":
                col = pa.array(leaves, pa.binary())
            cols.append(col)
        pq.write_table(pa.table(cols, names=data.column_names), out / f"{i}.parquet", compression="zstd")
        return int(pc.sum(expired.cast(pa.int64())).as_py() or 0)

    with ThreadPoolExecutor(max(1, min(len(files), os.cpu_count() or 1))) as pool:
        return sum(pool.map(one, range(len(files)), files))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="10x smaller")
    ap.add_argument("--rounds", type=int, default=3, help="A/B pairs (medians reported)")
    ap.add_argument("--spark", action="store_true", help="also time the compaction as a Spark job")
    ns = ap.parse_args()
    n = 100_000 if ns.quick else 1_000_000
    later = int(time.time() * 1000) + 60_000
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        t = time.perf_counter()
        table = build(base, n)
        print(f"(built a {n:,}-row table in {time.perf_counter() - t:.0f} s)", file=sys.stderr)
        files = [str(table / a.path) for a in DeltaTable.open(table).snapshot().files()]
        ours, refs = [], []
        for r in range(max(1, ns.rounds)):
            copy = base / f"copy{r}"
            shutil.copytree(table, copy)
            t = time.perf_counter()
            res = expire(None, str(copy), now_ms=later)
            ours.append(time.perf_counter() - t)
            assert res.engine == "local" and res.rows_cleared == n // 2, res
            out = base / f"ref{r}"
            out.mkdir()
            t = time.perf_counter()
            cleared = reference(files, later * 1000, out)
            refs.append(time.perf_counter() - t)
            assert cleared == n // 2, cleared
            shutil.rmtree(copy)
            shutil.rmtree(out)
        spark_s = None
        if ns.spark:
            from feedlog.lake import spark_session

            spark = spark_session()
            copy = base / "copy-spark"
            shutil.copytree(table, copy)
            t = time.perf_counter()
            expire(spark, str(copy), now_ms=later, engine="spark")
            spark_s = time.perf_counter() - t
    o, rf = statistics.median(ours), statistics.median(refs)
    print(f"feedlog expire, {n:,} rows in {len(files)} data files, half expired; medians of {len(ours)}")
    print(f"  in process: {o:.2f} s ({n / o:,.0f} rows/s)")
    print(f"  pyarrow alone (read, null, hash, write): {rf:.2f} s ({n / rf:,.0f} rows/s)")
    print(f"  ratio (reference s / ours s) {rf / o:.2f}")
    if spark_s is not None:
        print(f"  (as a Spark job on a running session: {spark_s:.2f} s)")


if __name__ == "__main__":
    main()
