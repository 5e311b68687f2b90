"""A peer's `/metrics`, scraped over HTTP and parsed by Prometheus' text parser: the counters move by
exactly the traffic a test makes, a follower's lag falls to 0 once it catches up, strangers' names
never become label values, and the listener keeps to the rule of every feedlog listener."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from feedlog.errors import InvalidArgument, ResourceExhausted, Unauthenticated
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Write
from feedlog.metrics import MAX_PER_CLIENT, MAX_SCRAPERS, MetricsListener, MetricsSettings, check_exposure, new_registry
from feedlog.pb import feeds_pb2
from feedlog.replication.client import FeedClient
from feedlog.rpc import Address
from feedlog_server.app import SERVICE, PeerServer
from feedlog_server.host import FeedHost
from feedlog_server.rpc import rpc_handler
from feedlog_server.serve import main as serve_main
from feedlog_server.service import FeedsService
from tests.conftest import wait_until
from tests.replication.certs import make_pki
from tests.replication.conftest import KP, local_feed
from tests.scrape import closed_by_server, label_values, scrape, total, value

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]
LOOPBACK = MetricsSettings("127.0.0.1:0")


def url_of(peer: PeerServer) -> str:
    assert peer.metrics_listener is not None
    return str(peer.metrics_listener.url)


def feeds(method: str, code: str | None = None, kind: str = "unary") -> dict[str, str]:
    labels = {"grpc_service": SERVICE, "grpc_method": method, "grpc_type": kind}
    return labels if code is None else {**labels, "grpc_code": code}


def test_counters_move_by_exactly_the_traffic_made(peers: Peers, clients: Clients) -> None:
    p = peers(metrics=LOOPBACK)
    before = scrape(url_of(p))
    assert value(before, "grpc_server_started_total", **feeds("Put")) == 0  # known methods start at 0
    c = clients(p)
    key = c.create().key
    for n in (2, 1, 4):
        c.put(key, [Write(f"/k{n}/{i}", b"v") for i in range(n)])
    c.info(key)
    with pytest.raises(Unauthenticated):
        clients(p, token=None).put(key, [Write("/x", b"stranger")])  # refused: no token
    read = list(c.read(key, 0))  # a server stream
    s = scrape(url_of(p))

    assert value(s, "grpc_server_started_total", **feeds("Put")) == 4
    assert value(s, "grpc_server_handled_total", **feeds("Put", "OK")) == 3
    assert value(s, "grpc_server_handled_total", **feeds("Put", "Unauthenticated")) == 1
    assert value(s, "grpc_server_handling_seconds_count", **feeds("Put")) == 4
    assert value(s, "grpc_server_msg_received_total", **feeds("Put")) == 4
    assert value(s, "grpc_server_msg_sent_total", **feeds("Put")) == 3  # a refused call sends no message
    assert value(s, "grpc_server_handled_total", **feeds("Create", "OK")) == 1
    assert value(s, "grpc_server_handled_total", **feeds("GetInfo", "OK")) == 1
    assert value(s, "grpc_server_handled_total", **feeds("Read", "OK", "server_stream")) == 1
    assert value(s, "grpc_server_msg_sent_total", **feeds("Read", kind="server_stream")) == len(read) >= 1

    feed = key.hex()
    assert value(s, "feedlog_put_entries_total", feed=feed) == 7
    assert value(s, "feedlog_group_commits_total", feed=feed) == 3  # one caller at a time: a group each
    assert value(s, "feedlog_group_commit_entries_count") == 3
    assert value(s, "feedlog_group_commit_entries_sum") == 7
    assert value(s, "feedlog_group_commit_seconds_count") == 3
    assert value(s, "feedlog_fsync_seconds_count") == 3  # one fdatasync per group
    assert value(s, "feedlog_feed_blocks", feed=feed) == 8  # the header and 7 entries
    assert value(s, "feedlog_feed_bytes", feed=feed) == p.host.get(key).feed.core.byte_length
    assert value(s, "feedlog_feeds_hosted", role="owned") == 1
    assert value(s, "feedlog_feeds_hosted", role="replica") == 0
    assert value(s, "feedlog_streams_open") == 0
    assert value(s, "feedlog_streams_refused_total", reason="server_full") == 0

    # a second scrape sees only what happened since: nothing
    again = scrape(url_of(p))
    assert value(again, "grpc_server_started_total", **feeds("Put")) == 4
    assert value(again, "feedlog_put_entries_total", feed=feed) == 7


def test_refused_streams_are_counted_with_their_reason(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    local_feed(tmp_path / "p" / "f", n=3).close()
    p = peers("p", metrics=LOOPBACK, max_streams=1)
    c = clients(p)
    held = c.subscribe(KP.public_key, 0)
    next(iter(held))  # the one stream slot is taken once a message came back
    try:
        wait_until(lambda: value(scrape(url_of(p)), "feedlog_streams_open") == 1, what="the stream to count")
        with pytest.raises(ResourceExhausted):
            list(c.read(KP.public_key, 0))
        s = scrape(url_of(p))
    finally:
        held.cancel()
    assert value(s, "feedlog_streams_refused_total", reason="client_share") == 1
    assert value(s, "feedlog_streams_refused_total", reason="server_full") == 0
    assert value(s, "feedlog_streams_limit") == 1
    assert value(s, "grpc_server_handled_total", **feeds("Read", "ResourceExhausted", "server_stream")) == 1
    wait_until(
        lambda: (
            value(scrape(url_of(p)), "grpc_server_handled_total", **feeds("Subscribe", "Canceled", "server_stream"))
            == 1
        ),
        what="the cancelled subscription to be counted",
    )
    wait_until(lambda: value(scrape(url_of(p)), "feedlog_streams_open") == 0, what="the stream slot to free")


def test_a_strangers_method_and_feed_names_never_become_label_values(peers: Peers, clients: Clients) -> None:
    p = peers(metrics=LOOPBACK)
    stranger = KeyPair.generate().public_key
    evil = "/evil.Service/<script>alert(1)</script>"
    with grpc.insecure_channel(p.address) as ch:
        call = ch.unary_unary(evil, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x00")
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        also = ch.unary_unary("/feedlog.feeds.Feeds/NoSuchMethod")
        with pytest.raises(grpc.RpcError):
            also(b"")
    c = clients(p, token=None)
    with pytest.raises(Exception, match="does not host"):
        c.info(stranger)
    with pytest.raises(Unauthenticated):
        c.append(stranger, 0, [b"header"], b"\x00" * 64)  # a push of a feed this peer does not take
    s = scrape(url_of(p))
    values = label_values(s)
    assert not [v for v in values if "evil" in v or "script" in v or "NoSuch" in v]
    assert stranger.hex() not in values
    assert value(s, "grpc_server_handled_total", grpc_service="unknown", grpc_method="unknown", grpc_type="unknown",
                 grpc_code="Unimplemented") == 2  # fmt: skip
    assert value(s, "grpc_server_handled_total", **feeds("GetInfo", "NotFound")) == 1
    assert total(s, "feedlog_feed_blocks") == 0  # no feed was created by any of it


def test_follower_lag_shows_what_it_could_not_verify_and_falls_to_zero_once_caught_up(
    peers: Peers, tmp_path: Path
) -> None:
    local_feed(tmp_path / "up" / "f", n=30, batch=10).close()
    tampering = threading.Event()
    tampering.set()

    class Tampering(FeedsService):  # type: ignore[misc]
        def Subscribe(self, request: Any, context: Any) -> Iterator[Any]:
            for raw in super().Subscribe(request, context):
                resp = feeds_pb2.ReadResponse.FromString(raw)
                for seg in resp.segments:
                    for k in range(len(seg.blocks)):
                        if tampering.is_set() and seg.start + k == 15:
                            seg.blocks[k] = seg.blocks[k].replace(b"value", b"VALUE")
                yield resp

    host = FeedHost(tmp_path / "up")
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((rpc_handler(Tampering(host), feeds_pb2, "Feeds"),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    feed = KP.public_key.hex()
    try:
        b = peers("b", metrics=LOOPBACK, follow=[Address(f"127.0.0.1:{port}", feed)])
        wait_until(lambda: b.followers[0].rejections >= 1, what="a rejection")
        s = scrape(url_of(b))
        # the upstream signed 31 blocks; 11 verified (the header batch and the first batch of 10)
        assert value(s, "feedlog_follow_entries_behind", feed=feed) == 20
        assert (value(s, "feedlog_follow_rejected_batches_total", feed=feed) or 0) >= 1
        assert value(s, "feedlog_feed_blocks", feed=feed) == 11
        assert value(s, "feedlog_feeds_hosted", role="replica") == 1
        tampering.clear()  # the upstream serves the true blocks from now on
        wait_until(
            lambda: value(scrape(url_of(b)), "feedlog_follow_entries_behind", feed=feed) == 0,
            timeout=20,
            what="the lag to fall to 0",
        )
        s = scrape(url_of(b))
        assert value(s, "feedlog_feed_blocks", feed=feed) == 31
        assert value(s, "feedlog_follow_connected", feed=feed) == 1
        age = value(s, "feedlog_follow_seconds_since_verified_batch", feed=feed)
        assert age is not None and 0 <= age < 20
        assert value(s, "feedlog_fsync_seconds_count") >= 2  # type: ignore[operator]  # replicated batches fsync
    finally:
        server.stop(0)
        host.close()


def test_compaction_work_is_counted(peers: Peers, clients: Clients) -> None:
    p = peers(metrics=LOOPBACK, compact_every=0)
    c = clients(p)
    key = c.create().key
    c.put(key, [Write(f"/k{i}", b"v") for i in range(5)])
    assert p.compactor is not None
    report = p.compactor.run_once()
    s = scrape(url_of(p))
    assert value(s, "feedlog_compaction_passes_total") == 1
    assert value(s, "feedlog_compaction_entries_read_total") == report.entries == 6
    assert value(s, "feedlog_compaction_entries_cleared_total") == 0  # nothing had expired


# ---- the listener --------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:9464", "[::]:9464", "192.0.2.1:9464", ":9464", "metrics.example:9464"])
def test_a_listener_beyond_loopback_without_tls_is_refused_in_one_line(
    listen: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve_main(["--data", str(tmp_path / "d"), "--metrics-listen", listen])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"feedlog: error: --metrics-listen {listen} is reachable from other machines: serve HTTPS")
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_the_rule_beyond_loopback_is_tls_and_a_token() -> None:
    token = (b"\x01" * 32,)
    check_exposure(MetricsSettings("127.0.0.1:9464"))
    check_exposure(MetricsSettings("[::1]:9464"))
    check_exposure(MetricsSettings("0.0.0.0:9464", "c.pem", "k.pem", token))
    check_exposure(MetricsSettings("0.0.0.0:9464", token_hashes=token, insecure=True))  # serve's --insecure
    for bad, why in [
        (MetricsSettings("0.0.0.0:9464", "c.pem", "k.pem"), "token"),
        (MetricsSettings("0.0.0.0:9464", token_hashes=token), "HTTPS"),
        (MetricsSettings("0.0.0.0:9464", insecure=True), "token"),
        (MetricsSettings("127.0.0.1:9464", "c.pem"), "go together"),
        (MetricsSettings("127.0.0.1"), "HOST:PORT"),
        (MetricsSettings("127.0.0.1:99999"), "HOST:PORT"),
    ]:
        with pytest.raises(InvalidArgument, match=why):
            check_exposure(bad)


def test_a_token_and_tls_guard_the_scrape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path)
    token = "scrape-token-0123456789"
    registry = new_registry()
    settings = MetricsSettings(
        "127.0.0.1:0",
        str(pki.server_cert),
        str(pki.server_key),
        (__import__("hashlib").sha256(token.encode()).digest(),),
    )
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    with MetricsListener(registry, settings) as m:
        assert m.url.startswith("https://127.0.0.1:")
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(m.url, context=ctx)
        assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(m.url, token="not-the-token-at-all", context=ctx)
        assert e.value.code == 401
        allowed = scrape(m.url, token=token, context=ctx)  # the process's own families, and nothing else
        assert (value(allowed, "process_open_fds") or 0) > 0
        assert {name.split("_")[0] for name, _ in allowed} <= {"process", "python"}
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(m.url.replace("/metrics", "/other"), token=token, context=ctx)
        assert e.value.code == 404
        with pytest.raises(OSError):  # plaintext HTTP to the HTTPS listener: no answer (reset)
            scrape(m.url.replace("https://", "http://"), token=token)


def test_the_cli_serves_metrics_and_says_where(tmp_path: Path) -> None:
    """`serve --metrics-listen` as an operator runs it: its own process, stopped by SIGTERM (in-process,
    serve_forever's exit watchdog would end the test run)."""
    with socket.socket() as probe:  # a free port for the listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--compact-every", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "feedlog_server", *args, "--metrics-listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the listener answers first (a taken port fails before any feed opens); the peer's families
        # join once its feeds are open
        wait_until(
            lambda: (
                proc.poll() is None and _answers(url) and value(scrape(url), "feedlog_feeds_hosted", role="owned") == 0
            ),
            what="the peer's metrics",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    serving = [json.loads(line) for line in err.splitlines() if '"event":"serving"' in line]
    assert serving and serving[0]["metrics"] == url


def _answers(url: str) -> bool:
    try:
        scrape(url)
        return True
    except OSError:
        return False


def _hostile(port: int, source: str) -> socket.socket:
    """A connection to the listener from `source` (any 127.0.0.0/8 address is this machine's loopback)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.sendall(b"G")
    return s


def test_trickling_clients_are_cut_at_the_deadline_and_one_client_cannot_hold_every_thread() -> None:
    """Review: settimeout bounded the gap between bytes, so a byte every few seconds held a thread for
    ever, and four such clients held them all before the token check."""
    deadline_s = 1.0
    with MetricsListener(new_registry(), MetricsSettings("127.0.0.1:0", deadline_s=deadline_s)) as m:
        # one client opens more connections than it may hold: those beyond MAX_PER_CLIENT are closed at once
        one = [_hostile(m.port, "127.0.0.2") for _ in range(MAX_SCRAPERS)]
        wait_until(lambda: sum(closed_by_server(s) for s in one[MAX_PER_CLIENT:]) == MAX_SCRAPERS - MAX_PER_CLIENT)
        held = one[:MAX_PER_CLIENT]
        assert not any(closed_by_server(s) for s in held)
        # ... so a real scrape is answered while it holds its share, trickling a byte at a time
        for s in held:
            s.sendall(b"E")
        assert value(scrape(m.url), "process_open_fds") is not None
        # the trickle does not keep them: each is cut within the deadline of being accepted
        stop = threading.Event()

        def trickle() -> None:
            for _ in range(100):
                if stop.wait(0.1):
                    return
                for s in held:
                    with contextlib.suppress(OSError):
                        s.sendall(b"T")

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            wait_until(
                lambda: all(closed_by_server(s) for s in held), timeout=deadline_s * 5, what="the deadline's cut"
            )
        finally:
            stop.set()
            t.join(5)
        # clients from several addresses may fill every thread, but only until the deadline
        many = [_hostile(m.port, f"127.0.0.{10 + i}") for i in range(MAX_SCRAPERS)]
        wait_until(lambda: all(closed_by_server(s) for s in many), timeout=deadline_s * 5, what="every thread freed")
        assert value(scrape(m.url), "process_open_fds") is not None
        for s in one + many:
            s.close()
