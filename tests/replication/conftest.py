"""Real peers on 127.0.0.1 (port 0: the OS picks a free one), stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.replication.client import FeedClient
from feedlog_server.app import PeerServer

KP = KeyPair.from_seed(bytes([7]) * 32)
OTHER = KeyPair.from_seed(bytes([8]) * 32)


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[Callable[..., PeerServer]]:
    started: list[PeerServer] = []

    def start(name: str = "peer", **kw: Any) -> PeerServer:
        p = PeerServer(tmp_path / name, "127.0.0.1:0", **kw).start()
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop(grace=1)


@pytest.fixture
def clients() -> Iterator[Callable[[PeerServer], FeedClient]]:
    made: list[FeedClient] = []

    def make(peer: PeerServer, **kw: Any) -> FeedClient:
        """A client holding the peer's write token (pass token=None for a stranger)."""
        kw.setdefault("token", peer.token)
        c = FeedClient(peer.address, timeout=10, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def local_feed(path: Path, n: int = 0, batch: int = 10, kp: KeyPair = KP) -> Feed:
    """A feed written locally (the key holder's copy), with n entries in batches."""
    feed = Feed.create(path, key_pair=kp, timestamps="exact")
    for lo in range(1, n + 1, batch):
        feed.append([Write(f"/k{i}", f"value {i}".encode()) for i in range(lo, min(lo + batch, n + 1))])
    return feed


def same_state(a: Any, b: Any) -> bool:
    return (a.length, a.tree_hash, a.signature) == (b.length, b.tree_hash, b.signature)
