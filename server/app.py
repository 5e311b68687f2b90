"""A peer: the Feeds service, gRPC health checking and reflection, TLS, followers, clean shutdown.

    peer = PeerServer("data", "127.0.0.1:0").start()   # port 0: pick a free one
    peer.address                                        # "127.0.0.1:43817"
    peer.token                                          # the write token it generated (data/_peer/write-token)
    peer.stop()

Server-side writes (Put, PutStream, Create) and pushes of new feeds need a
principal (server/auth.py): a token from `write_tokens`, or a client
certificate under mutual TLS. A peer given neither generates a token once and
keeps it in DATA/_peer/write-token (mode 0600).

`serve_forever` is what `feedlog serve` runs: it stops on SIGTERM/SIGINT,
letting in-flight calls finish and committing queued puts; every
acknowledged append was durable before its acknowledgement was sent.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from feedlog.clock import Clock
from feedlog.errors import InvalidArgument, Unavailable
from feedlog.metrics import MetricsListener, MetricsSettings, new_registry
from feedlog.pb import feeds_pb2
from feedlog.rpc import Address, Tls

from .auth import DEFAULT_CREATE_RATE, DEFAULT_WRITE_RATE, Guard, Rate, generated_token, token_hashes
from .compaction import DEFAULT_EVERY_S as DEFAULT_COMPACT_EVERY_S
from .compaction import Compactor
from .events import event
from .flow import DEFAULT_IN_FLIGHT_BYTES, DEFAULT_STALL_SECONDS, InFlight
from .follower import Follower
from .gossip import DEFAULT_EVERY_S as DEFAULT_GOSSIP_EVERY_S
from .gossip import Gossiper
from .host import DEFAULT_MAX_FEEDS, FeedHost
from .rpc import rpc_handler, start_server
from .service import FeedsService

if TYPE_CHECKING:  # prometheus_client loads only for a peer that exports metrics
    from .metrics import GrpcMetrics, PeerMetrics

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
        accept_new: bool = False,
        write_tokens: Sequence[str] | None = None,
        write_rate: Rate = DEFAULT_WRITE_RATE,
        create_rate: Rate = DEFAULT_CREATE_RATE,
        fsync: bool = True,
        max_streams: int = 64,
        max_streams_per_client: int | None = None,
        max_feeds: int = DEFAULT_MAX_FEEDS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        compact_every: float = DEFAULT_COMPACT_EVERY_S,
        clock: Clock | None = None,
        metrics: MetricsSettings | None = None,
        gossip: Sequence[Address] = (),
        gossip_every: float = DEFAULT_GOSSIP_EVERY_S,
    ) -> None:
        self.data = Path(data)
        #: where `/metrics` is served (None: nowhere); its listener and families once started
        self.metrics = metrics
        self.metrics_listener: MetricsListener | None = None
        self.peer_metrics: PeerMetrics | None = None
        #: seconds between scheduled compactions of every hosted feed (0: none); `clock`: when entries
        #: expire, for serving and compacting (issue 37), and the feeds' timestamps
        self.compact_every = compact_every
        self.clock = clock
        self.compactor: Compactor | None = None
        self.listen = listen
        self.tls = tls
        self.follow = list(follow)
        self.follow_tls = follow_tls
        self.accept_new = accept_new
        # None: generate (or reuse) DATA/_peer/write-token unless clients authenticate with certificates;
        # lines as in a token file (a token, or sha256:HEX). Only their hashes are kept.
        self.token_hashes = None if write_tokens is None else token_hashes(write_tokens)
        self.write_rate = write_rate
        self.create_rate = create_rate
        self.token: str | None = None  # the generated token, for in-process clients
        self.token_file: Path | None = None
        self.fsync = fsync
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client  # None: half of max_streams (rpc.StreamCap)
        self.max_feeds = max_feeds  # hosted feeds beyond which unauthenticated pushes create none
        self.max_message_bytes = max_message_bytes
        self.max_in_flight_bytes = max_in_flight_bytes  # response messages built and not yet taken, all streams
        self.stall_seconds = stall_seconds  # how long a reader may leave one waiting while others wait for memory
        self.stopping = threading.Event()
        self.followers: list[Follower] = []
        #: issue 40: peers to gossip signed states with (besides those followed), and the slow timer
        self.gossip = list(gossip)
        self.gossip_every = gossip_every
        self.gossiper: Gossiper | None = None
        self.port = 0

    @property
    def address(self) -> str:
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"

    def start(self) -> PeerServer:
        client_certs = bool(self.tls and self.tls.client_ca)
        hashes = self.token_hashes or []
        if self.token_hashes is None and not client_certs:
            self.token_file, self.token = generated_token(self.data)
            hashes = token_hashes([self.token])
            event("write_token", file=str(self.token_file))  # where it is, never the token itself
        guard = Guard(
            hashes,
            client_certs=client_certs,
            accept_new=self.accept_new,
            write_rate=self.write_rate,
            create_rate=self.create_rate,
        )
        grpc_metrics = self._start_metrics()
        try:
            self.host = FeedHost(
                self.data,
                accept_new=self.accept_new,
                fsync=self.fsync,
                max_feeds=self.max_feeds,
                clock=self.clock,
                observer=self.peer_metrics,
            )
        except BaseException:
            self._stop_metrics()
            raise
        workers = self.max_streams + 32  # streams are capped at max_streams: unary calls always find a thread
        self.service = FeedsService(
            self.host,
            stopping=self.stopping,
            in_flight=InFlight(self.max_in_flight_bytes, stall=self.stall_seconds),
            max_message_bytes=self.max_message_bytes,
            guard=guard,
            compact_every_ms=round(self.compact_every * 1000),
        )
        try:
            self.server, self.port, self.health = start_server(
                self.listen,
                [rpc_handler(self.service, feeds_pb2, "Feeds")],
                [SERVICE],
                tls=self.tls,
                workers=workers,
                max_streams=self.max_streams,
                max_streams_per_client=self.max_streams_per_client,
                max_message_bytes=self.max_message_bytes,
                metrics=grpc_metrics,
            )
        except Unavailable:
            self.host.close()
            self._stop_metrics()
            raise
        for address in self.follow:
            self.followers.append(Follower(self.host, address, tls=self.follow_tls).start())
        self.compactor = Compactor(self.host, self.compact_every).start()
        peers = [*self.gossip, *self.follow]
        self.gossiper = Gossiper(self.host, peers, every=self.gossip_every, tls=self.follow_tls).start()
        if self.peer_metrics is not None:
            self.peer_metrics.attach(self.host, self.followers, self.compactor)
        event(
            "serving",
            address=self.address,
            data=str(self.data),
            feeds=len(self.host),
            tls="mutual" if client_certs else bool(self.tls),
            write_auth=guard.how,
            accept_new=self.accept_new,
            following=[str(a) for a in self.follow],
            gossip=[str(a) for a in self.gossip],
            compact_every=self.compact_every,
            metrics=self.metrics_listener.url if self.metrics_listener else None,
        )
        return self

    def _start_metrics(self) -> GrpcMetrics | None:
        """The metrics listener and families, if asked for (before any feed opens: a taken port fails first)."""
        if self.metrics is None:
            return None
        from .metrics import GrpcMetrics, PeerMetrics

        registry = new_registry()
        self.peer_metrics = PeerMetrics(registry)
        families = GrpcMetrics(registry, [SERVICE])
        self.metrics_listener = MetricsListener(registry, self.metrics).start()
        return families

    def _stop_metrics(self) -> None:
        if self.metrics_listener is not None:
            self.metrics_listener.stop()

    def stop(self, grace: float = 5.0) -> None:
        if self.stopping.is_set() or not self.port:
            return  # stopped already, or never started
        self.stopping.set()
        self.health.enter_graceful_shutdown()
        for f in self.followers:
            f.stop()
        if self.gossiper is not None:
            self.gossiper.stop()
        if self.compactor is not None:
            self.compactor.stop()
        self.server.stop(grace).wait(grace + 5)
        self.host.close()  # commits queued puts, checkpoints every feed
        self._stop_metrics()  # last: a scrape during the shutdown still answers
        event("stopped", address=self.address)

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
