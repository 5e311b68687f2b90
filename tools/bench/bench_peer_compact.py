"""Peer compaction benchmark (issue 37): a peer compacting a 1M-entry feed with 10% expired, and its puts meanwhile.

  compaction  entries/s of one scheduled pass (`Compactor.run_once`, what `serve --compact-every` runs)
              over the feed: read every block, decode the 10% that carry an expiry, clear the expired
              ones (Merkle nodes kept), a step of 4,096 entries at a time
  put p99     p99 latency of durable blocking unary puts to the same feed (4 clients, one put
              outstanding each) while the pass runs, vs the same puts to the idle peer measured in the
              same run just before: the ratio is the figure (target <= 2)

The peer runs as its own process, as in production: `PeerServer` (serve's code) with
`--compact-every 0`, its pass started by a line on its stdin so that the benchmark knows exactly
when it runs. The feed is written beforehand by the benchmark, with a writer clock an hour in the
past: every tenth entry has a one-minute TTL (expired now), the others none.

    python tools/bench/bench_peer_compact.py           # 1M entries
    python tools/bench/bench_peer_compact.py --quick   # 100k
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from feedlog.clock import ManualClock, SystemClock
from feedlog.errors import FeedlogError
from feedlog.log.feed import Feed, Write
from feedlog.replication.client import FeedClient

VALUE = b"v" * 80  # with key and framing, ~100-byte blocks
TOKEN = secrets.token_urlsafe(24)
CLIENTS = 4
IDLE_S = 5.0
BATCH = 10_000

#: the peer: serve's PeerServer, its pass run on "compact" (one JSON line back), stopped on EOF
DRIVER = """
import dataclasses, json, sys
from feedlog_server.app import PeerServer
peer = PeerServer(sys.argv[1], sys.argv[2], write_tokens=[sys.argv[3]], compact_every=0).start()
if len(sys.argv) > 4:
    peer.compactor.step, peer.compactor.pause_s = int(sys.argv[4]), float(sys.argv[5])
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "compact":
        print(json.dumps(dataclasses.asdict(peer.compactor.run_once())), flush=True)
peer.stop()
"""


def build(path: Path, n: int) -> bytes:
    """The feed: n entries, every tenth one expired by now (a one-minute TTL, written an hour ago)."""
    clock = ManualClock(SystemClock().now_ms() - 3_600_000)
    with Feed.create(path, timestamps="exact", clock=clock) as f:
        for lo in range(1, n + 1, BATCH):
            f.append(
                [
                    Write(f"/k{i}", VALUE, ttl_ms=60_000 if i % 10 == 0 else None)
                    for i in range(lo, min(lo + BATCH, n + 1))
                ]
            )
            clock.advance(1)
        return f.key


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def putters(target: str, key: bytes, stop: threading.Event, out: list[float]) -> list[threading.Thread]:
    """CLIENTS threads each putting one entry at a time until `stop`, latencies (s) into `out`."""

    def run(c: int) -> None:
        with FeedClient(target, token=TOKEN, timeout=30) as client:
            i = 0
            while not stop.is_set():
                t = time.perf_counter()
                client.put(key, [Write(f"/put{c}-{i}", VALUE)])
                out.append(time.perf_counter() - t)
                i += 1

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    return threads


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k entries instead of 1M")
    ap.add_argument("--dir", help="where to write (default: a temp dir)")
    ap.add_argument("--step", type=int, help="entries per compaction step (default: the peer's)")
    ap.add_argument("--pause", type=float, default=0.0, help="with --step: seconds between steps")
    ns = ap.parse_args()
    n = 100_000 if ns.quick else 1_000_000
    root = Path(ns.dir or tempfile.mkdtemp(prefix="bench-peer-compact-"))
    data = root / "peer"
    try:
        t = time.perf_counter()
        key = build(data / "bench", n)
        print(f"wrote {n:,} entries ({n // 10:,} expired) in {time.perf_counter() - t:.1f}s", flush=True)
        target = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(data), target, TOKEN]
            + ([str(ns.step), str(ns.pause)] if ns.step else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, GRPC_VERBOSITY="ERROR"),
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("the peer did not start")
            idle: list[float] = []
            stop = threading.Event()
            threads = putters(target, key, stop, idle)
            time.sleep(IDLE_S)
            stop.set()
            for th in threads:
                th.join()
            during: list[float] = []
            stop = threading.Event()
            threads = putters(target, key, stop, during)
            time.sleep(0.5)  # the putters are going before the pass starts
            mark = len(during)
            proc.stdin.write("compact\n")
            proc.stdin.flush()
            report = json.loads(proc.stdout.readline())
            end = len(during)
            stop.set()
            for th in threads:
                th.join()
            during = during[mark:end]  # the puts that completed while the pass ran
        finally:
            proc.stdin.close()
            proc.wait(60)
        rate = report["entries"] / report["seconds"]
        print(
            f"peer compaction of {n:,} entries ({n // 10:,} expired): {report['entries']:,} entries read, "
            f"{report['cleared']:,} cleared ({report['bytes_cleared']:,} bytes) in {report['seconds']:.2f}s: "
            f"{rate:,.0f} entries/s"
        )
        pi, pd = p99(idle), p99(during)
        print(
            f"put p99 ({CLIENTS} clients, durable, blocking): idle {pi * 1000:.2f} ms ({len(idle):,} puts), "
            f"during the pass {pd * 1000:.2f} ms ({len(during):,} puts); ratio {pd / pi:.2f} (target <= 2)"
        )
        if report["cleared"] != n // 10:
            raise SystemExit(f"expected {n // 10} cleared, the pass cleared {report['cleared']}")
    except FeedlogError as e:
        raise SystemExit(f"bench failed: {e}") from None
    finally:
        if not ns.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
