"""Spark ingestion benchmark: entries/s from a served feed into a managed Delta table.

One feed of N entries (default 1,000,000; 64-byte values, signed batches of
1,000) served by a peer on 127.0.0.1; local Spark (`local[*]`). Measured in the
same run, each on the same rows:
  reader only     feedlog source -> Spark's `noop` sink (read, verify every block, decode, Arrow)
  ingest          `feedlog ingest --engine spark`'s job (`feedlog.lake.land`): each task reads,
                  verifies and writes its Parquet files, rows never enter the JVM; the driver
                  commits once through the in-process commit owner (the number the issue targets)
  read+parquet    the same source rows written by Spark's own `df.write.parquet` (the reference the
                  target is stated against: the same read, Spark's native writer instead of ours)
  parquet only    the same rows cached in Spark's memory first, then `df.write.parquet`: Spark's
                  writer alone, no reading (a stricter reference); median of 3, alternating with:
  sink only       the same cached rows through the feedlog-delta sink (our writer alone), a new
                  table each time
  sink, by rows   the same with feedlog.lake.ROW_BOUNDED_BATCHES set for the job (Arrow batches of
                  1,000 rows, no byte bound: Spark's JVM stops sizing each batch after every row)
  source->sink    the same as a DataFrame: feedlog source -> feedlog-delta sink (what a PySpark
                  user writes, and `ingest`'s job before it used land): every row crosses into the
                  JVM and back
  ingest here     the same job without Spark (`feedlog ingest --engine local`, what `auto` picks up
                  to 1M entries): read, verify, write and commit in this one process, on one core
  reader, 1 core  the reader's own work on one core: `read_partition` over the feed in this
                  process, CPU time of the calling thread (the peer's threads not counted)
Ratios: ingest vs read+parquet (target >= 0.8x), sink only vs parquet only.

Starts (issue 19: what a user waits for), each a `feedlog` command in its own process, wall time:
  small ingest    3 new entries from the peer into a new table, as a Spark job (`--engine spark`);
                  "first commit" is when the command prints its commit (target < 15 s on 2 cores)
  small, auto     the same with the default `--engine auto`: landed in the command's own process
  no-op rerun     the same command again: nothing new, answered without starting Spark (target < 5 s)
  down peer       a source whose peer is not running: the one-line error (target < 5 s)
  bare Spark      the reference with none of our code: a Python process that starts the same local
                  Spark and writes 3 rows with Spark's own Parquet writer

    python tools/bench/bench_ingest.py                     # 1,000,000 entries, then the starts
    python tools/bench/bench_ingest.py --entries 200000    # quicker
    python tools/bench/bench_ingest.py --only starts       # the starts alone (--repeat 3: medians)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from feedlog.delta import DeltaTable
from feedlog.lake import ROW_BOUNDED_BATCHES, spark_session, sql_settings
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.land import land
from feedlog.lake.source import FIRST_SEQ, load_feeds, plan_partitions, read_partition
from feedlog.log.feed import Feed, Write
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


BARE_SPARK = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false").getOrCreate()
spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "seq long, key string").write.parquet(sys.argv[1])
spark.stop()
"""


def command(args: list[str], until: str | None = None) -> tuple[float, float | None, int]:
    """(seconds to exit, seconds until a stdout line holding `until` appeared, exit code)."""
    t0 = time.perf_counter()
    # stderr to a file, not a pipe nobody reads (a chatty command would block on a full pipe)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}  # bare Spark's workers need this interpreter too
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert p.stdout is not None
        seen = None
        for line in p.stdout:
            if until is not None and seen is None and until in line:
                seen = time.perf_counter() - t0
        p.wait(timeout=600)
    return time.perf_counter() - t0, seen, p.returncode


