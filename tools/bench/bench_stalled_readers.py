"""Peer memory under stalled readers: does a reader that stops reading cost the peer only its own stream?

Builds a feed of ~300 MiB in 1 MiB batches, starts a real peer on it
(`python -m feedlog_server`, its own process), opens 20 `Read` streams on 20
connections that each take one message and then stop reading, and samples the
peer's resident memory (VmRSS / VmHWM from /proc) for 10 s.

    python tools/bench/bench_stalled_readers.py              # the issue's sizes: 300 MiB, 20 readers, 10 s
    python tools/bench/bench_stalled_readers.py --mib 20 --readers 4 --seconds 3

Target: the peer's peak stays under 2x the idle peer.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from bench_peers import peer_process  # a sibling script (tools/bench is on sys.path when run)

from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.pb import feeds_pb2_grpc as pb_grpc
from feedlog.replication.client import FeedClient
from feedlog.rpc import channel_options

VALUE_BYTES = 64 << 10
PER_BATCH = 16  # 16 x 64 KiB: ~1 MiB batches, the default message budget


def make_feed(path: Path, mib: int) -> bytes:
    """A feed of about `mib` MiB of entries; incompressible values, so nothing is smaller than it looks."""
    n = max(1, (mib << 20) // VALUE_BYTES)
    value = bytes((i * 2654435761) >> 13 & 0xFF for i in range(VALUE_BYTES))
    with Feed.create(path, timestamps="exact", fsync=False) as f:
        for lo in range(0, n, PER_BATCH):
            f.append([Write(f"/k{i:07d}", value) for i in range(lo, min(lo + PER_BATCH, n))])
        return f.key


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process `pid`, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(rest.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


@dataclass(frozen=True, slots=True)
class Result:
    idle: int  # peer RSS with the feed open, before any stream
    peak: int  # highest RSS sampled while the readers stalled
    first: int  # readers that got their first message

    @property
    def ratio(self) -> float:
        return self.peak / self.idle


def stalled_readers(pid: int, target: str, key: bytes, readers: int, seconds: float) -> Result:
    """Open `readers` Read streams that each take one message and stop; the peer's RSS meanwhile."""
    with FeedClient(target, timeout=10) as c:
        c.info(key)  # the feed is open and warm: this is the idle peer
    time.sleep(0.3)
    idle = memory(pid)[0]
    channels: list[grpc.Channel] = []
    streams: list[Any] = []
    peak = idle
    first = 0
    try:
        for _ in range(readers):
            ch = grpc.insecure_channel(target, options=channel_options())
            channels.append(ch)
            it = pb_grpc.FeedsStub(ch).Read(pb.ReadRequest(feed=pb.FeedId(key=key)), timeout=seconds + 30)
            streams.append(it)
            try:
                next(it)  # take one message, then never read again
                first += 1
            except grpc.RpcError:
                pass
            peak = max(peak, memory(pid)[0])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            peak = max(peak, memory(pid)[0])
            time.sleep(0.05)
    finally:
        for it in streams:
            it.cancel()
        for ch in channels:
            ch.close()
    return Result(idle, peak, first)


def run(mib: int, readers: int, seconds: float, root: Path, peer_args: tuple[str, ...] = ()) -> Result:
    key = make_feed(root / "data" / "feed", mib)
    with peer_process(root / "data", *peer_args) as (proc, target):
        return stalled_readers(proc.pid, target, key, readers, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=300, help="feed size in MiB (300)")
    ap.add_argument("--readers", type=int, default=20, help="stalled Read streams (20)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long they stall while memory is sampled (10)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        r = run(ns.mib, ns.readers, ns.seconds, Path(d))
        took = time.perf_counter() - t
    mb = 1 << 20
    print(f"{ns.readers} readers of a {ns.mib} MiB feed, each took one message then stalled for {ns.seconds:g} s")
    print(f"  got a first message: {r.first}/{ns.readers}")
    print(f"  peer RSS idle {r.idle / mb:,.0f} MiB, peak {r.peak / mb:,.0f} MiB, ratio {r.ratio:.2f} (target < 2)")
    print(f"  ({took:.0f} s in all)")


if __name__ == "__main__":
    main()
