"""Peer benchmark on loopback: verified replication, group-committed puts, live-tail latency.

Each figure comes with a reference measured in the same run:
  replication   entries/s of `clone` (download + verify every batch + store with
                fsync) vs the raw limit: parsing the same ReadResponse bytes,
                hashing every block into the tree and checking every signature,
                with the same libraries and no network or disk
  group commit  single-entry durable puts/s from 16 concurrent clients (each a
                pipelined producer, Kafka-style: put() returns a future acked
                after the fsync) vs local batch appends of 1,000 with fsync
  tail latency  p50/p99 from a put's acknowledgement to its arrival at a
                subscriber, puts spaced a few ms apart

The peer runs as its own process (`python -m feedlog_server`), as in production.

    python tools/bench/bench_peers.py            # the issue's sizes
    python tools/bench/bench_peers.py --quick    # 10x smaller
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from feedlog.errors import FeedlogError
from feedlog.log import merkle
from feedlog.log.crypto import Verifier, leaf_hash
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone
from feedlog.rpc import Address

VALUE = b"v" * 80  # with key and framing, ~100-byte blocks
TOKEN = secrets.token_urlsafe(24)  # the benchmark peers' write token (FEEDLOG_PEER_TOKEN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def peer_process(
    data: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A `feedlog serve` process for `data` on a free loopback port, ready (answers GetInfo) when this yields."""
    target = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", target, *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        with FeedClient(target, timeout=2) as c:
            while True:
                try:
                    c.info(bytes(32))
                except FeedlogError as e:
                    if "does not host" in str(e):
                        break
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.1)
        yield proc, target
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def peer(data: Path) -> Iterator[str]:
    """A peer that takes the benchmark's write token."""
    with peer_process(data, env=dict(os.environ, FEEDLOG_PEER_TOKEN=TOKEN)) as (_proc, target):
        yield target


def make_feed(path: Path, n: int) -> bytes:
    with Feed.create(path, timestamps="exact", fsync=False) as f:
        for lo in range(0, n, 1000):
            f.append([Write(f"/k{i:07d}", VALUE) for i in range(lo, min(lo + 1000, n))])
        return f.key


def raw_verify_limit(path: Path, key: bytes) -> float:
    """entries/s to parse the wire messages, hash every block into the tree and verify every signature."""
    with Feed.open(path, writable=False) as f:
        msgs = []
        pos = 0
        while pos < f.length:
            segs = f.core.segments(pos, f.length, 1 << 20)
            msgs.append(pb.ReadResponse(segments=[wire.segment_pb(s) for s in segs]).SerializeToString())
            pos = segs[-1].end
        total = f.length
    verifier = Verifier(key)
    t = time.perf_counter()
    roots: list[merkle.Node] = []
    start = 0
    for raw in msgs:
        for m in pb.ReadResponse.FromString(raw).segments:
            leaves = [merkle.Node(2 * (start + k), leaf_hash(b), len(b)) for k, b in enumerate(m.blocks)]
            _, roots = merkle.append_nodes(roots, leaves)
            start += len(m.blocks)
            if not m.HasField("state"):
                continue  # part of a batch that goes on in the next message
            assert merkle.roots_hash(roots) == m.state.tree_hash
            assert verifier.verify(m.state.signature, wire.state_of(m.state).signable())
    return total / (time.perf_counter() - t)


def replication(d: Path, n: int) -> None:
    key = make_feed(d / "a" / "feed", n)
    limit = raw_verify_limit(d / "a" / "feed", key)
    with peer(d / "a") as target:
        t = time.perf_counter()
        copied = clone(Address(target, key.hex()), d / "copy")
        rate = copied.length / (time.perf_counter() - t)
    with Feed.open(d / "copy", writable=False) as c:
        assert c.verify().length == n + 1
    print(f"verified replication, {n:,} entries of ~100 B (clone: download, verify every batch, store, fsync)")
    print(
        f"  feedlog {rate:,.0f} entries/s; raw limit (parse + hash + verify, no network) {limit:,.0f}/s;"
        f" ratio {rate / limit:.2f}; target >= 100,000/s"
    )


