"""A console over real things: a local feed full of hostile keys and values, a feed on a real peer
(`feedlog serve` in process, on loopback), and a real table `feedlog ingest --engine local` wrote;
the console itself a real `python -m feedlog console` process on a free loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.log.feed import Feed, Write
from feedlog.replication.sync import push
from feedlog.rpc import Address

ROOT = Path(__file__).resolve().parents[2]

#: what a stranger writes to make a page run script or lie about what it shows
HOSTILE_KEY = "<script>window.__pwned=1</script>"
HOSTILE_VALUE = '"onmouseover="window.__pwned=2" x="<img src=x onerror=window.__pwned=3>'
BIDI_KEY = "invoice\u202egpj.exe"
CONTROL_VALUE = "red\x1b[31m\x07bell\x00nul"


@dataclass
class World:
    feed: Path  # local, hostile
    peer_feed: Path  # pushed to the peer
    peer_url: str
    table: Path
    tmp: Path


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    capsys.readouterr()
    code = main([*args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    return json.loads(lines[0]) if len(lines) == 1 else [json.loads(x) for x in lines]


def make_world(tmp: Path) -> World:
    feed = Feed.create(tmp / "feeds" / "hostile", timestamps="truncate:1m")
    feed.append(
        [
            Write(HOSTILE_KEY, HOSTILE_VALUE.encode(), False, None, None),
            Write(BIDI_KEY, CONTROL_VALUE.encode(), False, None, None),
            Write("/cfg/mode", b"fast", False, None, None),
            Write("/cfg/mode", b"slow", False, None, None),
        ]
    )
    feed.put("/cfg/secret", b"s3cr3t")
    feed.forget("/cfg/secret")  # clears the earlier payload: shown as cleared, the key as forgotten
    feed.delete("/cfg/mode")
    for i in range(60):  # more than one page
        feed.put(f"/reading/{i}", f"{20 + i % 7}.5".encode())
    feed.close()
    sensor = Feed.create(tmp / "peer-src" / "sensor", timestamps="exact")
    sensor.append([Write(f"/s/{i}", f"v{i}".encode(), False, None, None) for i in range(30)])
    sensor.close()
    assert main(["ingest", "--engine", "local", str(tmp / "feeds" / "hostile"), str(tmp / "table"), "--json"]) == 0
    return World(tmp / "feeds" / "hostile", tmp / "peer-src" / "sensor", "", tmp / "table", tmp)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from feedlog_server.app import PeerServer

    tmp = tmp_path_factory.mktemp("console")
    w = make_world(tmp)
    peer = PeerServer(tmp / "peer").start()
    try:
        push(w.peer_feed, Address.parse(f"grpc://{peer.address}"), token=peer.token)
        key = (w.peer_feed / "key").read_bytes().hex()
        w.peer_url = f"grpc://{peer.address}/{key}"
        yield w
    finally:
        peer.stop(0)


class Console:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "feedlog", "console", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the console prints its address once it is bound
        if "serving" not in line:
            self.proc.kill()
            raise AssertionError(
                f"console did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        self.url = line.split(" at ", 1)[1].split()[0].rstrip("/")

    def get(
        self, path: str, method: str = "GET", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def close(self) -> str:
        self.proc.terminate()
        try:
            _out, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, err = self.proc.communicate()
        return err


@pytest.fixture(scope="module")
def console(world: World) -> Iterator[Console]:
    c = Console(["--data", str(world.feed.parent), "--peer", world.peer_url, "--table", str(world.table)])
    try:
        yield c
    finally:
        err = c.close()
        assert "Traceback" not in err, err[-3000:]
