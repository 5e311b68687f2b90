"""One real local Spark session for the whole run; feeds, peers and owners are real too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write

KEY_A = KeyPair.from_seed(bytes([21]) * 32)
KEY_B = KeyPair.from_seed(bytes([22]) * 32)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from feedlog.lake import spark_session

    s = spark_session("local[2]", "feedlog-tests")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


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