def starts(tmp: Path, peer: PeerServer, repeat: int) -> None:
    """The user-facing start-up times, against bare Spark started and written with in the same run."""
    feedlog = [sys.executable, "-m", "feedlog.cli"]
    small = Feed.create(tmp / "small", timestamps="exact", fsync=False)
    small.append([Write(f"/k{i}", b"v") for i in range(3)])
    small.close()
    push(tmp / "small", Address.parse(f"grpc://{peer.address}"), token=peer.token)
    src = f"grpc://{peer.address}/{small.key.hex()}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"grpc://127.0.0.1:{s.getsockname()[1]}/{small.key.hex()}"  # nobody listens once closed
    names = ("small ingest", "first commit", "small, auto", "no-op rerun", "down peer", "bare")
    got: dict[str, list[float]] = {k: [] for k in names}
    for i in range(repeat):
        table = tmp / f"small-table-{i}"
        total, first, code = command(
            [*feedlog, "ingest", src, str(table), "--engine", "spark"], until="committed version"
        )
        assert code == 0 and first is not None, f"small ingest failed ({code})"
        got["small ingest"].append(total)
        got["first commit"].append(first)
        total, first, code = command([*feedlog, "ingest", src, str(tmp / f"auto-{i}")], until="without Spark")
        assert code == 0 and first is not None, f"small ingest (auto) failed ({code})"
        got["small, auto"].append(total)
        total, _, code = command([*feedlog, "ingest", src, str(table)])
        assert code == 0, code
        got["no-op rerun"].append(total)
        total, _, code = command([*feedlog, "ingest", down, str(tmp / f"down-{i}")])
        assert code == 8, code
        got["down peer"].append(total)
        total, _, code = command([sys.executable, "-c", BARE_SPARK, str(tmp / f"bare-{i}")])
        assert code == 0, code
        got["bare"].append(total)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\nstarts ({repeat} run(s), medians; wall time of each command in its own process)")
    for name, target in (
        ("small ingest", 15.0),
        ("first commit", None),
        ("small, auto", 15.0),
        ("no-op rerun", 5.0),
        ("down peer", 5.0),
    ):
        goal = f"  target < {target:.0f} s: {'met' if med[name] < target else 'NOT met'}" if target else ""
        print(f"  {name:<14}{med[name]:>7.1f} s  ({med[name] / med['bare']:.2f}x bare Spark){goal}")
    print(f"  {'bare Spark':<14}{med['bare']:>7.1f} s  (start local Spark, write 3 rows as Parquet, stop)")


def warm_workers(spark: Any, src: str, tmp: Path) -> None:
    """One small read and write through each data source first: Python workers start and import
    feedlog, pyarrow and numpy once, outside the timings (the first timed job paid it before)."""
    small = spark.read.format("feedlog").option("feed", src).option("endingOffsets", "1001").load()
    small.write.format("noop").mode("overwrite").save()
    small.write.format("feedlog-delta").mode("append").save(str(tmp / "warm-table"))
    land(spark, {"feeds": src, "endingOffsets": "1001"}, str(tmp / "warm-land"), {})


