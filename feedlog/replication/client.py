"""The client of the `Feeds` service: typed errors, deadlines, optional TLS.

    client = FeedClient("127.0.0.1:7000")
    client.info(key)                              # as `feedlog info --json`
    for batch in client.read_verified(key, 1):    # every block checked against the signed tree
        ...
    with client.producer(key) as p:               # Kafka-style: put() returns a future
        futures = [p.put(Write("/k", b"v")) for _ in range(10_000)]

Every failed call raises a `FeedlogError` naming the peer (`feedlog.rpc.error_of`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from ..errors import Corruption, FeedlogError, InvalidArgument, Unavailable
from ..log.feed import Appended, Write
from ..log.merkle import Proof, TreeState
from ..pb import feeds_pb2 as pb
from ..pb import feeds_pb2_grpc as pb_grpc
from ..rpc import Tls, auth_metadata, error_of, open_channel
from . import wire
from .verify import DEFAULT_BUDGET, SegmentVerifier, Verified, max_message_bytes, max_unsigned_bytes

DEFAULT_TIMEOUT = 30.0
#: how long a bounded Read may go without a message before the reader gives up on the peer (a peer
#: makes a reader wait only while its in-flight budget is spent, for 30 s at most: flow.InFlight)
READ_IDLE_SECONDS = 60.0
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ResponseStream(Protocol[T_co]):
    """A gRPC call streaming responses: iterate it for them; `cancel()` from any thread ends it."""

    def __iter__(self) -> Iterator[T_co]: ...

    def cancel(self) -> bool: ...


class FeedClient:
    """`token`: the peer's write token, sent with the calls that write (Create, Put, PutStream, Append)."""

    def __init__(
        self,
        target: str,
        *,
        tls: Tls | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        token: str | None = None,
        budget: int = DEFAULT_BUDGET,
        read_idle: float = READ_IDLE_SECONDS,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.read_idle = read_idle
        self.auth = auth_metadata(token)
        if not 0 < budget < 1 << 32:
            raise InvalidArgument(f"a message budget is 1..{(1 << 32) - 1} bytes, got {budget}")
        # what a reader asks per message, and so the most it accepts in one (plus one block) and
        # holds before a signature: a flooding peer is cut off there (issue 13 items 1 and 6)
        self.budget = budget
        self.channel = open_channel(target, tls, max_receive=max_message_bytes(budget))
        self.stub = pb_grpc.FeedsStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> FeedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., T], request: Message, timeout: float | None = None, *, write: bool = False) -> T:
        try:
            return fn(request, timeout=timeout or self.timeout, metadata=self.auth if write else None)
        except grpc.RpcError as e:
            raise error_of(e, self.target) from None

    def _stream(self, it: ResponseStream[T], idle: float | None = None, ahead: int = 0) -> Generator[T, None, None]:
        """Messages of a response stream, errors as FeedlogErrors; with `idle`, a peer that sends
        nothing for that long is given up on (a bounded read must keep coming; tails may wait).
        With `ahead`, up to that many messages are received while the caller works on the last."""
        watch = _IdleWatch(it, idle) if idle is not None else None
        try:
            for m in _read_ahead(it, ahead, watch) if ahead else it:
                if watch is not None:
                    watch.seen()
                yield m
        except grpc.RpcError as e:
            if watch is not None and watch.fired:
                raise Unavailable(
                    f"{self.target}: sent nothing for {idle:.0f} s in the middle of a read; giving up on it"
                ) from None
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            detail = e.details() or ""
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "received message larger" in detail.lower():
                if detail.startswith("SERVER:"):  # it is the peer that refused what we sent
                    raise InvalidArgument(
                        f"{self.target} refused a request larger than it accepts ({detail}); "
                        "see its serve --max-message-bytes"
                    ) from None
                # our receive limit is the budget we asked for plus one block: the peer ignored it
                raise Corruption(
                    f"{self.target}: sent a message larger than the {self.budget}-byte budget asked for "
                    f"plus one block ({detail})"
                ) from None
            raise error_of(e, self.target) from None
        finally:
            if watch is not None:
                watch.stop()

    # ---- unary ------------------------------------------------------------------------

    def info(self, key: bytes, *, by_discovery_key: bool = False, consistency_from: int | None = None) -> pb.FeedInfo:
        """`consistency_from`: the length of a signed state the caller holds; the answer then carries the
        consistency proof from it to the peer's state, if the peer's is not shorter (issue 40)."""
        fid = pb.FeedId(discovery_key=key) if by_discovery_key else pb.FeedId(key=key)
        req = pb.GetInfoRequest(feed=fid)
        if consistency_from is not None:
            req.consistency_from = consistency_from
        info: pb.FeedInfo = self._call(self.stub.GetInfo, req)
        return info

    def gossip(self, request: pb.GossipRequest) -> pb.GossipResponse:
        """Exchange signed states with a peer (issue 40; server/gossip.py answers)."""
        resp: pb.GossipResponse = self._call(self.stub.Gossip, request)
        return resp

    def create(self, content_type: str = "entry", timestamps: str = "", ttl: str = "") -> pb.FeedInfo:
        req = pb.CreateRequest(content_type=content_type, timestamps=timestamps, ttl=ttl)
        info: pb.FeedInfo = self._call(self.stub.Create, req, write=True)
        return info

    def proof(self, key: bytes, seq: int) -> Proof:
        return wire.proof_of(self._call(self.stub.Proof, pb.ProofRequest(feed=pb.FeedId(key=key), seq=seq)))

    def append(self, key: bytes, expected_length: int, blocks: Sequence[bytes], signature: bytes) -> TreeState:
        req = pb.AppendRequest(key=key, expected_length=expected_length, blocks=blocks, signature=signature)
        return wire.state_of(self._call(self.stub.Append, req, write=True).state)

    def append_stream(self, requests: Iterable[pb.AppendRequest]) -> Iterator[TreeState]:
        """Pipelined signed appends: responses in request order; the first failure ends the stream."""
        for resp in self._stream(self.stub.AppendStream(iter(requests), metadata=self.auth)):
            yield wire.state_of(resp.state)

    def put(self, feed: bytes, writes: Sequence[Write], timeout: float | None = None) -> list[Appended]:
        """Server-side append: one durable batch (group-committed with other clients' puts)."""
        resp = self._call(self.stub.Put, pb.PutRequest(feed=feed, entries=wire.puts_pb(writes)), timeout, write=True)
        return acked(resp, len(writes), 0, self.target)

    def producer(self, feed: bytes, *, max_batch: int = 1000, max_in_flight: int = 32) -> Producer:
        return Producer(self, feed, max_batch=max_batch, max_in_flight=max_in_flight)

    # ---- streams ----------------------------------------------------------------------

    def read(
        self,
        key: bytes,
        start: int,
        end: int = 0,
        *,
        with_roots: bool = False,
        max_message_bytes: int = 0,
        ahead: int = 0,
    ) -> Iterator[pb.ReadResponse]:
        """Blocks [start, end) as the peer sends them; `ahead`: messages to receive while the caller
        works on the previous one (the peer keeps sending meanwhile; each holds up to the budget)."""
        req = pb.ReadRequest(
            feed=pb.FeedId(key=key),
            start=start,
            end=end,
            with_roots=with_roots,
            max_message_bytes=min(max_message_bytes or self.budget, self.budget),
        )
        return self._blocks(self._stream(self.stub.Read(req), idle=self.read_idle, ahead=ahead))

    def _blocks(self, messages: Generator[pb.ReadResponse, None, None]) -> Iterator[pb.ReadResponse]:
        """Read or Subscribe messages, each carrying blocks: a peer sends blocks or nothing, and a stream of
        empty messages would keep a reader busy (and its idle watch content) for ever."""
        try:
            for m in messages:
                if not any(len(s.blocks) for s in m.segments):
                    raise Corruption(f"{self.target}: sent a message with no blocks")
                yield m
        finally:
            messages.close()  # the stream's own cleanup (its idle watch) now, not at garbage collection

    def subscribe(self, key: bytes, start: int, *, with_roots: bool = False) -> Subscription:
        req = pb.SubscribeRequest(
            feed=pb.FeedId(key=key), start=start, with_roots=with_roots, max_message_bytes=self.budget
        )
        return Subscription(self, self.stub.Subscribe(req))

    def read_verified(self, key: bytes, start: int, end: int = 0) -> Iterator[Verified]:
        """Blocks [start, end) (end 0: the current length) as verified batches, trimmed to the range."""
        return verified(self.read(key, start, end, with_roots=True), key, start, end or None, self.target, self.budget)


