"""`feedlog serve` as its own process: SIGTERM mid-load loses no acknowledged put."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from feedlog.errors import FeedlogError
from feedlog.log.feed import Appended, Feed, Write
from feedlog.replication.client import FeedClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_sigterm_under_load_keeps_every_acknowledged_put(tmp_path: Path) -> None:
    port = free_port()
    token = "shutdown-test-token-0123456789"
    env = dict(os.environ, PYTHONUNBUFFERED="1", FEEDLOG_PEER_TOKEN=token)  # the peer's write token
    proc = subprocess.Popen(
        [sys.executable, "-m", "feedlog_server", "--data", str(tmp_path / "d"), "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 20
        client = FeedClient(f"127.0.0.1:{port}", timeout=5, token=token)
        while True:
            try:
                key = client.create(timestamps="exact").key
                break
            except FeedlogError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        acked: list[tuple[str, Future[Appended]]] = []
        stop = threading.Event()

        def load() -> None:
            with client.producer(key) as p:
                i = 0
                while not stop.is_set() and i < 200_000:
                    try:
                        acked.append((f"/k{i}", p.put(Write(f"/k{i}", b"v"))))
                    except FeedlogError:
                        return
                    i += 1
                    if i % 200 == 0:
                        time.sleep(0.001)

        t = threading.Thread(target=load)
        t.start()
        deadline = time.monotonic() + 20
        while sum(f.done() for _, f in acked[:2000]) < 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        stop.set()
        t.join(30)
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read() if proc.stderr else ""
    assert '"event":"signal"' in log and '"event":"stopped"' in log
    ok = {k: f.result().seq for k, f in acked if f.done() and f.exception() is None}
    assert len(ok) >= 1000
    with Feed.open(tmp_path / "d" / key.hex(), writable=False) as feed:
        for k, seq in ok.items():
            assert feed.record(seq).key == k  # acknowledged means durable, through the shutdown
