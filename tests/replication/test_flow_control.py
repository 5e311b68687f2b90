"""A peer's streams under hostile readers and writers (issue 13 items 2, 3, 4 and the server side of 6).

Stalled readers cost the peer one message each and never block other
streams; streams of every kind are capped apart from unary calls; one bad put
fails alone; no message is ever larger than the budget or the send limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from feedlog.errors import InvalidArgument, Unsupported
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.pb import feeds_pb2 as pb
from feedlog.pb import feeds_pb2_grpc as pb_grpc
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone
from feedlog.rpc import Address, channel_options
from feedlog_server.app import PeerServer
from feedlog_server.group_commit import GroupCommitter
from feedlog_server.rpc import stream_client
from feedlog_server.service import MESSAGE_HEADROOM

from ..conftest import load_tool

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]
MiB = 1 << 20
KP = KeyPair.from_seed(bytes([21]) * 32)

# a reader that stops reading as cheaply as an attacker can: no window growth, a 64 KiB window
STALLED = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 64 << 10)]


def bench() -> Any:
    return load_tool("bench/bench_stalled_readers")


def big_feed(path: Path, batches: list[list[int]], kp: KeyPair = KP) -> Feed:
    """A feed whose batches hold entries of the given value sizes (incompressible)."""
    feed = Feed.create(path, key_pair=kp, timestamps="exact", fsync=False)
    n = 0
    for sizes in batches:
        feed.append([Write(f"/k{n + i}", bytes([(n + i) % 251]) * s) for i, s in enumerate(sizes)])
        n += len(sizes)
    return feed


@contextmanager
def stalled_reads(target: str, key: bytes, count: int, **request: Any) -> Iterator[list[Any]]:
    """`count` Read streams on their own connections that take one message (if any) and stop reading."""
    channels = [grpc.insecure_channel(target, options=channel_options() + STALLED) for _ in range(count)]
    calls = [
        pb_grpc.FeedsStub(ch).Read(pb.ReadRequest(feed=pb.FeedId(key=key), **request), timeout=30) for ch in channels
    ]
    try:
        yield calls
    finally:
        for c in calls:
            c.cancel()
        for ch in channels:
            ch.close()


def first_or_error(call: Any) -> grpc.StatusCode | None:
    try:
        next(call)
        return None
    except grpc.RpcError as e:
        return e.code()


# ---- item 2: slow readers ------------------------------------------------------------------------


@pytest.mark.slow
def test_stalled_readers_cost_the_peer_about_one_message_each(tmp_path: Path) -> None:
    # before: every message was built from a read of up to 4096 blocks, whatever the budget
    # (here the whole 24 MiB feed, per stream): 4 readers cost the peer ~100+ MiB
    r = bench().run(mib=24, readers=4, seconds=1.5, root=tmp_path)
    assert r.first == 4
    assert r.peak - r.idle < 24 * MiB, f"idle {r.idle / MiB:.0f} MiB, peak {r.peak / MiB:.0f} MiB"


def test_a_full_in_flight_budget_cancels_the_stalled_reader_not_the_others(
    peers: Peers, clients: Clients, tmp_path: Path
) -> None:
    big_feed(tmp_path / "peer" / "f", [[64 << 10] * 16 for _ in range(12)]).close()  # 12 MiB, 1 MiB batches
    # room for three messages: a stream reserves its budget plus headroom before it builds one
    limit = 3 * (MiB + MESSAGE_HEADROOM)
    peer = peers("peer", max_in_flight_bytes=limit, stall_seconds=1.0)
    with stalled_reads(peer.address, KP.public_key, 3) as stalled:
        assert all(first_or_error(c) is None for c in stalled)
        # each stalled stream soon holds its next message, which nobody takes: no room for a fourth
        deadline = time.monotonic() + 10
        while peer.service.in_flight.used < 2.5 * MiB and time.monotonic() < deadline:
            time.sleep(0.02)
        assert peer.service.in_flight.used >= 2.5 * MiB
        t = time.monotonic()
        c = clients(peer)
        got = sum(len(s.blocks) for m in c.read(KP.public_key, 0) for s in m.segments)
        assert got == 1 + 12 * 16  # a fresh reader still reads everything ...
        assert 1.0 <= time.monotonic() - t < 10  # ... once a reader had stalled for stall_seconds
        codes = [first_or_error(s) for s in stalled]
        assert codes.count(grpc.StatusCode.CANCELLED) == 1  # the oldest, and only as many as needed
        assert codes.count(None) == 2
        assert peer.service.in_flight.used <= limit


# ---- item 3: streams never starve unary calls ---------------------------------------------------


def test_stalled_reads_count_as_streams_and_unary_calls_still_run(
    peers: Peers, clients: Clients, tmp_path: Path
) -> None:
    big_feed(tmp_path / "peer" / "f", [[256 << 10] * 4 for _ in range(8)]).close()  # 8 MiB
    peer = peers("peer", max_streams=2, max_streams_per_client=2)  # a pool of 2 + 32 threads
    c = clients(peer)
    key = c.create(timestamps="exact").key
    with stalled_reads(peer.address, KP.public_key, 40) as calls:
        codes = [first_or_error(call) for call in calls]
        assert codes.count(None) == 2
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 38
        try:
            next(calls[-1])
        except grpc.RpcError as e:
            assert "too many open streams" in (e.details() or "")
        # every thread the 40 streams could have taken: unary calls still find one
        assert c.info(KP.public_key).state.length == 33
        assert c.put(key, [Write("/x", b"1")])[0].seq == 1
        # streams of other services count too; their unary calls still run
        health = health_pb2_grpc.HealthStub(c.channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as watch:
            next(health.Watch(health_pb2.HealthCheckRequest(), timeout=5))
        assert watch.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_one_client_holds_at_most_its_share_of_the_stream_slots(tmp_path: Path) -> None:
    # before: one client with idle Subscribes (no token needed) took every stream slot and shut
    # every other reader and follower out for as long as it kept them open. Two clients here: this
    # machine over IPv4 and over IPv6 (localhost: both loopback addresses, one port)
    peer = PeerServer(tmp_path / "peer", "localhost:0", max_streams=8).start()  # a share of 4, 2 kept free
    v4, v6 = f"127.0.0.1:{peer.port}", f"[::1]:{peer.port}"
    key = FeedClient(v4, token=peer.token, timeout=10).create(timestamps="exact").key
    request = pb.SubscribeRequest(feed=pb.FeedId(key=key), start=2**62)
    hog = grpc.insecure_channel(v4)
    other = FeedClient(v6, timeout=10)
    tails: list[Any] = []
    try:
        idle = [pb_grpc.FeedsStub(hog).Subscribe(request, timeout=30) for _ in range(8)]
        # beyond its share a client takes spare slots, but leaves 2 of the 8 free for others
        assert _until(lambda: sum(call.done() for call in idle) == 2)
        refused = [call for call in idle if call.done()]
        assert all(call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for call in refused)
        assert "too many open streams from this client (6; its share is 4" in (refused[0].details() or "")
        # the other client reads, and tails in the two slots kept free
        assert sum(len(s.blocks) for m in other.read(key, 0) for s in m.segments) == 1
        tails = [other.subscribe(key, 0) for _ in range(2)]
        for t in tails:
            next(iter(t))
        assert sum(call.done() for call in idle) == 2  # the hog keeps its six
    finally:
        for t in tails:
            t.cancel()
        other.close()
        hog.close()
        peer.stop(grace=1)


def test_stream_clients_are_addresses_and_ipv6_prefixes() -> None:
    class Ctx:
        def __init__(self, peer: str) -> None:
            self._peer = peer

        def peer(self) -> str:
            return self._peer

    assert stream_client(Ctx("ipv4:10.1.2.3:5000")) == stream_client(Ctx("ipv4:10.1.2.3:6000")) == "ipv4:10.1.2.3"
    assert stream_client(Ctx("ipv6:[::ffff:10.1.2.3]:5000")) == "ipv4:10.1.2.3"  # dual-stack listener
    a, b = stream_client(Ctx("ipv6:[2001:db8::1]:1")), stream_client(Ctx("ipv6:[2001:db8::ffff:2]:2"))
    assert a == b == "ipv6:2001:db8::/64"  # one host's share of addresses
    assert stream_client(Ctx("ipv6:[2001:db8:0:1::1]:1")) != a
    assert stream_client(Ctx("unix:/run/peer.sock")) == "unix:/run/peer.sock"


# ---- item 4: one bad put fails alone -------------------------------------------------------------


def test_a_put_with_a_huge_ttl_fails_alone(peers: Peers, clients: Clients) -> None:
    peer = peers("peer")
    c = clients(peer)
    key = c.create(timestamps="exact").key
    hostile = Write("/evil", b"x", False, (1 << 64) - 1)

    def innocent(i: int) -> str | None:
        try:
            c.put(key, [Write(f"/k{i}", b"v")])
            return None
        except Exception as e:
            return repr(e)

    def evil(_: int) -> str:
        try:
            c.put(key, [hostile])
        except InvalidArgument as e:
            return str(e)
        return "accepted"

    with ThreadPoolExecutor(24) as pool:
        bad = [pool.submit(evil, i) for i in range(10)]
        failures = [f for f in pool.map(innocent, range(200)) if f is not None]
    assert failures == []
    assert all("TTL" in b.result() for b in bad)
    assert c.info(key).state.length == 201


def _put_stream(peer: PeerServer, requests: Iterator[pb.PutRequest]) -> tuple[grpc.Channel, Any]:
    """A PutStream on its own connection whose client reads acks only when told (STALLED: no window growth)."""
    ch = grpc.insecure_channel(peer.address, options=channel_options() + STALLED)
    call = pb_grpc.FeedsStub(ch).PutStream(requests, metadata=(("authorization", f"Bearer {peer.token}"),))
    return ch, call


def _pumps() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "put-stream"]


def _until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_put_stream_holds_bounded_bytes_while_its_entries_wait(peers: Peers, clients: Clients) -> None:
    # before: the pump submitted up to 256 requests of up to 16 MiB each whatever they weighed
    peer = peers("peer", fsync=False)
    key = clients(peer).create(timestamps="exact").key
    peer.service.put_stream_bytes = 256 << 10
    committer = peer.host.get(key).committer_or_raise()
    value = b"v" * (32 << 10)
    with committer._cond:  # no group is committed until released: what the stream sent stays queued
        committer._busy = True
    requests = (pb.PutRequest(feed=key, entries=[pb.Put(key=f"/k{i}", value=value)]) for i in range(200))
    ch, call = _put_stream(peer, requests)
    try:
        assert _until(lambda: len(committer._queue) >= 7)
        time.sleep(0.5)  # room for more to arrive, were the pump not waiting
        queued = len(committer._queue)
        assert 7 <= queued <= 8, queued  # 256 KiB of 32 KiB entries
    finally:
        with committer._cond:
            committer._busy = False
            committer._cond.notify_all()
    acks = [next(call) for _ in range(200)]
    assert [a.appended[0].seq for a in acks] == list(range(1, 201))
    call.cancel()
    ch.close()


def test_a_put_stream_cancelled_while_its_acks_go_unread_leaves_no_thread(peers: Peers, clients: Clients) -> None:
    # before: the pump blocked forever on a full ack queue once its client stopped reading and left,
    # a thread (and its futures) per such stream, outside the stream cap
    peer = peers("peer", fsync=False)
    key = clients(peer).create(timestamps="exact").key
    peer.service.put_stream_bytes = 64 << 10
    feed = peer.host.get(key).feed
    requests = (pb.PutRequest(feed=key, entries=[pb.Put(key="/k", value=b"v" * 100)] * 10) for _ in range(5000))
    before = len(_pumps())
    ch, call = _put_stream(peer, requests)
    next(call)  # one ack, then the client stops reading
    last = [-1]

    def settled() -> bool:  # the feed stopped growing: the pump waits for room
        time.sleep(0.3)
        n, last[0] = last[0], int(feed.length)
        return n == last[0]

    assert _until(settled)
    assert feed.length < 5000 * 10 + 1
    assert len(_pumps()) == before + 1
    call.cancel()
    ch.close()
    assert _until(lambda: len(_pumps()) == before), "the pump thread outlived its stream"


def test_a_member_refused_inside_a_group_fails_alone(tmp_path: Path) -> None:
    # defence in depth: what passed the check but fails when the group is encoded fails that member only
    feed = Feed.create(tmp_path / "f", timestamps="exact", fsync=False)
    committed = threading.Event()
    gc = GroupCommitter(feed, committed.set)
    try:
        with feed.core.lock:  # the committer waits for the lock: the next submits queue up as one group
            first = gc.submit([Write("/first", b"1")])
            time.sleep(0.05)
            group = [gc.submit([Write(f"/k{i}", b"v")]) for i in range(50)]
            hostile = gc.submit([Write("/evil", b"x", False, (1 << 64) - 1)])
            group += [gc.submit([Write(f"/j{i}", b"v")]) for i in range(50)]
        assert first.result(5)[0][0].seq == 1
        seqs = [f.result(5)[0][0].seq for f in group]
        assert sorted(seqs) == list(range(2, 102))
        with pytest.raises(InvalidArgument, match="TTL"):
            hostile.result(5)
    finally:
        gc.close()
        feed.close()


# ---- item 6: messages within the budget ----------------------------------------------------------


@pytest.mark.parametrize(
    "batches, budget",
    [
        ([[int(0.95 * MiB)], [MiB // 2] * 31], 16 * MiB),  # a 15.5 MiB batch after a 0.95 MiB one
        ([[int(0.95 * MiB)], [MiB // 2] * 31], 0),  # the same at the default budget
        ([[MiB // 4] * 4 for _ in range(20)], 16 * MiB),  # a 16 MiB budget over 1 MiB batches
        ([[6 * MiB], [100] * 3], 64 << 10),  # a block larger than the budget comes alone
    ],
)
def test_large_batches_are_served_within_the_budget_and_clone(
    peers: Peers, clients: Clients, tmp_path: Path, batches: list[list[int]], budget: int
) -> None:
    with big_feed(tmp_path / "peer" / "f", batches) as f:
        want = list(f.core.get_range(0, f.length))
    peer = peers("peer")
    c = FeedClient(peer.address, timeout=30)
    try:
        limit = min(budget or MiB, 16 * MiB)
        got = []
        for m in c.read(KP.public_key, 0, max_message_bytes=budget):
            size = m.ByteSize()
            assert size <= peer.max_message_bytes
            assert size <= limit or len([b for s in m.segments for b in s.blocks]) == 1
            got += [b for s in m.segments for b in s.blocks]
        assert got == [b for _, b in want]
    finally:
        c.close()
    copy = clone(Address(peer.address, KP.public_key.hex()), tmp_path / "copy")
    assert copy.length == len(want)
    with Feed.open(tmp_path / "copy", writable=False) as f:
        assert f.verify().length == len(want)


def test_a_block_larger_than_the_send_limit_is_refused_clearly(peers: Peers, tmp_path: Path) -> None:
    big_feed(tmp_path / "peer" / "f", [[100], [MiB]]).close()
    peer = peers("peer", max_message_bytes=512 << 10)
    with FeedClient(peer.address, timeout=10) as c, pytest.raises(Unsupported, match="too large for one message"):
        list(c.read(KP.public_key, 0))


class _Context:
    """What InFlight asks of a stream's servicer context (a real one exists only inside a call)."""

    def __init__(self) -> None:
        self.cancelled = False

    def is_active(self) -> bool:
        return not self.cancelled

    def cancel(self) -> None:
        self.cancelled = True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def test_a_reader_waiting_for_its_own_message_to_go_out_cancels_no_stalled_reader() -> None:
    """Three stalled streams and a moving reader's message fill the budget; the moving reader's next
    message waits for its previous one to go out instead of cancelling a stalled stream (the budget
    comes back by itself); once that one is old too, the oldest stalled stream goes, and only it."""
    from feedlog_server.flow import Hold, InFlight

    now = [100.0]
    flow = InFlight(4 * MiB, stall=1.0, clock=lambda: now[0])
    contexts = [_Context() for _ in range(4)]
    for k, (ctx, since) in enumerate(zip(contexts, (90.0, 91.0, 92.0, 99.9), strict=True)):
        flow._holds[k] = Hold(MiB, ctx, since)
    flow._used = 4 * MiB
    with flow._cond:
        flow._evict_stalled(MiB)
    assert [c.cancelled for c in contexts] == [False] * 4 and flow.used == 4 * MiB
    now[0] = 101.0  # the moving reader's message was not taken either: it counts as stalled now
    with flow._cond:
        flow._evict_stalled(MiB)
    assert [c.cancelled for c in contexts] == [True, False, False, False] and flow.used == 3 * MiB
