"""A peer: the Feeds service, gRPC health checking and reflection, TLS, followers, clean shutdown.

    peer = PeerServer("data", "127.0.0.1:0").start()   # port 0: pick a free one
    peer.address                                        # "127.0.0.1:43817"
    peer.stop()

`serve_forever` is what `feedlog serve` runs: it stops on SIGTERM/SIGINT,
letting in-flight calls finish and committing queued puts; every
acknowledged append was durable before its acknowledgement was sent.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from feedlog.errors import InvalidArgument, Unavailable
from feedlog.pb import feeds_pb2
from feedlog.replication.client import Address, Tls

from .events import event
from .follower import Follower
from .host import FeedHost
from .service import FeedsService, rpc_handler

SERVICE = feeds_pb2.DESCRIPTOR.services_by_name["Feeds"].full_name
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: bytes
    key: bytes
    client_ca: bytes | None = None  # set: mutual TLS, clients must present a certificate it signed

    @classmethod
    def from_files(cls, cert: str, key: str, client_ca: str | None = None) -> ServerTls:
        try:
            return cls(
                Path(cert).read_bytes(), Path(key).read_bytes(), Path(client_ca).read_bytes() if client_ca else None
            )
        except OSError as e:
            raise InvalidArgument(f"cannot read TLS file: {e}") from None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.client_ca, require_client_auth=self.client_ca is not None
        )


class PeerServer:
    def __init__(
        self,
        data: str | Path,
        listen: str = "127.0.0.1:0",
        *,
        tls: ServerTls | None = None,
        follow: Sequence[Address] = (),
        follow_tls: Tls | None = None,
        accept_new: bool = True,
        fsync: bool = True,
        max_streams: int = 64,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.data = Path(data)
        self.listen = listen
        self.tls = tls
        self.follow = list(follow)
        self.follow_tls = follow_tls
        self.accept_new = accept_new
        self.fsync = fsync
        self.max_streams = max_streams
        self.max_message_bytes = max_message_bytes
        self.stopping = threading.Event()
        self.followers: list[Follower] = []
        self.port = 0

    @property
    def address(self) -> str:
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"

    def start(self) -> PeerServer:
        self.host = FeedHost(self.data, accept_new=self.accept_new, fsync=self.fsync)
        workers = self.max_streams + 32  # streams are capped at max_streams: unary calls always find a thread
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", 0),
        ]
        self.server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="feeds-rpc"),
            options=options,
            maximum_concurrent_rpcs=workers,
        )
        self.service = FeedsService(self.host, max_streams=self.max_streams, stopping=self.stopping)
        self.server.add_generic_rpc_handlers((rpc_handler(self.service),))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), self.server
        )
        try:
            if self.tls is None:
                self.port = self.server.add_insecure_port(self.listen)
            else:
                self.port = self.server.add_secure_port(self.listen, self.tls.credentials())
        except RuntimeError as e:
            self.host.close()
            raise Unavailable(f"cannot listen on {self.listen}: {e}") from None
        if not self.port:
            self.host.close()
            raise Unavailable(f"cannot listen on {self.listen} (in use, or not an address of this machine)")
        self.server.start()
        for name in ("", SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        for address in self.follow:
            self.followers.append(Follower(self.host, address, tls=self.follow_tls).start())
        event(
            "serving",
            address=self.address,
            data=str(self.data),
            feeds=len(self.host),
            tls="mutual" if self.tls and self.tls.client_ca else bool(self.tls),
            following=[str(a) for a in self.follow],
        )
        return self

    def stop(self, grace: float = 5.0) -> None:
        if self.stopping.is_set() or not self.port:
            return  # stopped already, or never started
        self.stopping.set()
        self.health.enter_graceful_shutdown()
        for f in self.followers:
            f.stop()
        self.server.stop(grace).wait(grace + 5)
        self.host.close()  # commits queued puts, checkpoints every feed
        event("stopped", address=self.address)

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(server: PeerServer) -> None:
    """Run until SIGTERM or SIGINT, then shut down cleanly."""
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        event("signal", signal=signal.Signals(signum).name)
        done.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        while not done.wait(3600):
            pass
    finally:
        server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
