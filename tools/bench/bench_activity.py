"""`activity` at scale: N entries (default 10,000,000) from 1,000 feeds in a Delta table.

Measured in one run, on the same table (written once, untimed, by feedlog's Delta writer):
  spark      `feedlog.lake.insight_spark.activity` over `table_frame` (the snapshot's files as
             feedlog resolves them, read by Spark's Parquet reader; local[*]): classification (a
             window per feed for clock skew), buckets, counts per bucket and feed, counts apart.
             Run twice: the first includes the JVM's warm-up; the second is the number reported
  duckdb     the same computation as one SQL query over DuckDB's `delta_scan` (the reference:
             no feedlog code in it): the same classes, the same window, the same GROUP BY
The ratio is duckdb time / spark time (target >= 0.5x on this 2-core machine; Spark's point is
the cluster). Both results are checked equal before any figure is printed.

    python tools/bench/bench_activity.py                    # 10,000,000 entries
    python tools/bench/bench_activity.py --entries 1000000  # quicker
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from feedlog.delta import DeltaTable
from feedlog.lake import insight_spark, spark_session
from feedlog.lake.insight import EPOCH_LIMIT_MS, FUTURE_SLACK_MS, FeedPolicy, bucket_width
from feedlog.lake.rows import TIMESTAMP

FEEDS = 1_000
NOW = 1_795_000_000_000
HOUR = 3_600_000


def build(path: Path, entries: int, batch: int = 1_000_000) -> None:
    rng = np.random.default_rng(7)
    per_feed = entries // FEEDS
    table = None
    for start in range(0, entries, batch):
        n = min(batch, entries - start)
        idx = np.arange(start, start + n)
        feed = idx // per_feed
        seq = idx % per_feed + 1
        ts = NOW - 30 * 24 * HOUR + seq * 200_000 + feed * 1_000 + rng.integers(-3 * HOUR, 3 * HOUR, n)
        ts[rng.random(n) < 0.01] = 5  # an unset clock
        nulls = rng.random(n) < 0.02
        data = pa.table(
            {
                "feed": pa.array([f"{f:064x}" for f in feed], pa.string()),
                "seq": pa.array(seq, pa.int64()),
                "key": pa.array([f"/k{k}" for k in rng.integers(0, 5_000, n)], pa.string()),
                "deleted": pa.array(rng.random(n) < 0.05),
                "timestamp": pa.array(np.where(nulls, 0, ts * 1000), TIMESTAMP, mask=nulls),
                "cleared": pa.array(np.zeros(n, dtype=bool)),
            }
        )
        if table is None:
            table = DeltaTable.create(path, data.schema)
        table.append(data)


def duckdb_activity(path: Path, every: int) -> dict[tuple[int, str], int]:
    import duckdb
    import duckdb_extension_delta

    ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    sql = f"""
    WITH t AS (
      SELECT feed, seq, epoch_ms(timestamp) AS ts, coalesce(cleared, false) AS cleared FROM delta_scan('{path}')
    ), b AS (
      SELECT *, (NOT cleared AND ts IS NOT NULL AND ts >= {EPOCH_LIMIT_MS} AND ts <= {NOW + FUTURE_SLACK_MS}) AS basic
      FROM t
    ), c AS (
      SELECT *, max(CASE WHEN basic THEN ts END)
                OVER (PARTITION BY feed ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS high
      FROM b
    )
    SELECT ts - (ts % {every}) AS bucket, feed, count(*) FROM c
    WHERE basic AND (high IS NULL OR ts >= high) GROUP BY ALL
    """
    return {(int(b), str(f)): int(n) for b, f, n in con.execute(sql).fetchall()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000_000)
    ap.add_argument("--every", type=int, default=6 * HOUR)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-activity-"))
    try:
        path = work / "table"
        t = time.perf_counter()
        build(path, args.entries)
        print(f"built {args.entries:,} entries from {FEEDS:,} feeds in {time.perf_counter() - t:.1f}s (untimed)")
        spark = spark_session(app_name="bench-activity")
        spark.sparkContext.setLogLevel("ERROR")
        policies = {f"{f:064x}": FeedPolicy(None, 1) for f in range(FEEDS)}
        every, _ = bucket_width(args.every, policies)

        runs = []
        for _ in range(2):  # the first run includes the JVM's warm-up (JIT, codegen); a cluster is warm
            t = time.perf_counter()
            ours = insight_spark.activity(insight_spark.table_frame(spark, str(path)), every, NOW, policies)
            runs.append(time.perf_counter() - t)
        cold_s, spark_s = runs
        t = time.perf_counter()
        ref = duckdb_activity(path, every)
        duck_s = time.perf_counter() - t

        got = {(b, f): c[i] for f, c in ours.per_feed.items() for i, b in enumerate(ours.buckets) if c[i]}
        if got != ref:
            raise SystemExit(f"the two results differ ({len(got)} vs {len(ref)} cells): no figures")
        print(f"activity over {args.entries:,} entries, {FEEDS:,} feeds, buckets of {every // HOUR}h")
        n = args.entries
        print(f"  spark, first run (JVM warm-up included)         {cold_s:7.2f} s  {n / cold_s:12,.0f} rows/s")
        print(f"  spark, second run (table_frame + insight_spark) {spark_s:7.2f} s  {n / spark_s:12,.0f} rows/s")
        print(f"  duckdb delta_scan + window + GROUP BY           {duck_s:7.2f} s  {n / duck_s:12,.0f} rows/s")
        print(f"  ratio (duckdb time / spark's second run)        {duck_s / spark_s:7.2f}x  (target >= 0.5x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
