"""Feeds for the lake tests (the one Spark session of the run is in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write

KEY_A = KeyPair.from_seed(bytes([21]) * 32)
KEY_B = KeyPair.from_seed(bytes([22]) * 32)


def make_feed(path: Path, n: int, *, kp: KeyPair = KEY_A, batch: int = 100, ttl: str | None = None) -> Feed:
    """A feed with entries 1..n in signed batches of `batch` (exact timestamps)."""
    feed = Feed.create(path, key_pair=kp, timestamps="exact", ttl=ttl)
    append(feed, n, batch=batch)
    return feed


def append(feed: Feed, n: int, *, batch: int = 100, ttl: int | None = None) -> None:
    start = feed.length
    for lo in range(start, start + n, batch):
        hi = min(lo + batch, start + n)
        feed.append([Write(f"/k{i % 17}", f"value {i}".encode(), ttl_ms=ttl) for i in range(lo, hi)])