class Subscription:
    """A live tail; iterate for `ReadResponse`s, `cancel()` from any thread to end it."""

    def __init__(self, client: FeedClient, call: ResponseStream[pb.ReadResponse]) -> None:
        self._client = client
        self._call = call

    def __iter__(self) -> Iterator[pb.ReadResponse]:
        return self._client._blocks(self._client._stream(self._call))

    def verified(self, key: bytes, start: int) -> Iterator[Verified]:
        return verified(iter(self), key, start, None, self._client.target, self._client.budget)

    def cancel(self) -> None:
        self._call.cancel()


def verified(
    responses: Iterator[pb.ReadResponse],
    key: bytes,
    start: int,
    end: int | None,
    source: str,
    budget: int = DEFAULT_BUDGET,
) -> Iterator[Verified]:
    """Verified batches of a Read/Subscribe stream; holds at most `max_unsigned_bytes(budget)` unsigned.

    A stream that ends in the middle of a batch is an error (the peer sent
    blocks it never signed), not a quiet end.
    """
    v: SegmentVerifier | None = None
    for resp in responses:
        if v is None:
            roots = wire.nodes_of(resp.roots, source)
            v = SegmentVerifier(key, start, roots, source=source, max_unsigned=max_unsigned_bytes(budget))
        for m in resp.segments:
            batch = v.receive(m)
            if batch is None:
                continue
            if end is not None and batch.start + len(batch.blocks) > end:
                batch = batch.trimmed(end)
            if batch.blocks:
                yield batch
            if end is not None and v.length >= end:
                return
    if v is not None and v.pending:
        raise Corruption(f"{source}: the stream ended after {v.pending} blocks from {v.length} that were never signed")


