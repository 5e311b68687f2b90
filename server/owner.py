"""The commit owner as a gRPC service: `feedlog owner serve --db FILE|URL --listen HOST:PORT --root DIR`.

    owner = OwnerServer("owner.db", "127.0.0.1:0", roots=["/data/tables"]).start()
    owner.endpoint            # "grpc://127.0.0.1:40123", what tables name in delta.managedCommitOwnerConf
    owner.stop()

The decisions are `LocalOwner`'s (its state in one SQLite file, or in a
PostgreSQL database that several owner processes share); this layer turns
messages into calls, the bearer token / client certificate into `Auth`, and
errors into status codes. On start it settles proposals and backfills what a
crash left behind, so killing the owner mid-backfill loses nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from feedlog.delta.committer import CommitConflict, CommitResponse
from feedlog.delta.managed import DEFAULT_BATCH_SIZE, Auth, TableRef
from feedlog.delta.managed.places import Places
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.objectstore import scheme_of
from feedlog.errors import FeedlogError, InvalidArgument, Unavailable
from feedlog.metrics import MetricsListener, MetricsSettings, new_registry
from feedlog.pb import owner_pb2 as pb

from .app import ServerTls
from .events import event
from .rpc import rpc_handler, start_server, unary

if TYPE_CHECKING:  # prometheus_client loads only for an owner that exports metrics
    from .metrics import GrpcMetrics, OwnerMetrics

SERVICE = pb.DESCRIPTOR.services_by_name["CommitOwner"].full_name


def _ref(t: pb.TableRef) -> TableRef:
    return TableRef(t.table_id, t.path)


def _outcome(r: CommitResponse) -> pb.CommitOutcome:
    if isinstance(r, CommitConflict):
        winners = [pb.Commit(version=v, file=f) for v, f in r.winners]
        return pb.CommitOutcome(
            committed=False,
            version=r.version,
            retryable=r.retryable,
            reason=r.reason,
            winners=winners,
            turn=r.turn,
            pending=r.pending or 0,
        )
    return pb.CommitOutcome(committed=True, version=r.version)


def auth_of(context: grpc.ServicerContext) -> Auth:
    """The bearer token from the call's metadata and, over mutual TLS, the verified certificate's CN."""
    token = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            token = value[len("Bearer ") :].strip() or None
    names = (context.auth_context() or {}).get("x509_common_name") or []
    principal = names[0].decode(errors="replace") if names else None
    return Auth(token, principal)


class OwnerService:
    def __init__(self, owner: LocalOwner, metrics: OwnerMetrics | None = None) -> None:
        self.owner = owner
        self.metrics = metrics

    def _answered(self, how: Callable[[], CommitResponse]) -> CommitResponse:
        """`how()`'s answer, told to the metrics with the time it took (ratification latency, conflicts)."""
        if self.metrics is None:
            return how()
        began = time.perf_counter()
        try:
            r = how()
        except FeedlogError as e:
            self.metrics.answered(e, time.perf_counter() - began)
            raise
        self.metrics.answered(r, time.perf_counter() - began)
        return r

    @unary
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.CommitOutcome:
        c = request.commit
        batch = request.batch_size or DEFAULT_BATCH_SIZE
        r = self.owner.register(_ref(c.table), c.version, c.file, c.in_commit_timestamp, auth_of(context), batch)
        event("table_registered", table=c.table.table_id, path=c.table.path, version=c.version, ok=not _lost(r))
        return _outcome(r)

    @unary
    def Commit(self, request: pb.StagedCommit, context: grpc.ServicerContext) -> pb.CommitOutcome:
        r = self._answered(
            lambda: self.owner.commit(
                _ref(request.table),
                request.version,
                request.file,
                request.in_commit_timestamp,
                auth_of(context),
                request.turn or None,
                watch=context.add_callback,  # a request waiting for its turn leaves when its call ends
                pending_ok=request.accepts_pending,
                base=request.base or None,
            )
        )
        return _outcome(r)

    @unary
    def GetCommits(self, request: pb.GetCommitsRequest, context: grpc.ServicerContext) -> pb.GetCommitsResponse:
        found = self.owner.get_commits(_ref(request.table), request.start_version)
        commits = [pb.Commit(version=c.version, file=c.file, in_commit_timestamp=c.ict) for c in found.commits]
        return pb.GetCommitsResponse(commits=commits, latest=found.latest)

    @unary
    def Backfill(self, request: pb.BackfillRequest, context: grpc.ServicerContext) -> pb.BackfillResponse:
        return pb.BackfillResponse(
            backfilled=self.owner.backfill(_ref(request.table), request.version, auth_of(context))
        )

    @unary
    def Release(self, request: pb.StagedCommit, context: grpc.ServicerContext) -> pb.CommitOutcome:
        r = self._answered(
            lambda: self.owner.release(
                _ref(request.table), request.version, request.file, request.in_commit_timestamp, auth_of(context)
            )
        )
        event("table_released", table=request.table.table_id, version=request.version, ok=not _lost(r))
        return _outcome(r)

    @unary
    def EndTurn(self, request: pb.EndTurnRequest, context: grpc.ServicerContext) -> pb.EndTurnResponse:
        return pb.EndTurnResponse(held=self.owner.end_turn(_ref(request.table), request.turn, auth_of(context)))

    @unary
    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.TableStatus:
        s = self.owner.status(request.table_id, auth_of(context))
        return pb.TableStatus(
            table_id=s.table_id,
            path=s.path,
            state=s.state,
            latest=s.latest,
            backfilled=s.backfilled,
            batch_size=s.batch_size,
            tracked=s.tracked,
        )


