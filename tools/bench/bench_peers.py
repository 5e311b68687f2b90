"""Peer benchmark on loopback: verified replication, group-committed puts, live-tail latency.

Each figure comes with a reference measured in the same run:
  replication   entries/s of `clone` (download + verify every batch + store with
                fsync) vs the raw limit: parsing the same ReadResponse bytes,
                hashing every block into the tree and checking every signature,
                written in the benchmark with protobuf, hashlib and cryptography
                alone (no feedlog code), no network or disk; medians of 3
                alternating rounds, and CPU per entry of both (client + peer)
  group commit  single-entry durable puts/s from 16 concurrent clients (each a
                pipelined producer, Kafka-style: put() returns a future acked
                after the fsync) vs local batch appends of 1,000 with fsync
  blocking put  16 clients, one blocking unary put outstanding each, vs a no-op
                gRPC server (its own process, Put answered at once) driven by
                the same clients in the same run
  tail latency  p50/p99 from a put's acknowledgement to its arrival at a
                subscriber, puts spaced a few ms apart

The peer runs as its own process (`python -m feedlog_server`), as in production.

    python tools/bench/bench_peers.py            # the issue's sizes
    python tools/bench/bench_peers.py --quick    # 10x smaller
    python tools/bench/bench_peers.py --replication  # only the replication row
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from feedlog.errors import FeedlogError
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


def raw_verify(path: Path, key: bytes) -> tuple[float, float]:
    """(entries/s, CPU seconds per entry) to parse the wire messages, hash every block into the tree and
    verify every signature.

    The timed loop is written here with protobuf, hashlib, struct and cryptography alone (none of
    feedlog's code): BLAKE2b leaves, parents a level at a time, the tree hash over the roots and
    the Ed25519 signature over hypercore's signable bytes, each tree hash asserted equal to the
    signed one (so the reference does the whole check).
    """
    with Feed.open(path, writable=False) as f:
        msgs = []
        pos = 0
        while pos < f.length:
            segs = f.core.segments(pos, f.length, 1 << 20)
            msgs.append(pb.ReadResponse(segments=[wire.segment_pb(s) for s in segs]).SerializeToString())
            pos = segs[-1].end
        total = f.length

    def h(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=32).digest()

    verify = Ed25519PublicKey.from_public_bytes(key).verify
    tree_ns = h(h(b"hypercore") + b"\x00")  # hypercore caps.js TREE namespace
    leaf_prefix = struct.Struct("<BQ").pack
    prefixes = [leaf_prefix(0, n) for n in range(4096)]
    parent = struct.Struct("<BQ32s32s").pack
    root = struct.Struct("<32sQQ").pack
    signable = struct.Struct("<32s32sQQ").pack
    roots: dict[int, tuple[bytes, int]] = {}  # depth -> (hash, byte size) of the tree's roots
    length = 0
    t, cpu = time.perf_counter(), time.process_time()
    for raw in msgs:
        for m in pb.ReadResponse.FromString(raw).segments:
            blocks = list(m.blocks)
            hashes = [h((prefixes[len(b)] if len(b) < 4096 else leaf_prefix(0, len(b))) + b) for b in blocks]
            sizes = [len(b) for b in blocks]
            d, a = 0, length  # a level at a time; a: offset of the level's first node
            while hashes:
                if a & 1:  # a right child: its left sibling is the old root of this depth
                    rh, rs = roots.pop(d)
                    hashes, sizes, a = [rh, *hashes], [rs, *sizes], a - 1
                if len(hashes) & 1:
                    roots[d] = (hashes[-1], sizes[-1])
                if len(hashes) < 2:
                    break
                sizes = [x + y for x, y in zip(sizes[0::2], sizes[1::2], strict=False)]
                hashes = [h(parent(1, sz, x, y)) for sz, x, y in zip(sizes, hashes[0::2], hashes[1::2], strict=False)]
                d, a = d + 1, a >> 1
            length += len(blocks)
            if not m.HasField("state"):
                continue  # part of a batch that goes on in the next message
            parts, covered = [], 0
            for depth in sorted(roots, reverse=True):  # left to right
                rh, rs = roots[depth]
                parts.append(root(rh, ((covered >> depth) << (depth + 1)) + (1 << depth) - 1, rs))
                covered += 1 << depth
            tree = h(b"\x02" + b"".join(parts))
            assert tree == m.state.tree_hash, "the reference's tree differs from the signed one"
            verify(m.state.signature, signable(tree_ns, tree, m.state.length, m.state.fork))
    return total / (time.perf_counter() - t), (time.process_time() - cpu) / total


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replication(d: Path, n: int, rounds: int = 3) -> None:
    """Clone and raw limit, alternately, `rounds` times on the same feed (the machine is shared): medians.

    Also CPU per entry, which the machine's load moves much less than wall time: the clone's (this
    process, the client, and the peer's process) against the raw loop's. Imports are outside every
    clock: the reference's libraries are imported with this module, and the modules a clone loads on
    first use (numpy, pyarrow: feedlog.log.entry_scan) are loaded here.
    """
    import feedlog.log.entry_scan  # noqa: F401

    key = make_feed(d / "a" / "feed", n)
    rates, limits, cpus, raw_cpus = [], [], [], []
    with peer_process(d / "a", env=dict(os.environ, FEEDLOG_PEER_TOKEN=TOKEN)) as (proc, target):
        for r in range(rounds):
            limit, raw_cpu = raw_verify(d / "a" / "feed", key)
            limits.append(limit)
            raw_cpus.append(raw_cpu)
            t, cpu, peer_cpu = time.perf_counter(), time.process_time(), process_cpu(proc.pid)
            copied = clone(Address(target, key.hex()), d / f"copy{r}")
            rates.append(copied.length / (time.perf_counter() - t))
            spent = time.process_time() - cpu + process_cpu(proc.pid) - peer_cpu
            cpus.append(spent / copied.length)
            with Feed.open(d / f"copy{r}", writable=False) as c:
                assert c.verify().length == n + 1
            shutil.rmtree(d / f"copy{r}")
    rate, limit = statistics.median(rates), statistics.median(limits)
    cpu, raw_cpu = statistics.median(cpus), statistics.median(raw_cpus)
    print(f"verified replication, {n:,} entries of ~100 B (clone: download, verify every batch, store, fsync)")
    print(
        f"  feedlog {rate:,.0f} entries/s; raw limit (parse + hash + verify, no network) {limit:,.0f}/s;"
        f" ratio {rate / limit:.2f} (medians of {rounds} alternating rounds: "
        f"{', '.join(f'{a / b:.2f}' for a, b in zip(rates, limits, strict=True))}); target >= 0.8"
    )
    print(
        f"  CPU per entry: clone {cpu * 1e6:.2f} us (client and peer processes), raw limit {raw_cpu * 1e6:.2f} us;"
        f" ratio {raw_cpu / cpu:.2f}"
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

    unary, noop_rate = blocking_puts(d, clients)
    print(f"single-entry durable puts, {clients} concurrent clients x {per_client:,}, group commit")
    print(
        f"  pipelined producers {rate:,.0f} puts/s; local batch appends (1,000/batch, fsync) {ref:,.0f}/s;"
        f" ratio {rate / ref:.2f}; target >= 20,000/s; no lost or duplicate seq"
    )
    print(f"blocking unary puts, {clients} clients, one outstanding each (durable, group commit)")
    print(
        f"  feedlog {unary:,.0f} puts/s; a no-op gRPC server (Put answers at once, no feed), same clients:"
        f" {noop_rate:,.0f}/s; ratio {unary / noop_rate:.2f}; target >= 0.8"
    )


NOOP_SERVER = """
import sys, grpc
from concurrent.futures import ThreadPoolExecutor
from feedlog.pb import feeds_pb2 as pb
def put(request, context):  # a well-formed ack (one entry, at seq 1 of 2): the clients check acks
    return pb.PutResponse(appended=[pb.Appended(seq=1)], state=pb.SignedState(length=2))
handler = grpc.method_handlers_generic_handler(
    "feedlog.feeds.Feeds",
    {"Put": grpc.unary_unary_rpc_method_handler(
        put, request_deserializer=pb.PutRequest.FromString, response_serializer=pb.PutResponse.SerializeToString)},
)
server = grpc.server(ThreadPoolExecutor(max_workers=32))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port(sys.argv[1])
server.start()
print("ready", flush=True)
sys.stdin.read()
"""


def blocking_rate(target: str, key: bytes, clients: int, seconds: float) -> float:
    """puts/s of `clients` threads, each with its own FeedClient and one blocking put outstanding."""
    done = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    stop = [0.0]

    def blocking() -> None:
        with FeedClient(target, token=TOKEN) as c:
            c.put(key, [Write("/b", VALUE)])  # connected and warm before the clock starts
            barrier.wait()
            n = 0
            while time.monotonic() < stop[0]:
                c.put(key, [Write("/b", VALUE)])
                n += 1
            with lock:
                done[0] += n

    bt = [threading.Thread(target=blocking) for _ in range(clients)]
    for th in bt:
        th.start()
    stop[0] = time.monotonic() + 1e9
    barrier.wait()
    t = time.perf_counter()
    stop[0] = time.monotonic() + seconds
    for th in bt:
        th.join()
    return done[0] / (time.perf_counter() - t)


def blocking_puts(d: Path, clients: int = 16) -> tuple[float, float]:
    """Blocking unary puts: the peer (durable, group-committed) and, in the same run, a no-op gRPC server
    (its own process, answering every Put at once) driven by the same clients; the peer's run comes
    between two no-op runs and the no-op figure is their mean (the machine is shared)."""
    target = f"127.0.0.1:{free_port()}"
    noop = subprocess.Popen(
        [sys.executable, "-c", NOOP_SERVER, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert noop.stdout is not None and noop.stdout.readline().strip() == "ready"
        noop_rates = [blocking_rate(target, bytes(32), clients, 3.0)]
        with peer(d / "b") as ptarget:
            with FeedClient(ptarget, token=TOKEN) as c:
                key = c.create(timestamps="exact").key
            rate = blocking_rate(ptarget, key, clients, 3.0)
        noop_rates.append(blocking_rate(target, bytes(32), clients, 3.0))
    finally:
        noop.kill()
        noop.wait()
    return rate, statistics.mean(noop_rates)


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
    ap.add_argument("--blocking", action="store_true", help="only the blocking unary put row")
    ap.add_argument("--replication", action="store_true", help="only the verified replication row")
    ns = ap.parse_args()
    scale = 10 if ns.quick else 1
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        if ns.blocking:
            unary, noop_rate = blocking_puts(d)
            print(f"blocking unary puts, 16 clients: feedlog {unary:,.0f}/s; no-op gRPC server {noop_rate:,.0f}/s;")
            print(f"  ratio {unary / noop_rate:.2f}; target >= 0.8")
            return
        replication(d, 100_000 // scale)
        if ns.replication:
            return
        group_commit(d, 4000 // scale)
        tail_latency(d, 500 // scale)


if __name__ == "__main__":
    main()