def local_batches(d: Path, n: int) -> float:
    with Feed.create(d / "local", timestamps="exact") as f:
        t = time.perf_counter()
        for lo in range(0, n, 1000):
            f.append([Write(f"/k{i}", VALUE) for i in range(lo, min(lo + 1000, n))])
        return n / (time.perf_counter() - t)


def group_commit(d: Path, per_client: int, clients: int = 16) -> None:
    ref = local_batches(d, per_client * clients)
    with peer(d / "g") as target:
        with FeedClient(target, token=TOKEN) as c:
            key = c.create(timestamps="exact").key
        seqs: list[list[int]] = [[] for _ in range(clients)]
        barrier = threading.Barrier(clients + 1)

        def run(n: int) -> None:
            with FeedClient(target, token=TOKEN) as c, c.producer(key) as p:
                barrier.wait()
                futs = [p.put(Write(f"/c{n}/{i}", VALUE)) for i in range(per_client)]
                seqs[n] = [f.result(60).seq for f in futs]

        threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
        for th in threads:
            th.start()
        barrier.wait()
        t = time.perf_counter()
        for th in threads:
            th.join()
        rate = per_client * clients / (time.perf_counter() - t)
        got = sorted(s for ss in seqs for s in ss)
        assert got == list(range(1, per_client * clients + 1)), "lost or duplicate seqs"

        # for contrast: 16 blocking callers, one outstanding put each (latency-bound)
        done = [0]
        lock = threading.Lock()
        stop = time.monotonic() + 3

        def blocking() -> None:
            with FeedClient(target, token=TOKEN) as c:
                while time.monotonic() < stop:
                    c.put(key, [Write("/b", VALUE)])
                    with lock:
                        done[0] += 1

        t = time.perf_counter()
        bt = [threading.Thread(target=blocking) for _ in range(clients)]
        for th in bt:
            th.start()
        for th in bt:
            th.join()
        blocking_rate = done[0] / (time.perf_counter() - t)
    print(f"single-entry durable puts, {clients} concurrent clients x {per_client:,}, group commit")
    print(
        f"  pipelined producers {rate:,.0f} puts/s; local batch appends (1,000/batch, fsync) {ref:,.0f}/s;"
        f" ratio {rate / ref:.2f}; target >= 20,000/s; no lost or duplicate seq"
    )
    print(f"  (blocking unary put, one outstanding per client: {blocking_rate:,.0f} puts/s)")


def tail_latency(d: Path, count: int) -> None:
    with peer(d / "t") as target:
        with FeedClient(target, token=TOKEN) as c:
            key = c.create(timestamps="exact").key
        arrived: dict[int, float] = {}
        ready = threading.Event()
        sub_client = FeedClient(target)
        sub = sub_client.subscribe(key, 1, with_roots=True)

        def consume() -> None:
            ready.set()
            for batch in sub.verified(key, 1):
                now = time.perf_counter()
                for k in range(len(batch.blocks)):
                    arrived[batch.start + k] = now
                if len(arrived) >= count:
                    return

        th = threading.Thread(target=consume)
        th.start()
        ready.wait()
        time.sleep(0.3)
        acked: dict[int, float] = {}
        with FeedClient(target, token=TOKEN) as c:
            for i in range(count):
                (a,) = c.put(key, [Write(f"/t{i}", VALUE)])
                acked[a.seq] = time.perf_counter()
                time.sleep(0.003)
        th.join(30)
        sub.cancel()
        sub_client.close()
    lat = sorted(max(arrived[s] - acked[s], 0.0) * 1000 for s in acked if s in arrived)
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"live tail, {len(lat)} puts: ack -> subscriber p50 {p50:.2f} ms, p99 {p99:.2f} ms; target p99 <= 20 ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="10x smaller sizes")
    ap.add_argument("--dir", help="where to write (default: a temp dir)")
    ns = ap.parse_args()
    scale = 10 if ns.quick else 1
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        replication(d, 100_000 // scale)
        group_commit(d, 4000 // scale)
        tail_latency(d, 500 // scale)


if __name__ == "__main__":
    main()