def _lost(r: CommitResponse) -> bool:
    return isinstance(r, CommitConflict)


class OwnerServer:
    def __init__(
        self,
        db: str | os.PathLike[str],
        listen: str = "127.0.0.1:0",
        *,
        roots: Sequence[str | os.PathLike[str]] | None = None,
        tls: ServerTls | None = None,
        workers: int = 32,
        storage_options: Mapping[str, str] | None = None,
        metrics: MetricsSettings | None = None,
    ) -> None:
        self.db = os.fspath(db)
        #: where `/metrics` is served (None: nowhere)
        self.metrics = metrics
        self.metrics_listener: MetricsListener | None = None
        self.owner_metrics: OwnerMetrics | None = None
        self.listen = listen
        self.roots = [os.fspath(r) for r in (roots if roots is not None else [os.getcwd()])]
        for r in self.roots:
            if scheme_of(r) is None and not os.path.isdir(r):
                raise InvalidArgument(f"--root {r} is not a directory")
        #: the owner's own credentials for object-store roots (never taken from a table or a writer)
        self.storage_options = storage_options
        Places(self.roots, storage_options)  # bad URL roots and store options fail here, before serving
        self.tls = tls
        self.workers = workers
        self.port = 0
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"grpc://{self.address}"

    def start(self) -> OwnerServer:
        grpc_metrics = None
        if self.metrics is not None:  # first: a taken port fails before the database opens
            from .metrics import GrpcMetrics, OwnerMetrics

            registry = new_registry()
            self.owner_metrics = OwnerMetrics(registry)
            grpc_metrics = GrpcMetrics(registry, [SERVICE])
            self.metrics_listener = MetricsListener(registry, self.metrics).start()
        try:
            self._start(grpc_metrics)
        except BaseException:
            if self.metrics_listener is not None:
                self.metrics_listener.stop()
            raise
        return self

    def _start(self, grpc_metrics: GrpcMetrics | None) -> None:
        self.owner = LocalOwner(
            self.db,
            self.roots,
            storage_options=self.storage_options,
            background_backfill=True,
            # a request waiting its turn holds a server thread: at most half of them wait, a quarter
            # for one table
            max_waiters=max(1, self.workers // 2),
        )
        try:
            recovered = self.owner.backfill_all()
        except FeedlogError as e:  # a table's files are damaged: serve the others, say so
            recovered = {}
            event("recovery_failed", error=str(e))
        if self.owner_metrics is not None:
            self.owner_metrics.attach(self.owner)
        self.service = OwnerService(self.owner, self.owner_metrics)
        try:
            self.server, self.port, self.health = start_server(
                self.listen,
                [rpc_handler(self.service, pb, "CommitOwner")],
                [SERVICE],
                tls=self.tls,
                workers=self.workers,
                max_message_bytes=4 << 20,
                metrics=grpc_metrics,
            )
        except Unavailable:
            self.owner.close()
            raise
        event(
            "owner_serving",
            address=self.address,
            db=self.owner.db,  # a file's absolute path, or the URL without its password
            roots=self.roots,
            tls="mutual" if self.tls and self.tls.client_ca else bool(self.tls),
            recovered=recovered,
            metrics=self.metrics_listener.url if self.metrics_listener else None,
        )

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped.is_set() or not self.port:
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait(grace + 5)
        self.owner.close()
        if self.metrics_listener is not None:
            self.metrics_listener.stop()
        event("owner_stopped", address=self.address, told=self.owner.turns.told, waits=self.owner.turns.waits)

    def __enter__(self) -> OwnerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
