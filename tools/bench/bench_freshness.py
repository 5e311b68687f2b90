"""Freshness benchmark: put acknowledged -> row visible to a reader polling the table (issue 38).

A real peer (`feedlog serve`, its own process, loopback) hosts one feed per run; a producer in this
process puts single entries at a fixed rate (a paced Kafka-style producer: `FeedClient.producer`)
and records when each put is acknowledged; `feedlog ingest --stream` (its own process) follows the
peer's live tail into a new table; a reader thread in this process polls the table (our
`DeltaTable`, the handle a feedlog reader opens: the table's owner trusted) every `--poll-ms`, reads
the `seq` column of every data file new since its last look, and records when each seq became
visible. Per entry: visible - acknowledged. Entries not visible by the end are counted as missing.

Printed per rate and engine: p50 / p99 / max (ms), commits made, and the same figures for a
reference with none of our code, measured in the same run: delta-rs (`deltalake.write_deltalake`)
appending the same rows to a plain Delta table at the same trigger, from arrival of an entry to
its append returning (no peer, no verification, no owner, no reader: a floor for a micro-batch
writer at that trigger). Ratio = ours / reference at p99.

    python tools/bench/bench_freshness.py                         # 200, 1,000, 5,000 puts/s, 20 s each
    python tools/bench/bench_freshness.py --rates 1000 --seconds 10
    python tools/bench/bench_freshness.py --spark                 # also the Spark engine (--trigger 0)

Targets (issue 38) at 1,000 puts/s on 2 cores: p99 <= 250 ms local, <= 1 s Spark.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_peers import TOKEN, peer_process  # a sibling script (tools/bench is on sys.path when run)

from feedlog.errors import FeedlogError
from feedlog.lake.sink import open_table
from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient

VALUE = b"v" * 80


@contextmanager
def peer(data: Path) -> Iterator[str]:
    """A `feedlog serve` process on a free loopback port, ready when this yields (bench_peers')."""
    with peer_process(data, env=dict(os.environ, FEEDLOG_PEER_TOKEN=TOKEN)) as (_proc, target):
        yield target


@dataclass
class Run:
    acked: dict[int, float] = field(default_factory=dict)  # seq -> perf_counter at ack
    visible: dict[int, float] = field(default_factory=dict)  # seq -> perf_counter when first seen
    commits: int = 0


def produce(target: str, key: bytes, rate: int, seconds: float, run: Run) -> None:
    """Put `rate` entries a second for `seconds`, paced every 10 ms; each ack's time recorded."""
    lock = threading.Lock()

    def acked(fut: object) -> None:
        t = time.perf_counter()
        a = fut.result()  # type: ignore[attr-defined]
        with lock:
            run.acked[a.seq] = t

    with FeedClient(target, token=TOKEN) as c, c.producer(key, max_batch=1000, max_in_flight=64) as p:
        t0 = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - t0 < seconds:
            due = int((now - t0) * rate)
            for i in range(sent, due):
                p.put(Write(f"/b/{i}", VALUE)).add_done_callback(acked)
            sent = due
            time.sleep(0.01)
        p.flush(60)


def read_visible(table: Path, run: Run, stop: threading.Event, poll_ms: int) -> None:
    """Poll the table; the seqs of each data file new since the last look are visible now."""
    seen: set[str] = set()
    t = None
    while not stop.is_set():
        try:
            t = t or open_table(str(table), None, None, None)
            files = t.snapshot().files()
        except FeedlogError:
            time.sleep(poll_ms / 1000)  # not created yet
            continue
        now = time.perf_counter()
        new = [a.path for a in files if a.path not in seen]
        for path in new:
            seen.add(path)
            seqs = pq.read_table(table / urllib.parse.unquote(path), columns=["seq"]).column("seq").to_pylist()
            for s in seqs:
                run.visible.setdefault(s, now)
        run.commits = t.version()
        time.sleep(poll_ms / 1000)


def figures(run: Run) -> tuple[np.ndarray, int]:
    """Latencies (ms) of the entries acknowledged and seen; how many acknowledged were never seen."""
    lat = [(run.visible[s] - a) * 1000 for s, a in run.acked.items() if s in run.visible]
    return np.array(lat), sum(1 for s in run.acked if s not in run.visible)


def ours(base: Path, rate: int, seconds: float, engine: str, trigger: str, poll_ms: int) -> tuple[np.ndarray, int, int]:
    """One run: a peer, a feed, the stream, the producer and the reader."""
    d = base / f"{engine}-{rate}"
    with peer(d / "peer") as target:
        with FeedClient(target, token=TOKEN) as c:
            key = c.create(timestamps="exact").key
        table = d / "table"
        cmd = [sys.executable, "-m", "feedlog", "ingest", f"grpc://{target}/{key.hex()}", str(table), "--stream"]
        cmd += ["--engine", engine, "--trigger", trigger]
        ingest = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert ingest.stdout is not None
            first = ingest.stdout.readline()  # "streaming ... feed(s) into ...": the query is starting
            if not first.startswith("streaming"):
                raise SystemExit(f"ingest did not start: {first}{ingest.stderr.read() if ingest.stderr else ''}")
            threading.Thread(target=lambda: ingest.stdout and ingest.stdout.read(), daemon=True).start()
            run, stop = Run(), threading.Event()
            # a warm-up put: the stream is landing (Spark's first batch starts its executors) before timing
            with FeedClient(target, token=TOKEN) as c:
                c.put(key, [Write("/warm-up", b"w")])
            reader = threading.Thread(target=read_visible, args=(table, run, stop, poll_ms), daemon=True)
            reader.start()
            deadline = time.monotonic() + (180 if engine == "spark" else 60)
            while 1 not in run.visible and time.monotonic() < deadline:
                time.sleep(0.05)
            produce(target, key, rate, seconds, run)
            # the tail: every acknowledged entry should appear within seconds
            end = time.monotonic() + 30
            while any(s not in run.visible for s in run.acked) and time.monotonic() < end:
                time.sleep(0.05)
            stop.set()
            reader.join(10)
        finally:
            ingest.send_signal(signal.SIGINT)
            try:
                ingest.wait(60)
            except subprocess.TimeoutExpired:
                ingest.kill()
                ingest.wait()
    lat, missing = figures(run)
    return lat, missing, run.commits


def reference(base: Path, rate: int, seconds: float, trigger_ms: int) -> tuple[np.ndarray, int]:
    """delta-rs appending the rows that arrived since the last trigger, every `trigger_ms` (0: as fast
    as it goes); latency = arrival -> append returned. None of our code runs in the loop."""
    from deltalake import write_deltalake

    path = base / f"reference-{rate}"
    schema = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("value", pa.binary())])
    t0 = time.perf_counter()
    lat: list[float] = []
    sent = commits = 0
    next_at = t0
    while (now := time.perf_counter()) - t0 < seconds:
        due = int((now - t0) * rate)
        if due > sent:
            arrivals = t0 + np.arange(sent, due) / rate
            rows = pa.table(
                [pa.array(range(sent, due), pa.int64()), [f"/b/{i}" for i in range(sent, due)], [VALUE] * (due - sent)],
                schema=schema,
            )
            write_deltalake(str(path), rows, mode="append")
            done = time.perf_counter()
            lat.extend((done - arrivals) * 1000)
            sent, commits = due, commits + 1
        next_at = max(next_at + trigger_ms / 1000, time.perf_counter()) if trigger_ms else time.perf_counter()
        time.sleep(max(next_at - time.perf_counter(), 0.0005))
    return np.array(lat), commits


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="200,1000,5000", help="puts/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="producing time per rate")
    ap.add_argument("--trigger", default="100ms", help="the local engine's --trigger")
    ap.add_argument("--poll-ms", type=int, default=10, help="how often the reader looks at the table")
    ap.add_argument("--spark", action="store_true", help="also the Spark engine with --trigger 0 (slow to start)")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    from feedlog.log.timestamps import parse_duration

    trigger_ms = parse_duration(args.trigger)
    base = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    print(f"freshness: put acknowledged -> row visible to a reader polling every {args.poll_ms} ms")
    print(
        f"{args.seconds:.0f} s per rate; one peer process, one producer; {os.cpu_count()} cores (shared: noisy figures)"
    )
    engines = [("local", args.trigger)] + ([("spark", "0")] if args.spark else [])
    try:
        for rate in rates:
            ref, ref_commits = reference(base, rate, args.seconds, trigger_ms)
            local = None
            for engine, trigger in engines:
                lat, missing, commits = ours(base, rate, args.seconds, engine, trigger, args.poll_ms)
                local = lat if engine == "local" else local
                worst = lat.max() if len(lat) else float("nan")
                print(
                    f"  {rate:>5,}/s {engine:<5} trigger {trigger:<5}: p50 {pct(lat, 50):6.0f} ms"
                    f"  p99 {pct(lat, 99):6.0f} ms  max {worst:6.0f} ms"
                    f"  ({len(lat):,} entries, {missing} not seen, {commits} versions)"
                )
            print(
                f"  {rate:>5,}/s delta-rs append every {args.trigger} (reference, arrival -> append returned):"
                f" p50 {pct(ref, 50):.0f} ms  p99 {pct(ref, 99):.0f} ms  ({ref_commits} commits)"
            )
            if local is not None and len(local) and len(ref):
                print(f"  {rate:>5,}/s ratio local p99 / reference p99: {pct(local, 99) / pct(ref, 99):.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
