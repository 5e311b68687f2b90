"""The console's listener against clients that hold connections without asking anything: idle or
trickling sockets are closed at the head deadline, one address holds only its share, and a real
request is answered meanwhile (review: 8 idle sockets made every request a 503, for ever)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from feedlog.console.connections import per_client_cap
from feedlog.log.feed import Feed, Write
from feedlog.rpc import client_key
from tests.conftest import wait_until
from tests.scrape import closed_by_server

from .conftest import Console

HEAD_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("guarded")
    feed = Feed.create(tmp / "f", timestamps="exact")
    feed.append([Write(f"/k/{i}", b"v", False, None, None) for i in range(5)])
    feed.close()
    c = Console(
        ["--data", str(tmp / "f"), "--max-connections", str(MAX_CONNECTIONS), "--head-timeout", str(HEAD_TIMEOUT_S)]
    )
    try:
        yield c
    finally:
        err = c.close()
        assert "Traceback" not in err, err[-3000:]


def _open(c: Console, source: str) -> socket.socket:
    port = int(c.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def test_the_per_client_cap_never_gives_one_client_every_slot() -> None:
    assert per_client_cap(64, None) == 16
    assert per_client_cap(8, None) == 4
    assert per_client_cap(8, 100) == 4 and per_client_cap(64, 3) == 3
    assert per_client_cap(1, None) == 1 and per_client_cap(2, None) == 1
    assert client_key("10.0.0.1") == "10.0.0.1" and client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")


def test_one_client_holds_only_its_share_and_a_real_request_is_answered(guarded: Console) -> None:
    share = per_client_cap(MAX_CONNECTIONS, None)
    hostile = [_open(guarded, "127.0.0.2") for _ in range(MAX_CONNECTIONS)]
    try:
        wait_until(
            lambda: sum(closed_by_server(s) for s in hostile[share:]) == MAX_CONNECTIONS - share,
            what="the extra closed",
        )
        assert not any(closed_by_server(s) for s in hostile[:share])  # its share stays open (until the deadline)
        status, _, _ = guarded.get("/feeds")
        assert status == 200
    finally:
        for s in hostile:
            s.close()


def test_idle_and_trickling_connections_are_closed_at_the_head_deadline(guarded: Console) -> None:
    share = per_client_cap(MAX_CONNECTIONS, None)
    # every slot held, from several addresses: half idle, half trickling a request head
    hostile = [_open(guarded, f"127.0.0.{10 + i // share}") for i in range(MAX_CONNECTIONS)]
    idle, trickling = hostile[::2], hostile[1::2]
    head = b"GET /feeds HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
    stop = threading.Event()

    def trickle() -> None:
        for i in range(len(head)):
            if stop.wait(0.05):
                return
            for s in trickling:
                with contextlib.suppress(OSError):
                    s.send(head[i : i + 1])

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        wait_until(
            lambda: all(closed_by_server(s) for s in idle + trickling), timeout=HEAD_TIMEOUT_S * 6, what="the cut"
        )
        status, _, _ = guarded.get("/feeds")
        assert status == 200
    finally:
        stop.set()
        t.join(5)
        for s in hostile:
            s.close()


def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_head(guarded: Console) -> None:
    s = _open(guarded, "127.0.0.30")
    try:
        s.sendall(b"GET /feeds HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        s.settimeout(10)
        while b"</html>" not in got.lower():
            chunk = s.recv(65536)
            assert chunk, got[:200]
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
        s.sendall(b"G")  # a byte cancels uvicorn's keep-alive timer; the head deadline still runs
        wait_until(lambda: closed_by_server(s), timeout=HEAD_TIMEOUT_S * 6, what="the second head's deadline")
    finally:
        s.close()