def acked(resp: pb.PutResponse, count: int, after: int, source: str) -> list[Appended]:
    """The entries a put's ack says were appended, once it makes sense: `count` of them, at consecutive
    seqs past `after` (the last seq this stream was told) and within the state it reports; Corruption
    naming `source` otherwise. (The state's signature proves nothing here: a peer takes puts only for
    feeds whose secret key it holds, so it signs what it likes.)"""
    if len(resp.appended) != count:
        raise Corruption(f"{source}: acknowledged {len(resp.appended)} entries of a put of {count}")
    if not count:
        return []
    first, last = resp.appended[0].seq, resp.appended[count - 1].seq
    if first <= after or any(a.seq != first + i for i, a in enumerate(resp.appended)) or last >= resp.state.length:
        raise Corruption(
            f"{source}: acknowledged a put of {count} at seqs {first}..{last} in a feed of length "
            f"{resp.state.length} (after seq {after})"
        )
    return [appended_of(a) for a in resp.appended]


def appended_of(a: pb.Appended) -> Appended:
    return Appended(
        a.seq, a.timestamp if a.HasField("timestamp") else None, a.expires_at if a.HasField("expires_at") else None
    )


def _settle(futs: Sequence[Future[Appended]], outcome: Appended | BaseException) -> None:
    """Each future's result (or exception), unless its caller cancelled it or it is settled already."""
    for f in futs:
        try:
            if isinstance(outcome, BaseException):
                f.set_exception(outcome)
            else:
                f.set_result(outcome)
        except InvalidStateError:
            pass


