"""Split views end to end (issue 40): a key signs two histories, one per peer; gossip, witnesses and
`verify-fork` catch it with a proof, and hostile gossip marks nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.errors import Corruption, Fork, InvalidArgument, ResourceExhausted
from feedlog.log import consistency, forks
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.log.merkle import TreeState
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.client import FeedClient
from feedlog.replication.witness import judge
from feedlog.rpc import Address
from feedlog_server.app import PeerServer
from feedlog_server.gossip import judge_reply
from tests.conftest import wait_until

from .test_shutdown import free_port

KP = KeyPair.from_seed(bytes([40]) * 32)


def history(path: Path, tag: str, n: int, kp: KeyPair = KP) -> list[TreeState]:
    """A feed of `kp` at `path` with n entries of its own (one batch each); its signed state after each."""
    states = []
    with Feed.create(path, key_pair=kp, timestamps="off") as feed:
        states.append(feed.core.state)
        for i in range(n):
            feed.append([Write(f"/{tag}{i}", tag.encode())])
            states.append(feed.core.state)
    return states


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def forked_info(target: str) -> pb.FeedInfo | None:
    with FeedClient(target, timeout=5) as c:
        info = c.info(KP.public_key)
    return info if info.HasField("fork_proof") else None


@pytest.fixture
def serve_procs(tmp_path: Path) -> Iterator[Callable[..., tuple[str, subprocess.Popen[str]]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(data: Path, *args: str, port: int | None = None) -> tuple[str, subprocess.Popen[str]]:
        port = port or free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "feedlog_server", "--data", str(data), "--listen", f"127.0.0.1:{port}", *args],
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        procs.append(proc)
        return f"127.0.0.1:{port}", proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def up(target: str) -> bool:
    try:
        with FeedClient(target, timeout=2) as c:
            c.info(KP.public_key)
        return True
    except Exception:
        return False


@pytest.mark.slow
def test_two_serve_processes_gossip_a_split_view_into_a_fork_proof(
    serve_procs: Callable[..., tuple[str, subprocess.Popen[str]]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    history(tmp_path / "p1" / "feed", "a", 5)  # history A goes to peer 1
    history(tmp_path / "p2" / "feed", "b", 8)  # history B, longer, to peer 2
    port1, port2 = free_port(), free_port()
    t1, t2 = f"127.0.0.1:{port1}", f"127.0.0.1:{port2}"
    serve_procs(tmp_path / "p2", "--gossip", f"grpc://{t1}", port=port2)
    serve_procs(tmp_path / "p1", "--gossip", f"grpc://{t2}", port=port1)
    wait_until(lambda: up(t1) and up(t2), 30, "both peers to serve")
    wait_until(lambda: forked_info(t1) is not None and forked_info(t2) is not None, 30, "both to hold the proof")
    # the proof each serves verifies, is the same fork, and stops at the shorter length
    for t in (t1, t2):
        info = forked_info(t)
        assert info is not None
        proof = wire.fork_proof_of(info.fork_proof)
        forks.verify(proof, KP.public_key)
        assert proof.fork_point == 6 and {proof.a.length, proof.b.length} == {6, 9}  # a header block each
    # both refuse appends and following, with the Fork kind (FAILED_PRECONDITION)
    token = (tmp_path / "p1" / "_peer" / "write-token").read_text().strip()
    with FeedClient(t1, timeout=5, token=token) as c:
        with pytest.raises(Fork, match="forked"):
            c.put(KP.public_key, [Write("/c", b"1")])
        with pytest.raises(Fork):
            list(c.subscribe(KP.public_key, 1))
    with FeedClient(t2, timeout=5) as c:
        # a read up to the fork point is served; past it, refused
        assert sum(len(s.blocks) for m in c.read(KP.public_key, 0, 6) for s in m.segments) == 6
        with pytest.raises(Fork):
            list(c.read(KP.public_key, 0, 9))
    # `info` on each names the fork
    for t in (t1, t2):
        code, out, _ = run(capsys, "info", f"grpc://{t}/{KP.public_key.hex()}", "--json")
        assert code == 0 and "forked" in json.loads(out)["fork_proof"]
    code, out, _ = run(capsys, "info", str(tmp_path / "p1" / "feed"))
    assert code == 0 and "fork_proof" in out and "forked" in out
    # a fresh clone with a witness fails with the proof (exit 5); the proof checks offline
    for src, other in ((t1, t2), (t2, t1)):
        dest = tmp_path / f"clone-{src[-5:]}"
        code, _, err = run(
            capsys, "clone", f"grpc://{src}/{KP.public_key.hex()}", str(dest), "--witness", f"grpc://{other}"
        )
        assert code == 5 and "forked" in err and not dest.exists(), err
        assert run(capsys, "verify-fork", str(dest) + ".fork-proof.json")[0] == 0
    code, out, _ = run(capsys, "verify-fork", str(tmp_path / "p2" / "feed" / forks.FORK_FILE), "--json")
    assert code == 0 and json.loads(out)["valid"] is True and json.loads(out)["fork_point"] == 6


def test_one_round_of_gossip_leaves_both_peers_holding_the_proof(
    peers: Callable[..., PeerServer], tmp_path: Path
) -> None:
    history(tmp_path / "p1" / "feed", "a", 9)  # the asker is longer: it judges, and sends the proof back
    history(tmp_path / "p2" / "feed", "b", 4)
    p2 = peers("p2")
    p1 = peers("p1", gossip=[wire_address(p2.address)], gossip_every=3600)
    assert p1.gossiper is not None
    wait_until(lambda: p1.gossiper is not None and p1.gossiper.rounds >= 1, 15, "the first round")
    assert p1.host.get(KP.public_key).fork is not None
    assert p2.host.get(KP.public_key).fork is not None  # within that one round
    assert (tmp_path / "p2" / "feed" / forks.FORK_FILE).is_file()


def test_a_witness_catches_a_split_view_no_peer_knows_of(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history(tmp_path / "p1" / "feed", "a", 6)
    history(tmp_path / "p2" / "feed", "b", 6)
    history(tmp_path / "p3" / "feed", "a", 3)  # an honest prefix of A
    p1, p2, p3 = peers("p1"), peers("p2"), peers("p3")
    url = f"grpc://{p1.address}/{KP.public_key.hex()}"
    # without a witness the clone takes A: nothing tells it otherwise
    assert run(capsys, "clone", url, str(tmp_path / "plain"))[0] == 0
    # a witness with A's prefix agrees; one with B proves the fork
    code, out, _ = run(capsys, "clone", url, str(tmp_path / "ok"), "--witness", f"grpc://{p3.address}", "--json")
    assert code == 0 and json.loads(out)["witnesses"] == [f"grpc://{p3.address}"]
    code, _, err = run(capsys, "clone", url, str(tmp_path / "bad"), "--witness", f"grpc://{p2.address}")
    assert code == 5 and "forked" in err and not (tmp_path / "bad").exists()
    # pull onto the plain copy with B's peer as witness: the proof is kept beside the copy, and kept refusing
    code, _, err = run(capsys, "pull", str(tmp_path / "plain"), "--witness", f"grpc://{p2.address}")
    assert code == 5 and forks.FORK_FILE in err
    assert run(capsys, "verify-fork", str(tmp_path / "plain" / forks.FORK_FILE))[0] == 0
    code, _, err = run(capsys, "pull", str(tmp_path / "plain"))
    assert code == 5 and "forked" in err
    # a local feed that keeps a proof takes no more appends either (the writer's own copy, say)
    (tmp_path / "p1" / "feed" / forks.FORK_FILE).write_bytes((tmp_path / "plain" / forks.FORK_FILE).read_bytes())
    code, _, err = run(capsys, "put", str(tmp_path / "p1" / "feed"), "/x", "1")
    assert code == 5 and "forked" in err
    # tail checks its witnesses before printing anything
    code, out, err = run(capsys, "tail", url, "--count", "1", "--witness", f"grpc://{p2.address}")
    assert code == 5 and out == ""
    code, out, _ = run(capsys, "tail", url, "--count", "1", "--witness", f"grpc://{p3.address}")
    assert code == 0 and "/a0" in out
    assert p1.host.get(KP.public_key).fork is None  # nobody gossiped: peer 1 knows nothing


def test_a_follower_that_meets_another_history_keeps_the_proof(
    peers: Callable[..., PeerServer], tmp_path: Path
) -> None:
    history(tmp_path / "up" / "feed", "b", 7)
    history(tmp_path / "me" / "feed", "a", 3)
    up_ = peers("up")
    me = peers("me", follow=[wire_address(up_.address, KP.public_key)])
    wait_until(lambda: me.host.get(KP.public_key).fork is not None, 15, "the follower to find the fork")
    assert me.host.get(KP.public_key).feed.length == 4  # header + 3: kept its own, took nothing of the other history
    assert (tmp_path / "me" / "feed" / forks.FORK_FILE).is_file()


def wire_address(target: str, key: bytes | None = None) -> Address:
    return Address.parse(f"grpc://{target}" + (f"/{key.hex()}" if key else ""))


def test_hostile_gossip_marks_nothing_and_is_bounded(peers: Callable[..., PeerServer], tmp_path: Path) -> None:
    honest = history(tmp_path / "p" / "feed", "h", 6)
    other = KeyPair.from_seed(bytes([41]) * 32)
    stranger = history(tmp_path / "x" / "feed", "x", 2, other)
    p = peers("p")
    hf = p.host.get(KP.public_key)

    def req(**kw: object) -> pb.GossipRequest:
        return pb.GossipRequest(feeds=[pb.GossipState(key=KP.public_key, **kw)])  # type: ignore[arg-type]

    with FeedClient(p.address, timeout=5) as c:
        # a state signed by another key, or forged
        with pytest.raises(InvalidArgument):
            c.gossip(req(state=wire.state_pb(stranger[2])))
        with pytest.raises(InvalidArgument):
            c.gossip(req(state=wire.state_pb(TreeState(6, 0, bytes(32), bytes(64)))))
        # a replayed honest state is just agreement
        assert not c.gossip(req(state=wire.state_pb(honest[3]))).feeds[0].HasField("fork_proof")
        # a "fork" that is really a valid prefix, and a real fork of another key, are refused
        with Feed.open(tmp_path / "p" / "feed", writable=False) as f:
            prefix = forks.ForkProof(KP.public_key, honest[3], honest[6], consistency.prove(4, 7, f.core.node))
        with pytest.raises(InvalidArgument, match="not a fork"):
            c.gossip(req(fork_proof=wire.fork_proof_pb(prefix)))
        other_b = history(tmp_path / "y" / "feed", "y", 2, other)
        theirs = forks.of_states(other.public_key, stranger[2], other_b[2])
        with pytest.raises(InvalidArgument):
            c.gossip(req(fork_proof=wire.fork_proof_pb(theirs)))
        with pytest.raises(InvalidArgument):  # another key's proof sent as ours: the keys do not match
            c.gossip(pb.GossipRequest(feeds=[pb.GossipState(key=KP.public_key, fork_proof=wire.fork_proof_pb(theirs))]))
        # too many states in one request; then a flood is rate-limited
        with pytest.raises(InvalidArgument, match="limit"):
            c.gossip(pb.GossipRequest(feeds=[pb.GossipState(key=KP.public_key)] * 257))
        refused = 0
        for _ in range(300):
            try:
                c.gossip(req(state=wire.state_pb(honest[6])))
            except ResourceExhausted:
                refused += 1
        assert refused > 0
    assert hf.fork is None and not (tmp_path / "p" / "feed" / forks.FORK_FILE).exists()


def test_a_peer_that_lies_in_getinfo_marks_nothing(tmp_path: Path) -> None:
    """A bogus fork proof, or a consistency proof that does not match the peer's own signed state, is a
    lie (Corruption naming the peer), never a fork."""
    a = history(tmp_path / "a", "a", 6)
    b = history(tmp_path / "b", "b", 6)
    with Feed.open(tmp_path / "a", writable=False) as fa:
        good = consistency.prove(3, 7, fa.core.node)
    info = pb.FeedInfo(state=wire.state_pb(a[6]), consistency=wire.consistency_pb(good))
    assert judge(KP.public_key, a[2], info, "peer") == (a[6], None)  # consistent
    # the same proof sent with B's longer state: its nodes do not derive B's tree
    lie = pb.FeedInfo(state=wire.state_pb(b[6]), consistency=wire.consistency_pb(good))
    with pytest.raises(Corruption, match="bogus") as e:
        judge(KP.public_key, a[2], lie, "peer")
    assert not isinstance(e.value, Fork)
    # a "fork proof" of two states of one history
    fake = forks.ForkProof(KP.public_key, a[2], a[6], good)
    with pytest.raises(Corruption, match="does not verify"):
        judge(KP.public_key, a[2], pb.FeedInfo(state=wire.state_pb(a[6]), fork_proof=wire.fork_proof_pb(fake)), "peer")
    # a longer state without the proof asked for, when the reader needs one (a witness)
    with pytest.raises(Corruption, match="did not send"):
        judge(KP.public_key, a[2], pb.FeedInfo(state=wire.state_pb(a[6])), "peer")
    assert judge(KP.public_key, a[2], pb.FeedInfo(state=wire.state_pb(a[6])), "peer", need_proof=False)[1] is None


def test_a_gossip_reply_that_lies_marks_nothing(peers: Callable[..., PeerServer], tmp_path: Path) -> None:
    a = history(tmp_path / "p" / "feed", "a", 6)
    b = history(tmp_path / "b", "b", 6)
    hf = peers("p").host.get(KP.public_key)
    forged = TreeState(7, 0, b[6].tree_hash, a[6].signature)  # another tree under a signature of ours
    for reply in (
        pb.GossipReply(key=KP.public_key, state=wire.state_pb(forged)),
        pb.GossipReply(key=KP.public_key, state=wire.state_pb(TreeState(9, 0, bytes(32), bytes(64)))),
    ):
        with pytest.raises(Corruption):
            judge_reply(hf, a[6], reply, "peer")
    assert judge_reply(hf, a[6], pb.GossipReply(key=KP.public_key, state=wire.state_pb(a[3])), "peer") is None
    assert judge_reply(hf, a[6], pb.GossipReply(key=KP.public_key), "peer") is None  # not hosted there
    found = judge_reply(hf, a[6], pb.GossipReply(key=KP.public_key, state=wire.state_pb(b[6])), "peer")
    assert found is not None and found.fork_point == 7
    assert hf.fork is None  # judging marks nothing; the gossiper marks what verifies
