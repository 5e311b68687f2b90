"""Feed benchmark: durable signed appends, random reads, reopen time.

Each figure is printed next to a reference measured in the same run: the raw
limit, i.e. BLAKE2b of every block + one Ed25519 signature + write + fsync per
batch, done directly with the same libraries and no feed logic at all.

    python tools/bench/bench_feed.py                 # the issue's sizes
    python tools/bench/bench_feed.py --quick         # 10x smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from feedlog.log.core import Core
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write


def raw_limit(dirpath: Path, n: int, batch: int, size: int) -> float:
    """entries/s for hash + sign + write + fsync done directly."""
    sk = Ed25519PrivateKey.generate()
    block = os.urandom(size)
    fd = os.open(dirpath / f"raw-{batch}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t = time.perf_counter()
    for _ in range(n // batch):
        h = b""
        for _ in range(batch):
            h = hashlib.blake2b(block, digest_size=32).digest()
        sk.sign(h)
        os.write(fd, block * batch)
        os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    return (n // batch) * batch / dt


def feed_appends(dirpath: Path, n: int, batch: int, size: int) -> float:
    block = os.urandom(size)
    with Core.create(dirpath / f"core-{batch}", KeyPair.generate()) as core:
        blocks = [block] * batch
        t = time.perf_counter()
        for _ in range(n // batch):
            core.append(blocks)
        dt = time.perf_counter() - t
    return (n // batch) * batch / dt


def entry_appends(dirpath: Path, n: int, batch: int) -> float:
    value = os.urandom(80)
    with Feed.create(dirpath / f"feed-{batch}", timestamps="exact") as feed:
        t = time.perf_counter()
        for b in range(n // batch):
            feed.append([Write(f"/k/{b}/{i}", value) for i in range(batch)])
        dt = time.perf_counter() - t
    return (n // batch) * batch / dt


def random_gets(dirpath: Path, gets: int) -> tuple[float, float]:
    """(feed gets/s with hash check, raw pread gets/s of the same bytes)."""
    path = dirpath / "core-1000"
    with Core.open(path, writable=False) as core:
        rng = random.Random(1)
        seqs = [rng.randrange(core.length) for _ in range(gets)]
        t = time.perf_counter()
        for s in seqs:
            core.get(s)
        feed_rate = gets / (time.perf_counter() - t)
        entries = [core._entry(s) for s in seqs]
    fd = os.open(path / "log", os.O_RDONLY)
    t = time.perf_counter()
    for off, n, _ in entries:
        os.pread(fd, n, off)
    raw_rate = gets / (time.perf_counter() - t)
    os.close(fd)
    return feed_rate, raw_rate


def reopen(dirpath: Path, n: int, size: int) -> tuple[float, float, float]:
    """(build s, clean reopen s, reopen s after losing the checkpoint, i.e. crash recovery of the tail)."""
    path = dirpath / "big"
    block = os.urandom(size)
    t = time.perf_counter()
    with Core.create(path, KeyPair.generate(), fsync=False) as core:
        blocks = [block] * 1000
        for _ in range(n // 1000):
            core.append(blocks)
    build = time.perf_counter() - t
    t = time.perf_counter()
    with Core.open(path) as core:
        assert core.length == n // 1000 * 1000
    clean = time.perf_counter() - t
    # one more batch appended without a checkpoint, as after kill -9
    with Core.open(path) as core:
        core.append(blocks)
        core.checkpoint = lambda: None  # type: ignore[method-assign]
    t = time.perf_counter()
    with Core.open(path) as core:
        assert core.recovered_batches == 1
    crash = time.perf_counter() - t
    return build, clean, crash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="10x smaller sizes")
    ap.add_argument("--dir", help="where to write (default: a temp dir; use a real disk for fsync numbers)")
    ns = ap.parse_args()
    scale = 10 if ns.quick else 1
    n, size = 100_000 // scale, 100
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        print(f"durable signed appends, {n:,} entries of {size} B (fsync per batch)")
        print(f"{'batch':>7} {'feedlog/s':>12} {'raw limit/s':>12} {'ratio':>6}")
        for batch in (1, 100, 1000):
            count = n if batch > 1 else n // 4  # one-per-call is fsync-bound; a quarter keeps the run short
            ours = feed_appends(d, count, batch, size)
            raw = raw_limit(d, count, batch, size)
            print(f"{batch:>7} {ours:>12,.0f} {raw:>12,.0f} {ours / raw:>6.2f}")
        e = entry_appends(d, n, 100)
        print(f"protobuf Entry appends (timestamps exact), batch 100: {e:,.0f} entries/s")
        feed_rate, raw_rate = random_gets(d, 10_000)
        print(
            f"random get, 10,000 seqs (hash-checked): {feed_rate:,.0f}/s; raw pread {raw_rate:,.0f}/s;"
            f" ratio {feed_rate / raw_rate:.2f}"
        )
        big = 1_000_000 // scale
        build, clean, crash = reopen(d, big, size)
        print(
            f"reopen at {big:,} entries: {clean * 1000:.1f} ms clean, {crash * 1000:.1f} ms after a crash"
            f" (replaying one batch); build took {build:.1f} s"
        )


if __name__ == "__main__":
    main()