class Producer:
    """Kafka-style pipelined puts over one `PutStream`.

    `put()` queues one entry and returns a future that resolves, with its seq
    and timestamp, only once the peer has made it durable. Entries queued
    while earlier requests are in flight travel together in one message (up to
    `max_batch`), as a Kafka producer's do; the peer group-commits messages
    from every client. At most `max_in_flight` requests await their acks.
    """

    def __init__(self, client: FeedClient, feed: bytes, *, max_batch: int = 1000, max_in_flight: int = 32) -> None:
        self._client = client
        self._feed = feed
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._cond = threading.Condition()
        self._queue: deque[tuple[pb.Put, Future[Appended]]] = deque()
        self._in_flight: deque[list[Future[Appended]]] = deque()
        self._closed = False
        self._error: FeedlogError | None = None
        self._call = client.stub.PutStream(self._requests(), metadata=client.auth)
        self._receiver = threading.Thread(target=self._receive, name="feedlog-producer", daemon=True)
        self._receiver.start()

    def put(self, write: Write) -> Future[Appended]:
        m = wire.puts_pb([write])[0]
        fut: Future[Appended] = Future()
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise InvalidArgument("the producer is closed")
            self._queue.append((m, fut))
            self._cond.notify_all()
        return fut

    def _requests(self) -> Iterator[pb.PutRequest]:
        while True:
            with self._cond:
                while (not self._queue or len(self._in_flight) >= self._max_in_flight) and not (
                    self._closed and not self._queue
                ):
                    if self._error is not None:
                        return
                    self._cond.wait(1.0)
                if not self._queue:
                    return  # closed and drained: end the request stream
                n = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(n)]
                self._in_flight.append([f for _, f in batch])
            yield pb.PutRequest(feed=self._feed, entries=[m for m, _ in batch])

    def _receive(self) -> None:
        target = self._client.target
        last = 0  # the last seq this stream was told: each ack's seqs come after it
        try:
            for resp in self._call:
                with self._cond:
                    futs = self._in_flight.popleft() if self._in_flight else None
                    self._cond.notify_all()
                if futs is None:
                    raise Corruption(f"{target}: acknowledged a put it was never sent")
                try:
                    results = acked(resp, len(futs), last, target)
                except FeedlogError as e:  # this put's callers learn it too (they left the in-flight queue)
                    _settle(futs, e)
                    raise
                if results:
                    last = results[-1].seq
                for fut, result in zip(futs, results, strict=True):
                    _settle([fut], result)
        except grpc.RpcError as e:
            self._fail(error_of(e, target))
            return
        except FeedlogError as e:  # never a silent death: every put waiting learns why, and the stream ends
            self._fail(e)
            self._call.cancel()
            return
        except Exception as e:  # a fault of ours, not the peer's: said as what it is
            self._fail(FeedlogError(f"the producer's receiver failed: {e!r}"))
            self._call.cancel()
            return
        with self._cond:
            unfinished = bool(self._in_flight or self._queue)
        if unfinished:
            self._fail(Unavailable(f"{self._client.target}: the put stream ended early"))

    def _fail(self, err: FeedlogError) -> None:
        with self._cond:
            if self._error is None:
                self._error = err
            pending = [f for futs in self._in_flight for f in futs] + [f for _, f in self._queue]
            self._in_flight.clear()
            self._queue.clear()
            self._cond.notify_all()
        _settle(pending, err)

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued put is acknowledged (or failed)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._queue and not self._in_flight, timeout):
                raise Unavailable(f"{self._client.target}: puts still unacknowledged after {timeout}s")

    def close(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._receiver.join(timeout)
        if self._receiver.is_alive():
            self._call.cancel()
            self._receiver.join(5)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: how long the read-ahead thread waits for the caller to take a message before checking it has not left
_AHEAD_POLL = 0.5


def _read_ahead(call: ResponseStream[T], depth: int, watch: _IdleWatch | None) -> Iterator[T]:
    """The messages of `call`, received by a thread up to `depth` ahead of the caller.

    gRPC pulls the next message off the transport only when the caller asks for
    it, and the peer builds its next one only then: a caller that verifies and
    stores each message before asking for the next leaves the peer idle. The
    thread keeps asking; errors reach the caller in order, after the messages
    before them. A caller that stops early cancels the call, which ends the thread.
    """
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    gone = threading.Event()

    def pump() -> None:
        try:
            for m in call:
                if watch is not None:
                    watch.seen()
                while not gone.is_set():
                    try:
                        q.put((True, m), timeout=_AHEAD_POLL)
                        break
                    except queue.Full:
                        continue
                if gone.is_set():
                    return
        except BaseException as e:  # delivered to the caller, who maps it (grpc.RpcError) or raises it
            item: tuple[bool, Any] = (False, e)
        else:
            item = (False, None)
        while not gone.is_set():
            try:
                q.put(item, timeout=_AHEAD_POLL)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=pump, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            ok, m = q.get()
            if ok:
                yield m
            elif m is None:
                return
            else:
                raise m
    finally:
        if thread.is_alive():
            gone.set()
            call.cancel()
            thread.join(5)


class _IdleWatch:
    """Cancels a gRPC call that has gone `idle` seconds without a message (one thread per call)."""

    def __init__(self, call: ResponseStream[object], idle: float) -> None:
        self.call, self.idle, self.fired = call, idle, False
        self._last = time.monotonic()
        self._done = threading.Event()
        threading.Thread(target=self._run, name="read-idle-watch", daemon=True).start()

    def seen(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.wait(min(1.0, self.idle)):
            if time.monotonic() - self._last > self.idle:
                self.fired = True
                self.call.cancel()
                return
