"""Peers over real gRPC on loopback: replication, resumption, signed appends, group commit, bad input."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from feedlog import rpc
from feedlog.clock import SystemClock
from feedlog.errors import (
    Corruption,
    InvalidArgument,
    NotFound,
    ReadOnly,
    SignatureError,
    StaleLength,
    Unavailable,
)
from feedlog.log import entries, merkle
from feedlog.log.crypto import Signer, discovery_key
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import verify_proof
from feedlog.pb import feeds_pb2
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone, pull, push
from feedlog.rpc import Address, Tls
from feedlog_server.app import PeerServer, ServerTls
from feedlog_server.host import FeedHost
from feedlog_server.rpc import rpc_handler
from feedlog_server.service import FeedsService
from tests.conftest import wait_until

from .certs import make_pki
from .conftest import KP, OTHER, local_feed, same_state

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]


def state_of(peer: PeerServer, key: bytes) -> pb.SignedState:
    with FeedClient(peer.address, timeout=5) as c:
        return c.info(key).state


def length_on(peer: PeerServer, key: bytes) -> int:
    try:
        return int(state_of(peer, key).length)
    except NotFound:
        return -1


# ---- replication -----------------------------------------------------------------------------


def test_three_peer_chain_replicates_while_writes_continue(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    key = clients(a).create(timestamps="exact").key
    b = peers("b", follow=[Address(a.address, key.hex())])
    c = peers("c", follow=[Address(b.address, key.hex())])
    writer = clients(a)
    for i in range(50):  # writes while B and C are catching up and tailing
        writer.put(key, [Write(f"/k{i}", b"v%d" % i), Write(f"/j{i}", b"w")])
    with writer.producer(key) as p:
        futs = [p.put(Write(f"/p{i}", b"x")) for i in range(500)]
    assert sorted(f.result().seq for f in futs) == list(range(101, 601))
    final = state_of(a, key)
    wait_until(lambda: length_on(c, key) == final.length, what="C to catch up through B")
    assert same_state(state_of(b, key), final) and same_state(state_of(c, key), final)
    # C's copy is complete and checks out on its own
    assert c.host.get(key).feed.verify().length == final.length
    assert [r.key for r in c.host.get(key).feed.records(599, 601)] == ["/p498", "/p499"]


def test_follower_resumes_from_its_length_after_the_upstream_dies(
    peers: Peers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local_feed(tmp_path / "a" / "mine", n=40).close()
    a = peers("a")
    port = a.port
    b = peers("b", follow=[Address(a.address, KP.public_key.hex())])
    wait_until(lambda: length_on(b, KP.public_key) == 41, what="first sync")
    a.stop(grace=0)  # the connection dies under the follower
    with Feed.open(tmp_path / "a" / "mine") as f:  # the author writes on while the peer is down
        f.append([Write(f"/late{i}", b"z") for i in range(9)])
    with caplog.at_level(logging.INFO, logger="feedlog.server"):
        a2 = PeerServer(tmp_path / "a", f"127.0.0.1:{port}").start()  # same port: the follower's address
        try:
            wait_until(lambda: length_on(b, KP.public_key) == 50, what="resume")
            assert same_state(state_of(b, KP.public_key), state_of(a2, KP.public_key))
            starts = [r.getMessage() for r in caplog.records if '"event":"subscribe"' in r.getMessage()]
            assert any('"start":41' in m for m in starts), starts  # resumed, did not start over
        finally:
            a2.stop(grace=0)


def test_clone_pull_and_push_leave_identical_signed_states(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    a = peers("a")
    with local_feed(tmp_path / "author", n=25, batch=7) as author:
        assert push(tmp_path / "author", Address(a.address), token=a.token).length == 26
        assert push(tmp_path / "author", Address(a.address), token=a.token).blocks == 0  # nothing new
        url = Address(a.address, author.key.hex())
        assert clone(url, tmp_path / "copy").length == 26
        author.append([Write("/more", b"1"), Write("/more", b"2")])
        assert push(tmp_path / "author", Address(a.address), token=a.token).blocks == 2
        assert pull(tmp_path / "copy").blocks == 2
        with Feed.open(tmp_path / "copy", writable=False) as copy:
            assert same_state(copy.core.state, author.core.state)
            latest = copy.get("/more")
            assert latest is not None and latest.value == b"2"
            assert copy.info()["max_timestamp"] == author.info()["max_timestamp"]
    with pytest.raises(NotFound, match="not a clone"):
        pull(tmp_path / "author")
    with pytest.raises(NotFound):
        clone(Address(a.address, OTHER.public_key.hex()), tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_a_peer_serving_a_tampered_block_is_rejected_and_named(
    peers: Peers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local_feed(tmp_path / "evil" / "f", n=30, batch=10).close()

    class Tampering(FeedsService):  # type: ignore[misc]
        def Subscribe(self, request, context):
            for raw in super().Subscribe(request, context):  # messages come encoded (they are held that way)
                resp = feeds_pb2.ReadResponse.FromString(raw)
                for seg in resp.segments:
                    for k in range(len(seg.blocks)):
                        if seg.start + k == 15:
                            seg.blocks[k] = seg.blocks[k].replace(b"value", b"VALUE")
                yield resp

    host = FeedHost(tmp_path / "evil")
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((rpc_handler(Tampering(host), feeds_pb2, "Feeds"),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with caplog.at_level(logging.INFO, logger="feedlog.server"):
            b = peers("b", follow=[Address(f"127.0.0.1:{port}", KP.public_key.hex())])
            wait_until(lambda: b.followers[0].rejections >= 1, what="rejection")
        hosted = b.host.get(KP.public_key).feed
        assert hosted.length == 11  # the header batch and the first signed batch: verified, kept
        assert hosted.verify().length == 11
        rejected = [r.getMessage() for r in caplog.records if "follow_rejected" in r.getMessage()]
        assert rejected and f"127.0.0.1:{port}" in rejected[0] and "11..20" in rejected[0]
    finally:
        server.stop(0)
        host.close()


# ---- the peer's own reads ------------------------------------------------------------------------


def test_read_subscribe_proof_and_discovery_key(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    local_feed(tmp_path / "a" / "f", n=20, batch=6).close()
    a = peers("a")
    c = clients(a)
    key = KP.public_key
    got = [b for batch in c.read_verified(key, 3, 9) for b in batch.blocks]
    assert [entries.decode_entry("entry", 3 + i, b or b"").key for i, b in enumerate(got)] == [
        f"/k{i}" for i in range(3, 9)
    ]
    proof = c.proof(key, 7)
    verify_proof(proof, key)
    with pytest.raises(Corruption):
        verify_proof(type(proof)(proof.seq, proof.block + b"!", proof.path, proof.roots, proof.state), key)
    anon = c.info(discovery_key(key), by_discovery_key=True)
    assert anon.key == b"" and anon.state.length == 21  # asking by discovery key never reveals the key
    assert entries.decode_header(c.info(key).header) == "entry"
    with pytest.raises(InvalidArgument, match="range"):
        list(c.read(key, 5, 99))
    with pytest.raises(NotFound):
        c.proof(key, 21)

    sub = c.subscribe(key, 19, with_roots=True)
    seen: list[int] = []

    def consume() -> None:
        for batch in sub.verified(key, 19):
            seen.extend(range(batch.start, batch.start + len(batch.blocks)))
            if len(seen) >= 4:
                return

    t = threading.Thread(target=consume)
    t.start()
    author_peer_writes(a, key)
    t.join(10)
    sub.cancel()
    assert seen[:4] == [19, 20, 21, 22]


def author_peer_writes(a: PeerServer, key: bytes) -> None:
    """Append two entries as the author would remotely: sign here, send with Append."""
    hf = a.host.get(key)
    start = hf.feed.length
    blocks = [
        entries.encode_entry("entry", f"/live{i}", b"x", deleted=False, timestamp=None, expires_at=None)
        for i in range(2)
    ]
    sig = sign_over(hf, blocks)
    with FeedClient(a.address) as c:
        c.append(key, start, blocks, sig)


def sign_over(hf, blocks: list[bytes], signer: Signer | None = None, fork: int = 0) -> bytes:
    core = hf.feed.core
    _, roots = merkle.append_leaves(core.roots(), core.length, blocks)
    st = merkle.TreeState(core.length + len(blocks), fork, merkle.roots_hash(roots), b"")
    return (signer or Signer(KP.seed or b"")).sign(st.signable())


# ---- signed appends: only the key holder, only at the right length ------------------------------------


def test_appends_only_from_the_key_holder_at_the_current_length(peers: Peers, tmp_path: Path) -> None:
    local_feed(tmp_path / "a" / "f", n=5).close()
    a = peers("a")
    key = KP.public_key
    hf = a.host.get(key)
    before = hf.feed.core.state
    blocks = [entries.encode_entry("entry", "/new", b"v", deleted=False, timestamp=1, expires_at=None)]
    good = sign_over(hf, blocks)
    stub = FeedClient(a.address).stub

    def append(**kw: Any) -> grpc.StatusCode:
        req: dict[str, Any] = dict(key=key, expected_length=6, blocks=blocks, signature=good) | kw
        try:
            stub.Append(pb.AppendRequest(**req), timeout=5)
        except grpc.RpcError as e:
            assert e.details()  # every refusal says what was wrong
            return e.code()
        return grpc.StatusCode.OK

    assert append(signature=bytes(64)) == grpc.StatusCode.UNAUTHENTICATED  # forged
    assert (
        append(signature=sign_over(hf, blocks, Signer(OTHER.seed or b""))) == grpc.StatusCode.UNAUTHENTICATED
    )  # wrong key
    assert append(blocks=[blocks[0][:-1]]) == grpc.StatusCode.UNAUTHENTICATED  # truncated block
    assert append(signature=good[:10]) == grpc.StatusCode.UNAUTHENTICATED
    garbage = [b"\xff\x00 not an entry"]
    assert append(blocks=garbage, signature=sign_over(hf, garbage)) == grpc.StatusCode.INVALID_ARGUMENT
    assert append(blocks=[]) == grpc.StatusCode.INVALID_ARGUMENT
    assert append(key=b"short") == grpc.StatusCode.INVALID_ARGUMENT
    try:
        stub.Append(pb.AppendRequest(key=key, expected_length=3, blocks=blocks, signature=good), timeout=5)
        raise AssertionError("a stale writer appended")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "length 6" in e.details()
        assert dict(e.trailing_metadata())[rpc.LENGTH_METADATA] == "6"
    assert hf.feed.core.state == before  # nothing stored by any refusal
    assert append() == grpc.StatusCode.OK
    assert hf.feed.length == 7 and hf.feed.get("/new").value == b"v"
    with FeedClient(a.address) as c, pytest.raises(StaleLength, match="length 7") as stale:
        c.append(key, 6, blocks, good)
    assert stale.value.current_length == 7
    # a brand-new feed can be pushed only by its key holder, and refusal creates nothing
    with FeedClient(a.address, token=a.token) as c, pytest.raises(SignatureError):
        c.append(OTHER.public_key, 0, [entries.encode_header("entry")], bytes(64))
    assert not (tmp_path / "a" / OTHER.public_key.hex()).exists()


def test_oversized_message_is_refused_with_resource_exhausted(peers: Peers) -> None:
    a = peers("a", max_message_bytes=64 << 10)
    stub = FeedClient(a.address).stub
    with pytest.raises(grpc.RpcError) as e:
        stub.Append(pb.AppendRequest(key=KP.public_key, blocks=[bytes(100_000)], signature=bytes(64)), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(a.host) == 0


METHODS = pb.DESCRIPTOR.services_by_name["Feeds"].methods


def test_garbage_bytes_on_every_rpc_get_a_clear_status_and_change_nothing(peers: Peers, tmp_path: Path) -> None:
    local_feed(tmp_path / "a" / "f", n=5).close()
    a = peers("a")
    before = a.host.get(KP.public_key).feed.core.state
    rng = random.Random(1234)
    allowed = {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
    }
    seen: dict[str, set[grpc.StatusCode]] = {}
    channel = grpc.insecure_channel(a.address)
    try:
        for n in range(400):
            m = METHODS[n % len(METHODS)]
            path = f"/{pb.DESCRIPTOR.services_by_name['Feeds'].full_name}/{m.name}"
            raw = rng.randbytes(rng.randint(1, 80))
            try:  # no serializers: the bytes go on the wire as they are
                if m.client_streaming:
                    list(channel.stream_stream(path)(iter([raw, raw]), timeout=5))
                elif m.server_streaming:
                    list(channel.unary_stream(path)(raw, timeout=5))
                else:
                    channel.unary_unary(path)(raw, timeout=5)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
                assert e.details(), (m.name, raw)
            seen.setdefault(m.name, set()).add(code)
            if m.name == "Create":
                continue  # an empty/default CreateRequest is valid: it makes a new feed
            assert code in allowed or (code == grpc.StatusCode.OK and m.server_streaming), (m.name, code, raw)
    finally:
        channel.close()
    assert a.host.get(KP.public_key).feed.core.state == before
    assert all(grpc.StatusCode.INTERNAL not in c and grpc.StatusCode.UNKNOWN not in c for c in seen.values()), seen


# ---- group commit --------------------------------------------------------------------------------------


def test_concurrent_puts_are_group_committed_without_loss_or_duplicates(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    key = clients(a).create(timestamps="exact").key
    results: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def unary_client(n: int) -> None:
        try:
            with FeedClient(a.address, timeout=10, token=a.token) as c:
                for i in range(25):
                    (ap,) = c.put(key, [Write(f"/u{n}/{i}", b"%d" % i)])
                    with lock:
                        results[f"/u{n}/{i}"] = ap.seq
        except BaseException as e:
            errors.append(e)

    def producer_client(n: int) -> None:
        try:
            with FeedClient(a.address, timeout=10, token=a.token) as c, c.producer(key) as p:
                futs = {f"/p{n}/{i}": p.put(Write(f"/p{n}/{i}", b"%d" % i)) for i in range(600)}
                p.flush()
            with lock:
                results.update({k: f.result().seq for k, f in futs.items()})
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=unary_client, args=(n,)) for n in range(14)]
    threads += [threading.Thread(target=producer_client, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    total = 14 * 25 + 2 * 600
    assert sorted(results.values()) == list(range(1, total + 1))  # every seq once: none lost, none doubled
    feed = a.host.get(key).feed
    assert all(feed.record(seq).key == k for k, seq in results.items())
    committer = a.host.get(key).committer
    assert committer is not None and committer.batches < 14 * 25 + 2  # concurrent callers shared fsyncs


def test_put_errors_are_per_request(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    c = clients(a)
    key = c.create().key
    with pytest.raises(InvalidArgument, match="non-empty"):
        c.put(key, [Write("", b"x")])
    with pytest.raises(InvalidArgument, match="TTL"):
        c.put(key, [Write("/k", b"x", ttl_ms=-5)])
    assert c.put(key, [Write("/k", b"x")])[0].seq == 1  # the refusals left no trace
    with pytest.raises(NotFound):
        c.put(KP.public_key, [Write("/k", b"x")])


def test_a_peer_put_asks_for_an_exact_expiry(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    c = clients(a)
    key = c.create(timestamps="off").key
    before = SystemClock().now_ms()
    vague, exact = c.put(key, [Write("/v", b"x", ttl_ms=60_000), Write("/e", b"x", ttl_ms=60_000, exact_expiry=True)])
    after = SystemClock().now_ms()
    assert vague.timestamp is None and exact.timestamp is None
    assert vague.expires_at is not None and vague.expires_at % 3_600_000 == 0  # the hour, nothing finer
    assert vague.expires_at >= after + 60_000
    assert exact.expires_at is not None and before + 60_000 <= exact.expires_at <= after + 60_000


def test_a_feed_without_its_secret_key_refuses_puts(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    b = peers("b")
    key = clients(a).create().key
    clients(a).put(key, [Write("/x", b"1")])
    assert clone(Address(a.address, key.hex()), b.data / "copy").length == 2
    b.stop(grace=0)
    b2 = peers("b")  # reopens b's data, now holding the copy
    with pytest.raises(ReadOnly, match="secret key"):
        clients(b2).put(key, [Write("/y", b"2")])


# ---- TLS -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_and_mutual_tls(peers: Peers, pki, tmp_path: Path) -> None:
    local_feed(tmp_path / "s" / "f", n=3).close()
    local_feed(tmp_path / "m" / "f", n=3).close()
    server_tls = ServerTls(pki.server_cert.read_bytes(), pki.server_key.read_bytes())
    s = peers("s", tls=server_tls)
    key = KP.public_key

    def length(peer: PeerServer, tls: Tls | None) -> int:
        with FeedClient(peer.address, tls=tls, timeout=3) as c:
            return int(c.info(key).state.length)

    assert length(s, Tls.from_files(str(pki.ca))) == 4
    with pytest.raises(Unavailable):
        length(s, None)  # plaintext to a TLS port
    with pytest.raises(Unavailable):
        length(s, Tls.from_files(str(pki.other_ca)))  # a certificate we do not trust

    m = peers("m", tls=ServerTls(pki.server_cert.read_bytes(), pki.server_key.read_bytes(), pki.ca.read_bytes()))
    assert length(m, Tls.from_files(str(pki.ca), str(pki.client_cert), str(pki.client_key))) == 4
    with pytest.raises(Unavailable):
        length(m, Tls.from_files(str(pki.ca)))  # no client certificate
    with pytest.raises(InvalidArgument):
        Tls.from_files(str(pki.ca), str(pki.client_cert))


def test_health_and_reflection_are_served(peers: Peers) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    a = peers("a")
    with grpc.insecure_channel(a.address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="feedlog.feeds.Feeds"), timeout=5
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        names = {
            s.name for r in stub.ServerReflectionInfo(iter([req]), timeout=5) for s in r.list_services_response.service
        }
        assert "feedlog.feeds.Feeds" in names and "grpc.health.v1.Health" in names


def test_too_many_streams_get_resource_exhausted(peers: Peers, clients: Clients) -> None:
    a = peers("a", max_streams=2, max_streams_per_client=2)  # this test's clients are all one (loopback)
    key = clients(a).create().key
    subs = [clients(a).subscribe(key, 0) for _ in range(2)]
    its: list[Iterator[pb.ReadResponse]] = [iter(s) for s in subs]
    for it in its:
        next(it)  # both streams are open and served
    with pytest.raises(Unavailable, match="too many open streams"):
        next(iter(clients(a).subscribe(key, 0)))
    assert clients(a).info(key).state.length == 1  # unary calls still get through
    for s in subs:
        s.cancel()


def test_a_subscriber_that_never_reads_blocks_neither_writers_nor_other_readers(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    c = clients(a)
    key = c.create().key
    stalled = clients(a).subscribe(key, 0)
    stalled_it = iter(stalled)
    next(stalled_it)  # the stream is open; from here on nobody reads it
    t = time.monotonic()
    big = b"x" * 4096
    for i in range(100):  # ~4 MB: far past any flow-control window
        c.put(key, [Write(f"/big{i}/{j}", big) for j in range(10)])
    assert time.monotonic() - t < 20
    got = sum(len(b.blocks) for b in clients(a).read_verified(key, 0))
    assert got == 1001
    stalled.cancel()


def test_huge_inputs_are_not_echoed_back_whole(peers: Peers) -> None:
    """A 100 KB bad value comes back as INVALID_ARGUMENT with a short message, not as an opaque
    RESOURCE_EXHAUSTED from an oversized status (issue 13 item 15)."""
    a = peers("a")
    with FeedClient(a.address, token=a.token) as c:
        key = c.create().key
    auth = [("authorization", f"Bearer {a.token}")]
    huge = "x" * 100_000
    calls = [
        ("Put", pb.PutRequest(feed=key, entries=[pb.Put(key="/k", value=b"v", timestamps=huge)])),
        ("Create", pb.CreateRequest(timestamps=huge)),
        ("Create", pb.CreateRequest(content_type=huge)),
    ]
    with grpc.insecure_channel(a.address) as ch:
        for method, request in calls:
            call = ch.unary_unary(f"/feedlog.feeds.Feeds/{method}", request_serializer=type(request).SerializeToString)
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=auth, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert len(err.value.details()) < 2_500
