"""Reading ahead (clone, pull): the next messages arrive while the caller stores the last, over a real peer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.errors import InvalidArgument
from feedlog.log.feed import Feed
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone, push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

from .conftest import local_feed, same_state

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]


def hosted(peers: Peers, tmp_path: Path, n: int) -> tuple[PeerServer, bytes]:
    a = peers("a")
    with local_feed(tmp_path / "author", n=n, batch=50) as author:
        push(tmp_path / "author", Address(a.address), token=a.token)
        return a, author.key


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "read-ahead"]


def test_the_same_messages_with_and_without_read_ahead(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    a, key = hosted(peers, tmp_path, 3000)
    c = clients(a)
    small = 4096  # many messages: the read-ahead queue fills and drains
    plain = [m.SerializeToString() for m in c.read(key, 1, with_roots=True, max_message_bytes=small)]
    ahead = [m.SerializeToString() for m in c.read(key, 1, with_roots=True, max_message_bytes=small, ahead=2)]
    assert len(plain) > 20 and ahead == plain


def test_a_reader_that_stops_early_ends_the_call_and_the_thread(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    a, key = hosted(peers, tmp_path, 3000)
    c = clients(a)
    before = len(ahead_threads())
    stream = c.read(key, 1, max_message_bytes=4096, ahead=2)
    next(stream)
    time.sleep(0.2)  # the thread has filled its queue and waits for room
    assert len(ahead_threads()) == before + 1
    stream.close()  # type: ignore[attr-defined]  # a generator
    deadline = time.monotonic() + 10
    while len(ahead_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ahead_threads()) == before


def test_an_error_arrives_after_the_messages_before_it(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    a, key = hosted(peers, tmp_path, 10)
    with pytest.raises(InvalidArgument, match="does not fit the feed"):
        list(clients(a).read(key, 5, 99, ahead=2))


def test_a_clone_reading_ahead_is_the_peer_s_feed(peers: Peers, tmp_path: Path) -> None:
    a, key = hosted(peers, tmp_path, 5000)
    assert clone(Address(a.address, key.hex()), tmp_path / "copy").length == 5001
    with Feed.open(tmp_path / "copy", writable=False) as copy, Feed.open(tmp_path / "author", writable=False) as author:
        assert same_state(copy.core.state, author.core.state)
        assert copy.verify().length == 5001
