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
import statistics
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


def feed_reopen_get(dirpath: Path, n: int, rounds: int) -> tuple[float, float, float]:
    """(build s, median s of Feed.open + the first `get` of a random key, median s of Feed.open + `info`).

    A feed of `n` entries (keys /k/0 .. /k/n-1, batches of 1,000) is closed, then reopened `rounds`
    times; each time the first `get` is what a user waits for. `info` (no key lookup) is the floor.
    """
    path = dirpath / "big-feed"
    value = os.urandom(80)
    t = time.perf_counter()
    with Feed.create(path, timestamps="exact", fsync=False) as feed:
        for b in range(n // 1000):
            feed.append([Write(f"/k/{b * 1000 + i}", value) for i in range(1000)])
    build = time.perf_counter() - t
    rng = random.Random(2)
    gets, infos = [], []
    for _ in range(rounds):
        key = f"/k/{rng.randrange(n // 1000 * 1000)}"
        t = time.perf_counter()
        with Feed.open(path) as feed:
            r = feed.get(key)
            gets.append(time.perf_counter() - t)
            assert r is not None and r.key == key and r.value == value
        t = time.perf_counter()
        with Feed.open(path) as feed:
            feed.info()
            infos.append(time.perf_counter() - t)
    return build, statistics.median(gets), statistics.median(infos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="10x smaller sizes")
    ap.add_argument("--only", choices=("append", "get", "reopen", "feed-reopen"), action="append", help="rows to run")
    ap.add_argument("--rounds", type=int, default=3, help="reopen rounds (median reported)")
    ap.add_argument("--dir", help="where to write (default: a temp dir; use a real disk for fsync numbers)")
    ns = ap.parse_args()
    scale = 10 if ns.quick else 1
    n, size = 100_000 // scale, 100
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        only = set(ns.only or ("append", "get", "reopen", "feed-reopen"))
        if only & {"append", "get"}:
            appends(d, n, size, only)
        big = 1_000_000 // scale
        if "reopen" in only:
            build, clean, crash = reopen(d, big, size)
            print(
                f"reopen at {big:,} entries: {clean * 1000:.1f} ms clean, {crash * 1000:.1f} ms after a crash"
                f" (replaying one batch); build took {build:.1f} s"
            )
        if "feed-reopen" in only:
            build, first_get, info = feed_reopen_get(d, big, ns.rounds)
            print(
                f"first get after reopening a {big:,}-entry feed: {first_get * 1000:.1f} ms"
                f" (median of {ns.rounds}); open + info: {info * 1000:.1f} ms; build took {build:.1f} s"
            )


def appends(d: Path, n: int, size: int, only: set[str]) -> None:
    if "append" in only:
        print(f"durable signed appends, {n:,} entries of {size} B (fsync per batch)")
        print(f"{'batch':>7} {'feedlog/s':>12} {'raw limit/s':>12} {'ratio':>6}")
    for batch in (1, 100, 1000) if "append" in only else (1000,):
        count = n if batch > 1 else n // 4  # one-per-call is fsync-bound; a quarter keeps the run short
        ours = feed_appends(d, count, batch, size)
        if "append" in only:
            raw = raw_limit(d, count, batch, size)
            print(f"{batch:>7} {ours:>12,.0f} {raw:>12,.0f} {ours / raw:>6.2f}")
    if "append" in only:
        e = entry_appends(d, n, 100)
        print(f"protobuf Entry appends (timestamps exact), batch 100: {e:,.0f} entries/s")
    if "get" in only:
        feed_rate, raw_rate = random_gets(d, 10_000)
        print(
            f"random get, 10,000 seqs (hash-checked): {feed_rate:,.0f}/s; raw pread {raw_rate:,.0f}/s;"
            f" ratio {feed_rate / raw_rate:.2f}"
        )


if __name__ == "__main__":
    main()
