"""Spark ingestion benchmark: entries/s from a served feed into a managed Delta table.

One feed of N entries (default 1,000,000; 64-byte values, signed batches of
1,000) served by a peer on 127.0.0.1; local Spark (`local[*]`). Measured in the
same run, each on the same rows:
  reader only     feedlog source -> Spark's `noop` sink (read, verify every block, decode, Arrow)
  ingest          `feedlog ingest`'s job: feedlog source -> feedlog-delta sink -> one commit through
                  the in-process commit owner (the number the issue targets)
  read+parquet    the same source rows written by Spark's own `df.write.parquet` (the reference the
                  target is stated against: the same read, Spark's native writer instead of ours)
  parquet only    the same rows cached in Spark's memory first, then `df.write.parquet`: Spark's
                  writer alone, no reading (a stricter reference)
  sink only       the same cached rows through the feedlog-delta sink (our writer alone)
Ratios: ingest vs read+parquet (target >= 0.8x), sink only vs parquet only.

    python tools/bench/bench_ingest.py                     # 1,000,000 entries
    python tools/bench/bench_ingest.py --entries 200000    # quicker
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feedlog.delta import DeltaTable
from feedlog.lake import spark_session
from feedlog.lake.ingest import ingest_batch
from feedlog.log.feed import Feed, Write
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.entries
    tmp = Path(tempfile.mkdtemp(prefix="feedlog-bench-ingest-"))
    peer = None
    try:
        feed = Feed.create(tmp / "feed", timestamps="exact", fsync=False)
        value = b"v" * 64
        t = timed(
            lambda: [
                feed.append([Write(f"/sensor/{i % 1000}", value) for i in range(lo, min(lo + 1000, n))])
                for lo in range(0, n, 1000)
            ]
        )
        print(f"feed: {n} entries appended in {t:.1f}s")
        peer = PeerServer(tmp / "peer", fsync=False).start()
        t = timed(lambda: push(tmp / "feed", Address.parse(f"grpc://{peer.address}"), token=peer.token))
        print(f"pushed to the peer at {peer.address} in {t:.1f}s (the peer verifies every batch)")
        src = f"grpc://{peer.address}/{feed.key.hex()}"
        spark = spark_session(app_name="feedlog-bench")
        spark.sparkContext.setLogLevel("ERROR")
        spark.range(1000).count()  # JVM warm-up outside the timings

        def reader() -> Any:
            return spark.read.format("feedlog").option("feed", src).load()

        t_read = timed(lambda: reader().write.format("noop").mode("overwrite").save())
        t_ingest = timed(lambda: ingest_batch(spark, [src], str(tmp / "table"), progress=lambda _m: None))
        rows = DeltaTable.open(tmp / "table").info()["rows"]
        assert rows == n, rows

        t_read_parquet = timed(lambda: reader().write.parquet(str(tmp / "parquet-read")))
        cached = reader().cache()
        assert cached.count() == n
        t_parquet = timed(lambda: cached.write.parquet(str(tmp / "parquet")))
        t_sink = timed(lambda: cached.write.format("feedlog-delta").mode("append").save(str(tmp / "table2")))
        cached.unpersist()

        print(f"\n{'':<16}{'seconds':>9}{'entries/s':>12}")
        for name, secs in (
            ("reader only", t_read),
            ("ingest", t_ingest),
            ("read+parquet", t_read_parquet),
            ("parquet only", t_parquet),
            ("sink only", t_sink),
        ):
            print(f"{name:<16}{secs:>9.2f}{n / secs:>12,.0f}")
        ratio = t_read_parquet / t_ingest
        print(
            f"\ningest vs Spark's parquet write of the same source rows: {ratio:.2f}x (target >= 0.8x: "
            f"{'met' if ratio >= 0.8 else 'NOT met'})"
        )
        print(f"sink alone vs Spark's parquet writer alone (cached rows): {t_parquet / t_sink:.2f}x")
        print(f"reader alone: {n / t_read:,.0f} entries/s (verify + decode + Arrow; the pipeline's bottleneck)")
        spark.stop()
    finally:
        if peer is not None:
            peer.stop(1)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
