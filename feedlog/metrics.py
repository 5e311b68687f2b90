"""Prometheus metrics: a registry per server, the `--metrics-listen` options, and the `/metrics` listener.

    registry = new_registry()                        # never prometheus_client's global one: several
    listener = MetricsListener(registry, settings)   # servers (tests, the demo) share one process
    listener.start(); listener.url                   # "http://127.0.0.1:9464/metrics"

Components keep plain counters (ints) and the metric modules read them when
Prometheus scrapes (`prometheus_client.registry.Collector`); only the few
histograms are observed on the hot path. The families themselves live beside
what they measure: `feedlog_server.metrics` (the gRPC interceptor, a peer, the
commit owner) and `feedlog.lake.stream_metrics` (a streaming ingest).

The listener follows the rule of every feedlog listener (server/rpc.py
`require_tls_off_loopback`): loopback by default; beyond loopback it needs TLS
(`--metrics-tls-cert/--metrics-tls-key`, or the command's `--insecure`) and a
bearer token (`--metrics-token-file`, or $FEEDLOG_METRICS_TOKEN), which is what
Prometheus' `authorization` scrape setting sends. It answers from a fixed pool
of `MAX_SCRAPERS` threads, at most `MAX_PER_CLIENT` of them for one client address; a
connection beyond them is closed unanswered, and every connection is shut down
`SCRAPE_TIMEOUT_S` after it was accepted, however it trickles its bytes (a
per-read timeout alone would let one byte every few seconds hold a thread for
ever, before the token is even read).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import http.server
import os
import socket
import ssl
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidArgument, Unavailable
from .rpc import client_key, is_loopback

#: the environment variable holding the bearer token a scraper must send (besides --metrics-token-file)
TOKEN_ENV = "FEEDLOG_METRICS_TOKEN"
#: threads answering scrapes; Prometheus scrapes one target once per interval, so a few are plenty
MAX_SCRAPERS = 4
#: threads one client address may hold at once (an IPv6 client: its /64), so one client never holds them all
MAX_PER_CLIENT = 2
#: seconds a scrape's connection may last in all (TLS handshake, request, answer) before it is shut down
SCRAPE_TIMEOUT_S = 10.0
#: the one path served (anything else: 404)
PATH = "/metrics"


def new_registry() -> Any:
    """A registry of its own (`prometheus_client.CollectorRegistry`), never the process-wide default."""
    from prometheus_client import (
        GC_COLLECTOR,
        PLATFORM_COLLECTOR,
        PROCESS_COLLECTOR,
        CollectorRegistry,
        disable_created_metrics,
    )

    # no `*_created` series beside every counter and histogram: Prometheus ignores them in the text
    # format, and they would double what a scrape carries (the client's switch is process-wide)
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    # the process's CPU, memory, open files, and Python's GC and version: what every Prometheus client
    # exports by default, and what dashboards expect beside a service's own families
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where and how `/metrics` is served: plain values, checked by `check_exposure`."""

    listen: str
    cert: str | None = None
    key: str | None = None
    #: SHA-256 digests of the bearer tokens accepted; empty: no token asked for (loopback only)
    token_hashes: tuple[bytes, ...] = ()
    #: the command's --insecure: plaintext beyond loopback allowed (the token is still needed)
    insecure: bool = False
    #: seconds a connection may last in all (tests shorten it)
    deadline_s: float = SCRAPE_TIMEOUT_S


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--metrics-listen` and its TLS and token options, the same on every command that serves metrics."""
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (loopback, e.g. 127.0.0.1:9464; beyond "
        "loopback: TLS and a token). Default: no metrics listener",
    )
    p.add_argument("--metrics-tls-cert", metavar="FILE", help="certificate (PEM) for the metrics listener: HTTPS")
    p.add_argument("--metrics-tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        help=f"bearer tokens a scraper must send, one a line (or sha256:HEX); also ${TOKEN_ENV}",
    )


def settings_of(ns: argparse.Namespace) -> MetricsSettings | None:
    """The metrics settings `add_arguments` parsed (None: no --metrics-listen), checked before anything starts."""
    listen = getattr(ns, "metrics_listen", None)
    cert, key, token_file = ns.metrics_tls_cert, ns.metrics_tls_key, ns.metrics_token_file
    if listen is None:
        if cert or key or token_file:
            raise InvalidArgument(
                "--metrics-tls-cert, --metrics-tls-key and --metrics-token-file need --metrics-listen"
            )
        return None
    settings = MetricsSettings(
        listen=listen,
        cert=cert,
        key=key,
        token_hashes=tuple(_tokens(token_file)),
        insecure=bool(getattr(ns, "insecure", False)),
    )
    check_exposure(settings)
    return settings


def _tokens(token_file: str | None) -> Iterable[bytes]:
    lines: list[str] = []
    if token_file:
        try:
            lines += Path(token_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"cannot read --metrics-token-file {token_file}: {e}") from None
    if os.environ.get(TOKEN_ENV):
        lines.append(os.environ[TOKEN_ENV])
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("sha256:") and len(line) == 71:
            try:
                out.append(bytes.fromhex(line[7:]))
                continue
            except ValueError:
                pass
        if len(line) < 16 or not line.isascii() or not line.isprintable() or " " in line:
            raise InvalidArgument("a metrics token is at least 16 printable ASCII characters without spaces")
        out.append(hashlib.sha256(line.encode()).digest())
    if token_file and not out:
        raise InvalidArgument(f"--metrics-token-file {token_file} holds no token")
    return out


def check_exposure(s: MetricsSettings) -> None:
    """The listener rule (pure): HOST:PORT; TLS files in pairs; beyond loopback, TLS (or --insecure) and a token."""
    _host, sep, port = s.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidArgument(f"--metrics-listen {s.listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    if (s.cert is None) != (s.key is None):
        raise InvalidArgument("--metrics-tls-cert and --metrics-tls-key go together")
    if is_loopback(s.listen):
        return
    if s.cert is None and not s.insecure:
        raise InvalidArgument(
            f"--metrics-listen {s.listen} is reachable from other machines: serve HTTPS "
            "(--metrics-tls-cert/--metrics-tls-key), or keep it on loopback (127.0.0.1:PORT)"
        )
    if not s.token_hashes:
        raise InvalidArgument(
            f"--metrics-listen {s.listen} is reachable from other machines: give scrapers a token "
            f"(--metrics-token-file or ${TOKEN_ENV}), or keep it on loopback (127.0.0.1:PORT)"
        )


class _Server(http.server.HTTPServer):
    """An HTTP server answering from a bounded pool: a connection beyond the pool's room is closed."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 16

    def __init__(self, address: tuple[str, int], family: int, listener: MetricsListener) -> None:
        self.address_family = family
        self.listener = listener
        self._pool = ThreadPoolExecutor(MAX_SCRAPERS, thread_name_prefix="metrics")
        self._room = threading.BoundedSemaphore(MAX_SCRAPERS)
        self._lock = threading.Lock()
        self._per_client: dict[str, int] = {}  # client_key -> connections being served
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        key = client_key(str(client_address[0]))
        with self._lock:
            # a client at its share, or every thread busy: closed, no queue grows here
            admitted = self._per_client.get(key, 0) < MAX_PER_CLIENT and self._room.acquire(blocking=False)
            if admitted:
                self._per_client[key] = self._per_client.get(key, 0) + 1
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            self._pool.submit(self._serve_one, request, client_address, key)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._release(key)
            self.shutdown_request(request)

    def _release(self, key: str) -> None:
        with self._lock:
            left = self._per_client.pop(key, 1) - 1
            if left:
                self._per_client[key] = left
            self._room.release()

    def _serve_one(self, request: Any, client_address: Any, key: str) -> None:
        # The deadline covers the whole connection: settimeout only bounds each read, and a client
        # sending a byte every few seconds would otherwise hold this thread for as long as it likes.
        # A duplicate of the socket is shut down (not the socket itself), as TLS replaces `request`
        # by a wrapper; shutting the connection down wakes whatever read or write is blocked on it.
        guard: list[socket.socket] = []  # the duplicate while the connection lasts
        lock = threading.Lock()

        def expire() -> None:
            with lock:
                for g in guard:  # not yet finished: cut the connection
                    with contextlib.suppress(OSError):
                        g.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.listener.settings.deadline_s, expire)
        timer.daemon = True
        try:
            guard.append(request.dup())  # inside the try: no room leaks if the process is out of fds
            timer.start()
            request.settimeout(self.listener.settings.deadline_s)
            if self.listener.tls is not None:
                request = self.listener.tls.wrap_socket(request, server_side=True)  # handshake here, bounded
            self.finish_request(request, client_address)
        except (OSError, ssl.SSLError):
            pass  # a client that went away, spoke no TLS or ran out of time: nothing to answer
        finally:
            timer.cancel()
            with lock:  # an expiry running now finishes before the duplicate is closed
                for g in guard:
                    g.close()
                guard.clear()
            self.shutdown_request(request)
            self._release(key)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one scrape per connection: no idle keep-alive holding a thread
    server_version = "feedlog"
    sys_version = ""

    def do_GET(self) -> None:
        listener = self.server.listener
        if self.path.split("?", 1)[0] != PATH:
            self._send(404, b"not found: metrics are at /metrics\n", "text/plain; charset=utf-8")
            return
        if not listener.authorized(self.headers.get("Authorization")):
            self._send(401, b"unauthorized: send Authorization: Bearer <token>\n", "text/plain; charset=utf-8", True)
            return
        from prometheus_client.exposition import choose_encoder

        encode, content_type = choose_encoder(self.headers.get("Accept") or "")
        self._send(200, encode(listener.registry), content_type)

    def do_HEAD(self) -> None:
        self._send(405, b"", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str, challenge: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if challenge:
            self.send_header("WWW-Authenticate", 'Bearer realm="feedlog metrics"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not events: one a second per Prometheus would drown the server's log


class MetricsListener:
    """`/metrics` of `registry` on `settings.listen` (port 0: any free port), until `stop`."""

    def __init__(self, registry: Any, settings: MetricsSettings) -> None:
        check_exposure(settings)
        self.registry = registry
        self.settings = settings
        self.tls: ssl.SSLContext | None = None
        if settings.cert is not None and settings.key is not None:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                self.tls.load_cert_chain(settings.cert, settings.key)
            except (OSError, ssl.SSLError) as e:
                raise InvalidArgument(f"cannot load --metrics-tls-cert/--metrics-tls-key: {e}") from None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def authorized(self, header: str | None) -> bool:
        if not self.settings.token_hashes:
            return True
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        digest = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
        match = False
        for h in self.settings.token_hashes:  # no early exit: the time taken does not tell which came close
            match |= hmac.compare_digest(digest, h)
        return match

    @property
    def address(self) -> str:
        host = self.settings.listen.rpartition(":")[0] or "0.0.0.0"
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}{PATH}"

    def start(self) -> MetricsListener:
        host, _, port = self.settings.listen.rpartition(":")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise InvalidArgument(f"--metrics-listen {self.settings.listen}: cannot resolve {host!r}: {e}") from None
        family, _, _, _, sockaddr = infos[0]
        try:
            self._server = _Server((str(sockaddr[0]), int(sockaddr[1])), family, self)
        except OSError as e:
            raise Unavailable(f"cannot serve metrics on {self.settings.listen}: {e.strerror or e}") from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="metrics-listen", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> MetricsListener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