def reader_one_core(src: str) -> float:
    """Seconds of this thread's CPU the reader takes over the whole feed (verify, decode, Arrow),
    called as a Spark task calls it; the peer's serving threads are not counted."""
    feeds = load_feeds({"feed": src})
    k = feeds[0].source.key_hex
    parts = plan_partitions(feeds, {k: FIRST_SEQ}, {k: feeds[0].source.signed_length()}, 200_000)
    t0 = time.thread_time()
    rows = sum(b.num_rows for p in parts for b in read_partition(feeds, p))
    assert rows == feeds[0].source.signed_length() - FIRST_SEQ, rows
    return time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--only", choices=("throughput", "starts"), help="run one part (default: both)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the starts (medians reported)")
    args = ap.parse_args()
    n = args.entries
    tmp = Path(tempfile.mkdtemp(prefix="feedlog-bench-ingest-"))
    peer = None
    try:
        if args.only == "starts":
            peer = PeerServer(tmp / "peer", fsync=False).start()
            starts(tmp, peer, args.repeat)
            return
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

        warm_workers(spark, src, tmp)
        t_core = reader_one_core(src)
        t_read = timed(lambda: reader().write.format("noop").mode("overwrite").save())
        t_ingest = timed(lambda: ingest_batch(spark, [src], str(tmp / "table"), progress=lambda _m: None))
        rows = DeltaTable.open(tmp / "table").info()["rows"]
        assert rows == n, rows
        t_frame = timed(lambda: reader().write.format("feedlog-delta").mode("append").save(str(tmp / "table-frame")))
        assert DeltaTable.open(tmp / "table-frame").info()["rows"] == n
        t_here = timed(lambda: ingest_batch(None, [src], str(tmp / "table-here"), progress=lambda _m: None))
        assert DeltaTable.open(tmp / "table-here").info()["rows"] == n

        t_read_parquet = timed(lambda: reader().write.parquet(str(tmp / "parquet-read")))
        cached = reader().cache()
        assert cached.count() == n
        # the two writers alone, alternately, medians of 3: one shot of each moved by a third between
        # runs on this 2-core machine (the sink 0.65x in one run, 0.81x in the next)
        parquets, sinks, bounded = [], [], []
        for i in range(3):
            parquets.append(timed(partial(cached.write.parquet, str(tmp / f"parquet{i}"))))
            sink = cached.write.format("feedlog-delta").mode("append")
            sinks.append(timed(partial(sink.save, str(tmp / f"sink{i}"))))
            # the same with ROW_BOUNDED_BATCHES (batches of 1,000 rows, no byte bound), for this job only
            with sql_settings(spark, ROW_BOUNDED_BATCHES):
                sink = cached.write.format("feedlog-delta").mode("append")
                bounded.append(timed(partial(sink.save, str(tmp / f"bounded{i}"))))
        t_parquet, t_sink, t_bounded = statistics.median(parquets), statistics.median(sinks), statistics.median(bounded)
        cached.unpersist()

        print(f"\n{'':<16}{'seconds':>9}{'entries/s':>12}")
        for name, secs in (
            ("reader only", t_read),
            ("reader, 1 core", t_core),
            ("ingest", t_ingest),
            ("source->sink", t_frame),
            ("ingest here", t_here),
            ("read+parquet", t_read_parquet),
            ("parquet only", t_parquet),
            ("sink only", t_sink),
            ("sink, by rows", t_bounded),
        ):
            print(f"{name:<16}{secs:>9.2f}{n / secs:>12,.0f}")
        ratio = t_read_parquet / t_ingest
        print(
            f"\ningest vs Spark's parquet write of the same source rows: {ratio:.2f}x (target >= 0.8x: "
            f"{'met' if ratio >= 0.8 else 'NOT met'})"
        )
        print(
            f"sink alone vs Spark's parquet writer alone (cached rows, medians of 3): {t_parquet / t_sink:.2f}x "
            f"(target >= 1.0x; runs: {', '.join(f'{p / q:.2f}' for p, q in zip(parquets, sinks, strict=True))})"
        )
        print(
            f"sink alone with ROW_BOUNDED_BATCHES (1,000 rows, no byte bound; rows known small): "
            f"{t_parquet / t_bounded:.2f}x (runs: "
            f"{', '.join(f'{p / q:.2f}' for p, q in zip(parquets, bounded, strict=True))})"
        )
        print(
            f"vs Spark's parquet write of the rows from memory (issue 17's reference): ingest "
            f"{t_parquet / t_ingest:.2f}x (target >= 0.8x: {'met' if t_parquet / t_ingest >= 0.8 else 'NOT met'}); "
            f"source->sink as a DataFrame {t_parquet / t_frame:.2f}x"
        )
        print(
            f"ingest without Spark (one process, one core) vs Spark's parquet write from memory (all cores): "
            f"{t_parquet / t_here:.2f}x; vs ingest on Spark: {t_ingest / t_here:.2f}x"
        )
        print(f"reader on one core, in this process: {n / t_core:,.0f} entries/s of its thread's CPU (target >= 250k)")
        print(f"reader alone: {n / t_read:,.0f} entries/s (verify + decode + Arrow; the pipeline's bottleneck)")
        spark.stop()
        if args.only is None:
            starts(tmp, peer, args.repeat)
    finally:
        if peer is not None:
            peer.stop(1)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
