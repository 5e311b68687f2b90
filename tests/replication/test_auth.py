"""Who may write to a peer (issue 13, items 13 and 14): tokens, client certificates, new feeds, rate limits."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from feedlog.cli import main
from feedlog.cli.remote import warn_if_clear
from feedlog.errors import (
    FeedlogError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import push
from feedlog.rpc import Address, Tls
from feedlog_server.app import PeerServer, ServerTls
from feedlog_server.auth import Rate, RateLimiter
from feedlog_server.rpc import is_loopback, require_tls_off_loopback

from .certs import make_pki
from .conftest import KP, OTHER, local_feed
from .test_shutdown import free_port

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]
TOKEN = "a-write-token-for-tests-0123456789"


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_stranger_cannot_put_create_or_stream(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    key = clients(a).create(timestamps="exact").key
    clients(a).put(key, [Write("/mine", b"1")])
    stranger = clients(a, token=None)
    with pytest.raises(Unauthenticated, match="Put needs a write token"):
        stranger.put(key, [Write("/x", b"1")])
    with pytest.raises(Unauthenticated, match="Create needs"):
        stranger.create()
    with stranger.producer(key) as p, pytest.raises(Unauthenticated, match="PutStream needs"):
        p.put(Write("/y", b"1")).result(5)  # the stream is refused as it opens: put() or its future raises
    impostor = clients(a, token="not-the-token-of-this-peer")
    with pytest.raises(PermissionDenied, match="not valid") as e:
        impostor.put(key, [Write("/z", b"1")])
    assert not isinstance(e.value, Unauthenticated)  # a wrong token is told apart from none
    with pytest.raises(PermissionDenied):
        impostor.create()
    # on the wire: UNAUTHENTICATED without credentials, PERMISSION_DENIED with wrong ones
    stub = stranger.stub
    put = pb.PutRequest(feed=key, entries=[pb.Put(key="/w", value=b"1")])
    assert code_of(lambda: stub.Put(put, timeout=5))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: stub.Create(pb.CreateRequest(), timeout=5))[0] == grpc.StatusCode.UNAUTHENTICATED
    bad = (("authorization", "Bearer nope-nope-nope-nope"),)
    assert code_of(lambda: stub.Put(put, timeout=5, metadata=bad))[0] == grpc.StatusCode.PERMISSION_DENIED
    basic = (("authorization", "Basic dXNlcjpwYXNz"),)
    status, detail = code_of(lambda: stub.Put(put, timeout=5, metadata=basic))
    assert status == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in detail
    # nothing a refused call sent was stored, and no feed was created
    hf = a.host.get(key)
    assert hf.feed.length == 2 and len(a.host) == 1
    # the key holder's token still writes
    assert clients(a).put(key, [Write("/ok", b"1")])[0].seq == 2


def test_a_stranger_cannot_create_feeds_by_append_unless_the_peer_accepts_new(
    peers: Peers, clients: Clients, tmp_path: Path
) -> None:
    a = peers("a")
    local_feed(tmp_path / "f", n=5).close()
    with pytest.raises(Unauthenticated, match="--accept-new"):
        push(tmp_path / "f", Address(a.address))
    assert len(a.host) == 0 and not (tmp_path / "a" / KP.public_key.hex()).exists()
    # an authenticated principal may push new feeds
    assert push(tmp_path / "f", Address(a.address), token=a.token).length == 6
    # a signed append to a hosted feed is authenticated by its signature: strangers may extend it
    with Feed.open(tmp_path / "f") as f:
        f.append([Write("/more", b"1")])
    assert push(tmp_path / "f", Address(a.address)).blocks == 1
    # a peer started with accept_new takes a stranger's new feed (its signature checked as ever)
    b = peers("b", accept_new=True)
    local_feed(tmp_path / "g", n=2, kp=OTHER).close()
    assert push(tmp_path / "g", Address(b.address)).length == 3


def test_strangers_pushes_create_feeds_only_up_to_max_feeds(peers: Peers, tmp_path: Path) -> None:
    # before: every anonymous push to an --accept-new peer kept a new feed open (~3 file descriptors)
    # for as long as the peer ran, so one client's pushes ran it out of descriptors
    a = peers("a", accept_new=True, max_feeds=2)
    for i in range(2):
        local_feed(tmp_path / f"f{i}", n=1, kp=KeyPair.from_seed(bytes([40 + i]) * 32)).close()
        assert push(tmp_path / f"f{i}", Address(a.address)).length == 2
    third = KeyPair.from_seed(bytes([42]) * 32)
    local_feed(tmp_path / "f2", n=1, kp=third).close()
    with pytest.raises(ResourceExhausted, match="--max-feeds 2"):
        push(tmp_path / "f2", Address(a.address))
    assert len(a.host) == 2 and not (tmp_path / "a" / third.public_key.hex()).exists()
    # a writer with a token still creates feeds; strangers still extend the feeds hosted
    assert push(tmp_path / "f2", Address(a.address), token=a.token).length == 2
    with Feed.open(tmp_path / "f0") as f:
        f.append([Write("/more", b"1")])
    assert push(tmp_path / "f0", Address(a.address)).blocks == 1


def test_concurrent_strangers_pushes_do_not_overshoot_max_feeds(peers: Peers, tmp_path: Path) -> None:
    a = peers("a", accept_new=True, max_feeds=3)
    for i in range(10):
        local_feed(tmp_path / f"f{i}", n=1, kp=KeyPair.from_seed(bytes([60 + i]) * 32)).close()

    def one(i: int) -> str:
        try:
            push(tmp_path / f"f{i}", Address(a.address))
            return "ok"
        except ResourceExhausted:
            return "full"

    with ThreadPoolExecutor(10) as pool:
        outcomes = list(pool.map(one, range(10)))
    assert outcomes.count("ok") == 3 and outcomes.count("full") == 7, outcomes
    assert len(a.host) == 3


def test_an_os_error_in_a_handler_is_a_clear_status_without_server_paths(
    peers: Peers, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: an OSError (out of file descriptors, disk full) escaped the handlers, and gRPC answered
    # UNKNOWN with "Exception calling application: [Errno 24] Too many open files: '<a server path>'"
    a = peers("a")
    c = clients(a)
    key = c.create(timestamps="exact").key

    def out_of_files(*_: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files", "/srv/secret/feeds")

    monkeypatch.setattr(a.host, "get", out_of_files)
    with pytest.raises(ResourceExhausted, match="run out of open files") as unary_call:
        c.info(key)  # a unary call
    with pytest.raises(ResourceExhausted, match="run out of open files") as stream:
        list(c.read(key, 0))  # a stream
    assert "/srv/secret" not in str(unary_call.value) + str(stream.value)

    def failing(*_: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/srv/secret/feeds")

    monkeypatch.setattr(a.host, "get", failing)  # not a limit: perhaps a bug, so not retried
    with pytest.raises(FeedlogError, match="internal error in GetInfo: Permission denied") as internal:
        c.info(key)
    assert not isinstance(internal.value, Unavailable) and "/srv/secret" not in str(internal.value)


def test_the_generated_token_is_private_logged_by_path_and_kept(
    peers: Peers, clients: Clients, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        a = peers("a")
    assert a.token and a.token_file == tmp_path / "a" / "_peer" / "write-token"
    assert stat.S_IMODE(a.token_file.stat().st_mode) == 0o600
    assert a.token_file.read_text().strip() == a.token
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert str(a.token_file) in logged and a.token not in logged
    key = clients(a).create().key
    token = a.token
    a.stop(grace=0)
    again = peers("a")  # same data directory: the same token, the same feeds
    assert again.token == token and len(again.host) == 1
    assert clients(again).put(key, [Write("/k", b"v")])[0].seq == 1


def test_configured_tokens_are_held_hashed(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    hashed = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
    a = peers("a", write_tokens=[hashed, "another-token-of-this-peer-42"])
    assert a.token is None and not (tmp_path / "a" / "_peer").exists()  # nothing generated
    assert clients(a, token=TOKEN).create().key
    assert clients(a, token="another-token-of-this-peer-42").create().key
    with pytest.raises(PermissionDenied):
        clients(a, token=hashed).create()  # the hash is not the token
    with pytest.raises(InvalidArgument, match="16 printable"):
        PeerServer(tmp_path / "x", write_tokens=["short"]).start()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_a_client_certificate_authenticates_writes(peers: Peers, pki, tmp_path: Path) -> None:
    tls = ServerTls(pki.server_cert.read_bytes(), pki.server_key.read_bytes(), pki.ca.read_bytes())
    m = peers("m", tls=tls)
    assert m.token is None  # client certificates authenticate: no token generated
    mine = Tls.from_files(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    with FeedClient(m.address, tls=mine, timeout=5) as c:
        key = c.create(timestamps="exact").key
        assert c.put(key, [Write("/k", b"v")])[0].seq == 1
        local_feed(tmp_path / "f", n=3).close()
        assert push(tmp_path / "f", Address(m.address), tls=mine).length == 4  # a new feed, pushed


def test_rate_limits_trip_with_retry_advice(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    a = peers("a", write_tokens=[TOKEN, TOKEN + "-2"], write_rate=Rate(1, 5), create_rate=Rate(0.1, 2))
    c = clients(a, token=TOKEN)
    key = c.create().key  # one write, one creation
    for i in range(4):
        c.put(key, [Write(f"/k{i}", b"v")])
    with pytest.raises(ResourceExhausted, match=r"write rate limit.*retry in") as e:
        c.put(key, [Write("/over", b"v")])
    assert 0 < e.value.retry_after <= 1.0
    assert a.host.get(key).feed.length == 5  # header + 4 puts; the refused one left no trace
    status, _ = code_of(
        lambda: c.stub.Put(pb.PutRequest(feed=key, entries=[pb.Put(key="/r", value=b"v")]), timeout=5, metadata=c.auth)
    )
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
    # another principal has its own bucket
    other = clients(a, token=TOKEN + "-2")
    assert other.put(key, [Write("/other", b"v")])[0].seq == 5
    other.create()
    other.create()  # a burst of 2
    with pytest.raises(ResourceExhausted, match="feed creation rate limit"):
        other.create()
    # strangers pushing new feeds on an accept_new peer are limited per address
    b = peers("b", accept_new=True, create_rate=Rate(0.1, 2))
    feeds = []
    for n in range(3):
        local_feed(tmp_path / f"s{n}", n=1, kp=_kp(n)).close()
        feeds.append(tmp_path / f"s{n}")
    push(feeds[0], Address(b.address))
    push(feeds[1], Address(b.address))
    with pytest.raises(ResourceExhausted):
        push(feeds[2], Address(b.address))
    assert len(b.host) == 2


def _kp(n: int):
    from feedlog.log.crypto import KeyPair

    return KeyPair.from_seed(bytes([40 + n]) * 32)


def test_token_buckets_refill_and_stay_bounded() -> None:
    now = [0.0]
    lim = RateLimiter(Rate(2, 3), "write", clock=lambda: now[0])
    for _ in range(3):
        lim.charge("a")
    with pytest.raises(ResourceExhausted) as e:
        lim.charge("a")
    assert e.value.retry_after == pytest.approx(0.5)
    lim.charge("b")  # its own bucket
    now[0] = 0.5
    lim.charge("a")  # refilled one
    with pytest.raises(ResourceExhausted):
        lim.charge("a")
    for i in range(5000):
        lim.charge(f"c{i}")
    assert len(lim._buckets) <= 4096
    assert Rate.parse("10/min") == Rate(10 / 60, 1) and Rate.parse("100/s,500") == Rate(100, 500)
    with pytest.raises(InvalidArgument):
        Rate.parse("lots")


def test_plaintext_only_on_loopback_unless_insecure() -> None:
    for listen in ("127.0.0.1:7000", "localhost:1", "[::1]:7000", "127.9.9.9:1"):
        assert is_loopback(listen)
        require_tls_off_loopback(listen, None, False)
    for listen in ("0.0.0.0:7000", "[::]:1", ":7000", "10.1.2.3:7000", "peer.example.com:7000"):
        assert not is_loopback(listen)
        with pytest.raises(InvalidArgument, match="--insecure"):
            require_tls_off_loopback(listen, None, False)
        require_tls_off_loopback(listen, None, True)
        require_tls_off_loopback(listen, object(), False)


# ---- the CLI ---------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_take_the_token_from_a_file_or_the_environment(
    peers: Peers, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = peers("a")
    url = f"grpc://{a.address}"
    monkeypatch.delenv("FEEDLOG_PEER_TOKEN", raising=False)
    code, _, err = run(capsys, "create", url)
    assert code == 7 and err.count("\n") == 1 and "write token" in err and "Traceback" not in err
    code, out, err = run(capsys, "create", url, "--json", "--token-file", str(a.token_file))
    assert code == 0, err
    feed = f"{url}/{json.loads(out)['key']}"
    code, _, err = run(capsys, "put", feed, "/a", "1", "--token-file", str(tmp_path / "missing"))
    assert code == 2 and "cannot read token file" in err
    code, _, err = run(capsys, "put", feed, "/a", "1", "--token", "wrong-token-wrong-token")
    assert code == 7 and "visible" in err and "not valid" in err
    monkeypatch.setenv("FEEDLOG_PEER_TOKEN", a.token or "")
    code, out, err = run(capsys, "put", feed, "/a", "1")
    assert code == 0 and out.startswith("1\t") and err == ""
    assert run(capsys, "del", feed, "/a")[0] == 0
    local_feed(tmp_path / "f", n=2).close()
    assert run(capsys, "push", str(tmp_path / "f"), url)[0] == 0
    monkeypatch.delenv("FEEDLOG_PEER_TOKEN")
    local_feed(tmp_path / "g", n=2, kp=OTHER).close()
    code, _, err = run(capsys, "push", str(tmp_path / "g"), url)
    assert code == 7 and "--accept-new" in err


def test_cli_warns_before_sending_a_token_in_the_clear(capsys: pytest.CaptureFixture[str]) -> None:
    warn_if_clear("10.0.0.7:7000", None, TOKEN)
    assert "without TLS" in capsys.readouterr().err
    for target, tls, token in (
        ("127.0.0.1:7000", None, TOKEN),
        ("10.0.0.7:7000", Tls(b"a CA"), TOKEN),
        ("h:1", None, None),
    ):
        warn_if_clear(target, tls, token)
        assert capsys.readouterr().err == ""


def test_cli_serve_refuses_plaintext_beyond_loopback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "serve", "--data", str(tmp_path / "d"), "--listen", f"0.0.0.0:{free_port()}")
    assert code == 2 and err.count("\n") == 1 and "--insecure" in err and "TLS" in err
    assert not (tmp_path / "d").exists()
    code, _, err = run(capsys, "serve", "--data", str(tmp_path / "d"), "--write-rate", "fast")
    assert code == 2 and "rate" in err
    # a --listen without its port is told so, not taken for an address beyond this machine
    for cmd in (["serve", "--data", str(tmp_path / "d")], ["owner", "serve", "--db", str(tmp_path / "o.db")]):
        code, _, err = run(capsys, *cmd, "--listen", "127.0.0.1")
        assert code == 2 and "expected HOST:PORT" in err and "--insecure" not in err, err
    assert not (tmp_path / "d").exists() and not (tmp_path / "o.db").exists()


@pytest.mark.slow
def test_feedlog_serve_writes_its_token_to_a_private_file_and_logs_where(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FEEDLOG_PEER_TOKEN"} | {"PYTHONUNBUFFERED": "1"}
    data = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        token_file = data / "_peer" / "write-token"
        deadline = time.monotonic() + 20
        key = None
        while key is None:
            try:
                with FeedClient(f"127.0.0.1:{port}", timeout=2, token=token_file.read_text().strip()) as c:
                    key = c.create().key
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read() if proc.stderr else ""
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert '"event":"write_token"' in log and str(token_file) in log and token not in log


def serve(data: Path, port: int, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", f"127.0.0.1:{port}", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FEEDLOG_PEER_TOKEN"} | {"PYTHONUNBUFFERED": "1"} | env,
    )


def create_when_up(target: str, token: str, deadline: float) -> bytes:
    while True:
        try:
            with FeedClient(target, timeout=2, token=token) as c:
                return bytes(c.create().key)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.slow
def test_feedlog_serve_takes_tokens_from_a_file_of_hashes_and_the_environment(tmp_path: Path) -> None:
    port = free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the writers of this peer\nsha256:{hashlib.sha256(TOKEN.encode()).hexdigest()}\n\n")
    proc = serve(tmp_path / "d", port, "--write-token-file", str(tokens), env={"FEEDLOG_PEER_TOKEN": TOKEN + "-env"})
    try:
        target = f"127.0.0.1:{port}"
        assert create_when_up(target, TOKEN, time.monotonic() + 20)
        with FeedClient(target, timeout=5, token=TOKEN + "-env") as c:
            assert c.create().key
        hashed = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
        with FeedClient(target, timeout=5, token=hashed) as c, pytest.raises(PermissionDenied):
            c.create()  # the hash is not the token
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "d" / "_peer").exists()  # configured tokens: nothing generated
