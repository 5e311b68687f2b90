"""`GrpcOwner`: the `CommitOwner` interface over the `feedlog.owner.CommitOwner` gRPC service.

Status codes become the library's typed errors (`feedlog.rpc`, one
mapping for every service); a call the owner did not answer (UNAVAILABLE,
DEADLINE_EXCEEDED) is `Unavailable`, which `ManagedCommitter` resolves by
asking again with the same staged file.

Failover: an owner named by several endpoints (`grpc://h1:7070,h2:7070`, owner
processes sharing one PostgreSQL database) is one owner. A call that one
endpoint did not answer is sent to the next, once round the list; the client then
keeps using the endpoint that answered. Sending the very request again elsewhere
is safe for the same reason asking again is: the owner recognises a repeated
commit (the same staged file) and answers it Committed, whichever process
ratified it first, while it still holds it; once that commit is backfilled and
forgotten the owner can only answer Conflict, and `ManagedCommitter` then finds
its own bytes in the log. (It checks on every Conflict, since the caller of a
failed-over call never learns that the first process may have ratified it.)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from ...errors import InvalidArgument, ResourceExhausted, Unavailable
from ...pb import owner_pb2 as pb
from ...pb import owner_pb2_grpc as pb_grpc
from ...rpc import Address, Tls, error_of, open_channel
from ..committer import CommitConflict, CommitResponse, Committed
from .protocol import Auth, Commits, RatifiedCommit, TableRef, TableStatus, owner_endpoints

T = TypeVar("T")

_SHARED: dict[tuple[str, Tls | None], GrpcOwner] = {}
_SHARED_LOCK = threading.Lock()
#: attempts of a read refused for load (about 2 s of backoff in all)
READ_RETRIES = 8


def _ref(t: TableRef) -> pb.TableRef:
    return pb.TableRef(table_id=t.table_id, path=t.path)


def _staged(t: TableRef, version: int, staged: str, ict: int) -> pb.StagedCommit:
    if version < 0 or ict < 0:
        raise InvalidArgument(f"version and inCommitTimestamp must be >= 0, got {version} and {ict}")
    return pb.StagedCommit(table=_ref(t), version=version, file=staged, in_commit_timestamp=ict)


def _outcome(o: pb.CommitOutcome) -> CommitResponse:
    if o.committed:
        return Committed(o.version)
    winners = tuple((w.version, w.file) for w in o.winners)
    return CommitConflict(o.version, o.retryable, o.reason, winners, o.turn, o.pending or None)


class _Endpoint:
    def __init__(self, url: str, tls: Tls | None) -> None:
        self.address = Address.parse(url)
        self.channel = open_channel(self.address.target, tls)
        self.stub = pb_grpc.CommitOwnerStub(self.channel)


class GrpcOwner:
    def __init__(self, endpoint: str, tls: Tls | None = None, timeout: float = 30.0) -> None:
        self.endpoints = [_Endpoint(url, tls) for url in owner_endpoints(endpoint)]
        self.timeout = timeout
        self._current = 0  # the endpoint that answered last

    @property
    def address(self) -> Address:
        return self.endpoints[self._current].address

    @property
    def stub(self) -> pb_grpc.CommitOwnerStub:
        return self.endpoints[self._current].stub

    @classmethod
    def shared(cls, endpoint: str, tls: Tls | None = None) -> GrpcOwner:
        """One channel per endpoint in a process (channels multiplex; opening one costs a handshake)."""
        with _SHARED_LOCK:
            owner = _SHARED.get((endpoint, tls))
            if owner is None:
                owner = _SHARED[(endpoint, tls)] = cls(endpoint, tls)
            return owner

    def _call(
        self, method: Callable[[pb_grpc.CommitOwnerStub], Callable[..., T]], request: Message, auth: Auth | None = None
    ) -> T:
        """`method` of the first endpoint that answers, starting with the one that answered last."""
        md = (("authorization", f"Bearer {auth.token}"),) if auth is not None and auth.token else None
        start = self._current
        for i in range(len(self.endpoints)):
            index = (start + i) % len(self.endpoints)
            endpoint = self.endpoints[index]
            try:
                response = method(endpoint.stub)(request, timeout=self.timeout, metadata=md)
            except grpc.RpcError as e:
                error = error_of(e, f"commit owner {endpoint.address}")
                if isinstance(error, Unavailable) and i < len(self.endpoints) - 1:
                    continue  # not answered there: the next process serving this owner
                raise error from None
            self._current = index
            return response
        raise AssertionError("unreachable")

    def _read(
        self, method: Callable[[pb_grpc.CommitOwnerStub], Callable[..., T]], request: Message, auth: Auth | None = None
    ) -> T:
        """A call that changes nothing, repeated (briefly, with backoff) while the owner refuses it for
        load: an owner at its concurrency limit answers at once with RESOURCE_EXHAUSTED."""
        for attempt in range(READ_RETRIES):
            try:
                return self._call(method, request, auth)
            except ResourceExhausted:
                if attempt == READ_RETRIES - 1:
                    raise
                time.sleep(min(0.5, 0.02 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def register(
        self, table: TableRef, version: int, staged: str, ict: int, auth: Auth, batch_size: int
    ) -> CommitResponse:
        request = pb.RegisterRequest(commit=_staged(table, version, staged, ict), batch_size=batch_size)
        return _outcome(self._call(lambda stub: stub.Register, request, auth))

    def commit(
        self,
        table: TableRef,
        version: int,
        staged: str,
        ict: int,
        auth: Auth,
        turn: bytes | None = None,
        *,
        pending_ok: bool = False,
        base: str | None = None,
    ) -> CommitResponse:
        request = _staged(table, version, staged, ict)
        if turn:
            request.turn = turn
        request.accepts_pending = pending_ok
        if base:
            request.base = base
        return _outcome(self._call(lambda stub: stub.Commit, request, auth))

    def release(self, table: TableRef, version: int, staged: str, ict: int, auth: Auth) -> CommitResponse:
        return _outcome(self._call(lambda stub: stub.Release, _staged(table, version, staged, ict), auth))

    def end_turn(self, table: TableRef, turn: bytes, auth: Auth) -> bool:
        request = pb.EndTurnRequest(table=_ref(table), turn=turn)
        return bool(self._call(lambda stub: stub.EndTurn, request, auth).held)

    def get_commits(self, table: TableRef, start_version: int) -> Commits:
        r = self._read(
            lambda stub: stub.GetCommits, pb.GetCommitsRequest(table=_ref(table), start_version=max(0, start_version))
        )
        return Commits([RatifiedCommit(c.version, c.file, c.in_commit_timestamp) for c in r.commits], r.latest)

    def backfill(self, table: TableRef, version: int, auth: Auth) -> int:
        r = self._call(lambda stub: stub.Backfill, pb.BackfillRequest(table=_ref(table), version=version), auth)
        return int(r.backfilled)

    def status(self, table_id: str, auth: Auth) -> TableStatus:
        r = self._read(lambda stub: stub.Status, pb.StatusRequest(table_id=table_id), auth)
        return TableStatus(r.table_id, r.path, r.state, r.latest, r.backfilled, r.batch_size, r.tracked)

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.channel.close()
