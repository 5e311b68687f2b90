"""Feed benchmark: durable signed appends, random reads, reopen time.

Each figure is printed next to a reference measured in the same run: the raw
limit, i.e. BLAKE2b of every block + one Ed25519 signature + write + fsync per
batch, done directly with the same libraries and no feed logic at all.

    python tools/bench/bench_feed.py                 # the issue's sizes
    python tools/bench/bench_feed.py --quick         # 10x smaller, for a smoke run
    python tools/bench/bench_feed.py --only append --rounds 100   # steadier ratios on a shared machine

With the default 5 rounds each side of a pair runs for a fraction of a second, long
enough for a loaded machine's fsync latency and CPU share to change between them
(batch-100 ratios of 0.5 to 1.4 in one hour, issue 17); 100 rounds pair the two every
1 (batch 1,000) or 10 (batch 100) batches.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
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


def raw_limit(fd: int, sk: Ed25519PrivateKey, block: bytes, n: int, batch: int) -> float:
    """entries/s for hash + sign + write + fsync done directly."""
    t = time.perf_counter()
    for _ in range(n // batch):
        h = b""
        for _ in range(batch):
            h = hashlib.blake2b(block, digest_size=32).digest()
        sk.sign(h)
        os.write(fd, block * batch)
        os.fdatasync(fd)
    dt = time.perf_counter() - t
    return (n // batch) * batch / dt


def feed_appends(core: Core, block: bytes, n: int, batch: int) -> float:
    blocks = [block] * batch
    t = time.perf_counter()
    for _ in range(n // batch):
        core.append(blocks)
    dt = time.perf_counter() - t
    return (n // batch) * batch / dt


def append_rounds(dirpath: Path, n: int, batch: int, size: int, rounds: int) -> tuple[float, float, float]:
    """Median (feedlog entries/s, raw limit entries/s, ratio of the pair) over `rounds` alternating pairs.

    The same block is appended both ways, the two files on the same disk, a round of each in turn
    so that a shared machine's drift moves both.
    """
    block = os.urandom(size)
    sk = Ed25519PrivateKey.generate()
    fd = os.open(dirpath / f"raw-{batch}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    ours, raw = [], []
    try:
        with Core.create(dirpath / f"core-{batch}", KeyPair.generate()) as core:
            for _ in range(rounds):
                ours.append(feed_appends(core, block, n // rounds, batch))
                raw.append(raw_limit(fd, sk, block, n // rounds, batch))
    finally:
        os.close(fd)
    ratio = statistics.median(a / b for a, b in zip(ours, raw, strict=True))
    return statistics.median(ours), statistics.median(raw), ratio


def entry_appends(dirpath: Path, n: int, batch: int) -> float:
    value = os.urandom(80)
    with Feed.create(dirpath / f"feed-{batch}", timestamps="exact") as feed:
        t = time.perf_counter()
        for b in range(n // batch):
            feed.append([Write(f"/k/{b}/{i}", value) for i in range(batch)])
        dt = time.perf_counter() - t
    return (n // batch) * batch / dt


def random_gets(dirpath: Path, gets: int, rounds: int) -> tuple[float, float, float, float]:
    """Medians over alternating rounds: feed gets/s (hash-checked), raw pread gets/s of the same bytes,
    their ratio, and raw slices/s of the same bytes from a map of the log (no hash, no index)."""
    path = dirpath / "core-1000"
    ours, raw, sliced = [], [], []
    fd = os.open(path / "log", os.O_RDONLY)
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # a second reference: what feedlog's get reads through
    with Core.open(path, writable=False) as core:
        rng = random.Random(1)
        for _ in range(rounds):
            seqs = [rng.randrange(core.length) for _ in range(gets // rounds)]
            where = [core._entry(s) for s in seqs]
            t = time.perf_counter()
            for s in seqs:
                core.get(s)
            ours.append(len(seqs) / (time.perf_counter() - t))
            t = time.perf_counter()
            for off, n, _ in where:
                os.pread(fd, n, off)
            raw.append(len(seqs) / (time.perf_counter() - t))
            t = time.perf_counter()
            for off, n, _ in where:
                mapped[off : off + n]
            sliced.append(len(seqs) / (time.perf_counter() - t))
    os.close(fd)
    ratio = statistics.median(a / b for a, b in zip(ours, raw, strict=True))
    return statistics.median(ours), statistics.median(raw), ratio, statistics.median(sliced)


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
    ap.add_argument("--rounds", type=int, default=5, help="rounds per row (medians reported)")
    ap.add_argument("--dir", help="where to write (default: a temp dir; use a real disk for fsync numbers)")
    ns = ap.parse_args()
    scale = 10 if ns.quick else 1
    n, size = 100_000 // scale, 100
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        only = set(ns.only or ("append", "get", "reopen", "feed-reopen"))
        if only & {"append", "get"}:
            appends(d, n, size, only, ns.rounds)
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


def appends(d: Path, n: int, size: int, only: set[str], rounds: int) -> None:
    if "append" in only:
        print(f"durable signed appends, {n:,} entries of {size} B (fsync per batch), median of {rounds} paired rounds")
        print(f"{'batch':>7} {'feedlog/s':>12} {'raw limit/s':>12} {'ratio':>6}")
    for batch in (1, 100, 1000) if "append" in only else (1000,):
        count = n if batch > 1 else n // 4  # one-per-call is fsync-bound; a quarter keeps the run short
        ours, raw, ratio = append_rounds(d, count, batch, size, rounds)
        if "append" in only:
            print(f"{batch:>7} {ours:>12,.0f} {raw:>12,.0f} {ratio:>6.2f}")
    if "append" in only:
        e = entry_appends(d, n, 100)
        print(f"protobuf Entry appends (timestamps exact), batch 100: {e:,.0f} entries/s")
    if "get" in only:
        feed_rate, raw_rate, ratio, slice_rate = random_gets(d, 20_000, rounds)
        print(
            f"random get, 20,000 seqs (hash-checked): {feed_rate:,.0f}/s; raw pread {raw_rate:,.0f}/s;"
            f" ratio {ratio:.2f} (median of {rounds} paired rounds); raw mmap slice {slice_rate:,.0f}/s"
        )


if __name__ == "__main__":
    main()
