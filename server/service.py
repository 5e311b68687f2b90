"""The `Feeds` servicer: wire in, library call, wire out; errors become status codes in one place.

Threads: the server runs RPCs on a pool; every stream (Read, Subscribe,
PutStream, AppendStream, health Watch, reflection) holds one thread and is
capped apart from unary calls (rpc.StreamCap), so streams can never starve
unary calls. A slow reader blocks only its own stream: a stream builds its
next message only once the previous one was taken, and the messages waiting
to be taken are bounded in total (flow.InFlight); writers never wait for
readers. A message never exceeds the reader's budget nor the server's send
limit: batches larger than the budget come in parts (Core.segments).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
import numpy  # noqa: F401  # Core.segments' (serving a Read): loaded with the service, not on a reader's clock
from google.protobuf.message import Message

from feedlog.errors import (
    Conflict,
    FeedlogError,
    InvalidArgument,
    NotFound,
    StaleLength,
    Unavailable,
    Unsupported,
)
from feedlog.log import consistency, merkle, retention
from feedlog.log.core import Segment
from feedlog.log.feed import Feed, Write
from feedlog.log.timestamps import TimestampPolicy, format_duration
from feedlog.pb import feeds_pb2 as pb
from feedlog.pb import feeds_pb2_grpc as pb_grpc
from feedlog.replication import wire

from .auth import Guard
from .events import event
from .flow import InFlight
from .gossip import GossipDoor
from .group_commit import GroupCommitter, Result
from .host import FeedHost, HostedFeed
from .rpc import abort as _abort
from .rpc import system_error, unary

DEFAULT_MESSAGE_BYTES = 1 << 20
MAX_MESSAGE_BUDGET = 16 << 20
#: room in a message for what `segments` does not count: the roots of the first message and its framing
MESSAGE_HEADROOM = 16 << 10
MAX_PUT_ENTRIES = 10_000
#: what one PutStream may hold at once: the entries of the requests it submitted and their results,
#: until each ack is taken (a request larger than this alone is taken when the stream holds nothing)
PUT_STREAM_BYTES = 16 << 20
#: what a PutStream counts per request, and per entry beyond its key and value: the entry's `Write`,
#: its policy, its result (measured: ~2x the bytes of small entries on the wire were held)
REQUEST_BYTES = 512
ENTRY_BYTES = 320
WAIT_SLICE = 0.5  # how often a waiting stream checks that its client and the server are still there

F = TypeVar("F", bound=Callable[..., Any])


def streaming(fn: F) -> F:
    """Errors of a response stream as status codes (the stream cap is the server's: rpc.StreamCap)."""

    @functools.wraps(fn)
    def wrapper(
        self: FeedsService, request: Message | Iterator[Message], context: grpc.ServicerContext
    ) -> Iterator[Message | bytes]:
        try:
            yield from fn(self, request, context)
        except FeedlogError as e:
            _abort(context, e)
        except ValueError as e:  # protobuf rejecting a field value
            _abort(context, InvalidArgument(str(e)))
        except OSError as e:
            _abort(context, system_error(e, fn.__name__))

    return wrapper  # type: ignore[return-value]


class FeedsService(pb_grpc.FeedsServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(
        self,
        host: FeedHost,
        *,
        stopping: threading.Event | None = None,
        in_flight: InFlight | None = None,
        max_message_bytes: int = MAX_MESSAGE_BUDGET,
        guard: Guard | None = None,
        put_stream_bytes: int = PUT_STREAM_BYTES,
        compact_every_ms: int | None = None,
    ) -> None:
        self.host = host
        #: the schedule of the peer's compaction, told in GetInfo (the deadline `feedlog info` prints)
        self.compact_every_ms = compact_every_ms
        self.guard = guard or Guard()  # no credentials configured: no server-side writes
        self.in_flight = in_flight or InFlight()
        self.max_message_bytes = max_message_bytes  # the server's send limit
        self.stopping = stopping or threading.Event()
        self.put_stream_bytes = put_stream_bytes
        self.gossip = GossipDoor(host, self.guard)  # issue 40: the Gossip RPC's checks and rate limit

    # ---- helpers --------------------------------------------------------------------------

    def _find(self, fid: pb.FeedId) -> HostedFeed:
        which = fid.WhichOneof("id")
        if which is None:
            raise InvalidArgument("name the feed by key or discovery_key")
        raw = wire.check_key(getattr(fid, which), which.replace("_", " "))
        return self.host.get(raw) if which == "key" else self.host.by_discovery_key(raw)

    def _info(self, hf: HostedFeed, with_key: bool) -> pb.FeedInfo:
        f = hf.feed
        m = pb.FeedInfo(
            key=hf.key if with_key else b"",
            discovery_key=hf.discovery_key,
            state=wire.state_pb(f.core.state),
            byte_length=f.core.byte_length,
            content_type=f.content_type,
            writable=hf.committer is not None,
            header=(f.core.get(0) or b"") if f.length else b"",
        )
        if f.settings_known:  # the writer's settings, for `info grpc://` and what a clone keeps
            m.timestamps = str(f.settings.timestamps)
            m.ttl = format_duration(f.settings.ttl_ms) if f.settings.ttl_ms else ""
        if f.core.min_ts:
            m.min_timestamp = f.core.min_ts
        if f.core.max_ts:
            m.max_timestamp = f.core.max_ts
        if self.compact_every_ms is not None:
            m.compact_every_ms = self.compact_every_ms
        if hf.fork is not None:
            m.fork_proof.CopyFrom(wire.fork_proof_pb(hf.fork))
        return m

    def _budget(self, requested: int) -> int:
        """Bytes of segments per message: what the reader asked for, within what this server may send."""
        return max(
            1, min(requested or DEFAULT_MESSAGE_BYTES, MAX_MESSAGE_BUDGET, self.max_message_bytes - MESSAGE_HEADROOM)
        )

    def _response(self, hf: HostedFeed, pos: int, end: int, budget: int, roots: bool) -> tuple[pb.ReadResponse, int]:
        """The next message from `pos` (no segments if nothing is there), and where the one after starts.

        A block whose payload `retention.keeps` refuses now (past its signed expiry) goes out as
        cleared, its leaf node only, whether compaction cleared it here yet or not (issue 37).
        """
        segs = hf.feed.core.segments(pos, end, budget, check=False)  # the reader verifies every block it stores
        segs = withheld(hf.feed, segs)
        resp = pb.ReadResponse(segments=[wire.segment_pb(s) for s in segs])
        if roots and segs:
            resp.roots.extend(wire.node_pb(n) for n in merkle.nodes_for_roots(pos, hf.feed.core.node))
        return resp, segs[-1].end if segs else pos

    def _messages(
        self, hf: HostedFeed, pos: int, end: int, budget: int, roots: bool, context: grpc.ServicerContext
    ) -> Generator[bytes, None, int]:
        """Encoded messages from `pos` to `end`, each built once the previous one was taken, within the budget.

        grpc pulls the next message only when the previous send completed, so
        the hold around the yield spans building and sending one message. The
        message is yielded encoded (rpc.serialize passes bytes through), so a
        stream holds one copy of it, not the message and its encoding.
        Returns where the next message would start.
        """
        while pos < end and context.is_active():
            with self.in_flight.hold(budget + MESSAGE_HEADROOM, context, self.stopping) as h:
                start = pos
                resp, pos = self._response(hf, pos, end, budget, roots)
                raw = resp.SerializeToString()
                del resp
                self.in_flight.shrink(h, len(raw))
                if len(raw) > self.max_message_bytes:  # only a lone block can be: larger than this server may send
                    raise Unsupported(
                        f"block {start} of feed {hf.key.hex()} is too large for one message of this peer"
                        f" ({len(raw)} bytes encoded, limit {self.max_message_bytes}; see serve --max-message-bytes)"
                    )
                roots = False
                yield raw
                del raw  # taken: hold nothing while waiting for the budget again
        return pos

    # ---- unary ----------------------------------------------------------------------------

    @unary
    def GetInfo(self, request: pb.GetInfoRequest, context: grpc.ServicerContext) -> pb.FeedInfo:
        hf = self._find(request.feed)
        info = self._info(hf, request.feed.WhichOneof("id") == "key")
        if request.HasField("consistency_from") and request.consistency_from <= info.state.length:
            # issue 40: from the caller's length to the state just reported (nodes below it never change)
            proof = consistency.prove(request.consistency_from, info.state.length, hf.feed.core.node)
            info.consistency.CopyFrom(wire.consistency_pb(proof))
        return info

    @unary
    def Gossip(self, request: pb.GossipRequest, context: grpc.ServicerContext) -> pb.GossipResponse:
        return self.gossip.answer(request, context)

    @unary
    def Create(self, request: pb.CreateRequest, context: grpc.ServicerContext) -> pb.FeedInfo:
        self.guard.creates.charge(self.guard.writer(context, "Create"))
        hf = self.host.create(request.content_type, request.timestamps, request.ttl or None)
        return self._info(hf, True)

    @unary
    def Proof(self, request: pb.ProofRequest, context: grpc.ServicerContext) -> pb.ProofResponse:
        feed = self._find(request.feed).feed
        proof = feed.core.proof(request.seq)
        if retention.dropped(feed.content_type, proof.seq, [proof.block], feed.clock.now_ms()):
            raise NotFound(f"block {proof.seq} has expired: this peer no longer serves its payload")
        return wire.proof_pb(proof)

    @unary
    def Append(self, request: pb.AppendRequest, context: grpc.ServicerContext) -> pb.AppendResponse:
        return self._append(request, context)

    def _append(self, request: pb.AppendRequest, context: grpc.ServicerContext) -> pb.AppendResponse:
        principal = self.guard.appender(context)
        key = wire.check_key(request.key)
        blocks = list(request.blocks)
        try:
            hf = self.host.get(key)
        except NotFound:
            if request.expected_length != 0:
                raise
            self.guard.may_create(context, principal, key)
            hf = self.host.accept(
                key,
                blocks,
                request.signature,
                request.fork,
                authorized=True,
                stranger=principal is None,
                timestamps=request.timestamps,
                ttl=request.ttl,
            )
        hf.refuse_forked()  # issue 40: a feed proven forked takes no more appends
        try:
            state = hf.feed.append_with_signature(request.expected_length, blocks, request.signature, fork=request.fork)
        except Conflict as e:
            length = hf.feed.length
            if length != request.expected_length:  # a stale writer: tell it where the feed is now
                raise StaleLength(str(e), current_length=length) from None
            raise
        hf.notify()
        return pb.AppendResponse(state=wire.state_pb(state))

    @unary
    def Put(self, request: pb.PutRequest, context: grpc.ServicerContext) -> pb.PutResponse:
        self.guard.writer(context, "Put")
        committer, writes = self._checked(request)
        # this thread waits for the answer anyway: it leads the group commit when its turn comes
        return self._put_response(committer.put(writes, context.time_remaining()))

    def _checked(self, request: pb.PutRequest) -> tuple[GroupCommitter, list[Write]]:
        """The committer of the request's feed and its entries, checked as that feed takes them."""
        hf = self.host.get(wire.check_key(request.feed))
        hf.refuse_forked()
        committer = hf.committer_or_raise()
        if len(request.entries) > MAX_PUT_ENTRIES:
            raise InvalidArgument(f"{len(request.entries)} entries in one request; the limit is {MAX_PUT_ENTRIES}")
        writes = [write_of(p) for p in request.entries]
        hf.feed.check(writes)
        return committer, writes

    def _submit(self, request: pb.PutRequest) -> Future[Result]:
        """Queue the request's entries for the feed's next group commit (a pipelined caller)."""
        committer, writes = self._checked(request)
        return committer.submit(writes)

    def _put_response(self, result: Result) -> pb.PutResponse:
        appended, state = result
        resp = pb.PutResponse(state=wire.state_pb(state))
        for a in appended:
            m = resp.appended.add(seq=a.seq)
            if a.timestamp is not None:
                m.timestamp = a.timestamp
            if a.expires_at is not None:
                m.expires_at = a.expires_at
        return resp

    # ---- streams --------------------------------------------------------------------------

    @streaming
    def AppendStream(
        self, request_iterator: Iterator[pb.AppendRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.AppendResponse]:
        for request in request_iterator:
            if self.stopping.is_set():
                raise Unavailable("the peer is shutting down; reconnect to it or another peer")
            yield self._append(request, context)

    @streaming
    def PutStream(
        self, request_iterator: Iterator[pb.PutRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.PutResponse]:
        principal = self.guard.writer(context, "PutStream")
        # a pump thread submits requests as they arrive (pipelining); acks go back in order. What the
        # stream holds (entries submitted, then their results, until their ack is taken) is bounded
        # in bytes: a client that stops reading acks stops the pump, not the server's memory.
        acks: queue.Queue[tuple[Future[Result], int] | FeedlogError | None] = queue.Queue()
        held = _StreamBudget(self.put_stream_bytes)
        gone = threading.Event()  # the stream ended (its client went away, or an error): the pump stops

        def alive() -> bool:
            return not gone.is_set() and context.is_active()

        def pump() -> None:
            try:
                for request in request_iterator:
                    if self.stopping.is_set():  # what was submitted is still acknowledged, then the stream ends
                        raise Unavailable("the peer is shutting down; reconnect to it or another peer")
                    self.guard.writes.charge(principal)
                    weight = put_weight(request)
                    if not held.take(weight, alive):
                        return
                    try:
                        fut = self._submit(request)
                    except BaseException:
                        held.give(weight)
                        raise
                    del request  # the committer holds the entries now; the message is not needed
                    acks.put((fut, weight))
            except FeedlogError as e:  # a malformed or refused request ends the stream with its status
                acks.put(e)
                return
            except Exception:  # the client went away: iteration raises; the loop below notices
                pass
            acks.put(None)

        threading.Thread(target=pump, name="put-stream", daemon=True).start()
        try:
            while True:
                try:
                    item = acks.get(timeout=WAIT_SLICE)
                except queue.Empty:
                    if not context.is_active():
                        return
                    if self.stopping.is_set():  # an idle stream: everything submitted was acknowledged
                        raise Unavailable("the peer is shutting down; reconnect to it or another peer") from None
                    continue
                if item is None:
                    return
                if isinstance(item, FeedlogError):
                    raise item
                fut, weight = item
                response = self._put_response(fut.result())
                del fut, item
                held.give(weight)
                yield response
        finally:
            gone.set()  # wakes a pump waiting for room; one blocked reading the request stream ends with it

    @streaming
    def Read(self, request: pb.ReadRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        hf = self._find(request.feed)
        length = hf.feed.length
        end = request.end or length
        if request.start > end or end > length:
            raise InvalidArgument(f"range {request.start}..{end} does not fit the feed (length {length})")
        pos, budget, roots = request.start, self._budget(request.max_message_bytes), request.with_roots
        # to the end of the batch holding end - 1: the reader needs that batch's signature
        stop = hf.feed.core.batch_end(end - 1) if end > pos else pos
        hf.refuse_forked(stop)  # issue 40: nothing past a proven fork point
        yield from self._messages(hf, pos, stop, budget, roots, context)

    @streaming
    def Subscribe(self, request: pb.SubscribeRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        hf = self._find(request.feed)
        pos, budget, roots = request.start, self._budget(request.max_message_bytes), request.with_roots
        event("subscribe", feed=hf.key.hex(), start=pos, peer=context.peer())
        while context.is_active() and not self.stopping.is_set():
            hf.refuse_forked()  # issue 40: a follower of a feed proven forked is told so, with the proof in GetInfo
            length = hf.feed.length
            if length <= pos:
                hf.wait_beyond(pos, WAIT_SLICE)
                continue
            after = yield from self._messages(hf, pos, length, budget, roots, context)
            roots = roots and after == pos
            pos = after


def withheld(feed: Feed, segs: list[Segment]) -> list[Segment]:
    """`segs` with the blocks whose payloads this copy no longer keeps (`retention.dropped`, by the
    feed's clock) as cleared leaves: the same tree, so the reader still verifies the batch."""
    if not segs:
        return segs
    now = feed.clock.now_ms()
    out = []
    for seg in segs:
        gone = retention.dropped(feed.content_type, seg.start, seg.blocks, now)
        if not gone:
            out.append(seg)
            continue
        blocks = list(seg.blocks)
        for k in gone:
            blocks[k] = None
        leaves = sorted([*seg.cleared, *(feed.core.node(2 * (seg.start + k)) for k in gone)])
        out.append(Segment(seg.start, blocks, leaves, seg.state))
    return out


def put_weight(request: pb.PutRequest) -> int:
    """About what a PutStream holds for `request` until its ack is taken: its entries' keys (a str of
    up to 4 bytes a character, and its UTF-8 form) and values, then their results."""
    return REQUEST_BYTES + sum(8 * len(p.key) + len(p.value) + 16 * len(p.stat) + ENTRY_BYTES for p in request.entries)


class _StreamBudget:
    """The bytes one PutStream holds, bounded: `take` waits for room (any amount when nothing is held)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    def take(self, n: int, alive: Callable[[], bool]) -> bool:
        """Reserve `n` bytes; False if `alive()` turns false while waiting for them."""
        with self._cond:
            while self.used and self.used + n > self.limit:
                if not alive():
                    return False
                self._cond.wait(WAIT_SLICE)
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


def write_of(p: pb.Put) -> Write:
    value: bytes | dict[str, int] = dict(p.stat) if p.stat else p.value
    policy = TimestampPolicy.parse(p.timestamps) if p.timestamps else None
    if p.forget:  # a withdrawal (issue 37) carries nothing but its key: anything else is refused, not dropped
        if p.value or p.stat or p.ttl_ms:
            raise InvalidArgument(f"a forget of key {p.key[:100]!r} takes no value, stat or TTL")
        return Write(p.key, None, True, None, policy, forget=True)
    return Write(p.key, None if p.deleted else value, p.deleted, p.ttl_ms or None, policy, p.exact_expiry)
