"""Peers forget on their own (issue 37): a peer never serves an expired payload, compacts on a schedule,
and replicas keep cleared blocks as visible holes that any other peer may fill."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.clock import ManualClock
from feedlog.errors import InvalidArgument, NotFound
from feedlog.log import storage
from feedlog.log.feed import Feed, Write
from feedlog.replication.client import FeedClient
from feedlog.replication.sync import clone, pull, push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer
from feedlog_server.compaction import Compactor
from feedlog_server.host import FeedHost
from feedlog_server.serve import compact_every
from tests.conftest import wait_until

from .conftest import KP

Peers = Callable[..., PeerServer]
T0 = 1_700_000_000_000
TTL = 60_000
SECRET = b"needle-peer-4b1d9e"


def author(path: Path, clock: ManualClock) -> Feed:
    """The key holder's feed at T0: 9 entries in 3 batches; seqs 2 and 5 hold SECRET for a minute."""
    f = Feed.create(path, key_pair=KP, timestamps="exact", clock=clock)
    f.append([Write("/a", b"a"), Write("/s1", SECRET, ttl_ms=TTL), Write("/b", b"b")])
    f.append([Write("/c", b"c"), Write("/s2", SECRET, ttl_ms=TTL), Write("/d", b"d")])
    f.append([Write("/e", b"e"), Write("/f", b"f"), Write("/g", b"g")])
    return f


def hosting(peers: Peers, tmp_path: Path, name: str, clock: ManualClock, **kw: object) -> PeerServer:
    """A peer holding the author's whole feed (pushed), whose clock reads `clock`."""
    peer = peers(name, clock=clock, compact_every=0, **kw)
    src = tmp_path / "author"
    if not src.exists():
        author(src, ManualClock(T0)).close()
    push(src, Address(peer.address, KP.public_key.hex()), token=peer.token)
    return peer


def holds(directory: Path, needle: bytes = SECRET) -> bool:
    """Whether any file under `directory` holds `needle` (the peer's, a copy's whole data)."""
    return any(needle in p.read_bytes() for p in directory.rglob("*") if p.is_file())


def length_on(peer: PeerServer) -> int:
    try:
        return int(peer.host.get(KP.public_key).feed.length)
    except NotFound:
        return -1


def url(peer: PeerServer) -> Address:
    return Address(peer.address, KP.public_key.hex())


def test_a_peer_serves_an_expired_entry_cleared_before_its_compaction_runs(peers: Peers, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    a = hosting(peers, tmp_path, "a", clock)
    key = KP.public_key
    with FeedClient(a.address, timeout=10) as c:
        live = [b for batch in c.read_verified(key, 1) for b in batch.blocks]
        assert sum(b is not None and SECRET in b for b in live) == 2
        clock.advance(TTL + 1)
        raw = [m.SerializeToString() for m in c.read(key, 0)]
        assert not any(SECRET in m for m in raw)
        got = [b for batch in c.read_verified(key, 1) for b in batch.blocks]  # still verifies: leaves stand in
        assert [n for n, b in enumerate(got, 1) if b is None] == [2, 5]
        assert got[0] == live[0] and got[2] == live[2]
        with pytest.raises(NotFound, match="expired"):
            c.proof(key, 2)
        assert c.proof(key, 3).block == live[2]
    assert holds(a.data)  # served cleared, but not compacted yet: the bytes are still on its disk
    assert a.compactor is not None
    report = a.compactor.run_once()
    assert (report.feeds, report.cleared) == (1, 2)
    assert not holds(a.data)
    assert a.host.get(key).feed.verify().cleared == 2


def test_the_schedule_compacts_on_its_own(peers: Peers, tmp_path: Path) -> None:
    clock = ManualClock(T0 + TTL + 1)
    a = peers("a", clock=clock, compact_every=0.05)
    author(tmp_path / "author", ManualClock(T0)).close()
    push(tmp_path / "author", url(a), token=a.token)
    assert a.compactor is not None
    compactor = a.compactor
    # (a pass is counted when it ends, just after it cleared the payloads: wait for both)
    wait_until(
        lambda: not holds(a.data) and compactor.passes >= 1,
        what="the scheduled compaction to clear the expired payloads",
    )


def test_clone_keeps_holes_and_a_pull_from_another_peer_fills_them(peers: Peers, tmp_path: Path) -> None:
    a = hosting(peers, tmp_path, "a", ManualClock(T0 + TTL + 1))  # withholds the two entries
    c = hosting(peers, tmp_path, "c", ManualClock(T0))  # still serves them
    copy = tmp_path / "copy"
    done = clone(url(a), copy, clock=ManualClock(T0))
    assert done.length == 10
    assert not holds(copy)
    with Feed.open(copy, clock=ManualClock(T0)) as f:
        assert [r.seq for r in f.records() if r.cleared] == [2, 5]
        assert f.core.holes(0, f.length, 100) == [2, 5]  # a hole: not a value, and not known to be expired
        assert f.get("/s1") is None and f.get("/b") is not None
        rep = f.verify()
        assert (rep.cleared, rep.holes) == (2, 2)
    again = pull(copy, clock=ManualClock(T0))  # the origin still withholds them
    assert (again.blocks, again.filled, again.holes) == (0, 0, 2)
    filled = pull(copy, peer=Address(c.address), clock=ManualClock(T0))
    assert (filled.blocks, filled.filled, filled.holes) == (0, 2, 0)
    with Feed.open(copy, clock=ManualClock(T0)) as f:
        s1 = f.get("/s1")
        assert s1 is not None and s1.value == SECRET
        assert f.verify().cleared == 0
    with pytest.raises(InvalidArgument, match="another feed"):
        pull(copy, peer=Address(c.address, "00" * 32))


def test_a_follower_stores_holes_and_fills_them_from_its_next_upstream(peers: Peers, tmp_path: Path) -> None:
    a = hosting(peers, tmp_path, "a", ManualClock(T0 + TTL + 1))
    c = hosting(peers, tmp_path, "c", ManualClock(T0))
    key = KP.public_key
    b = peers("b", follow=[url(a)], clock=ManualClock(T0), compact_every=0)
    wait_until(lambda: length_on(b) == 10, what="B to follow A")
    feed = b.host.get(key).feed
    assert feed.core.holes(0, 10, 100) == [2, 5] and feed.verify().holes == 2
    assert not holds(b.data)
    b.stop(grace=1)
    b2 = peers("b", follow=[url(c)], clock=ManualClock(T0), compact_every=0)
    wait_until(lambda: b2.host.get(key).feed.core.hole_count(0, 10) == 0, what="B to fill its holes from C")
    got = b2.host.get(key).feed.get("/s2")
    assert got is not None and got.value == SECRET


def test_a_follower_keeps_no_payload_that_expired_by_its_own_clock(peers: Peers, tmp_path: Path) -> None:
    c = hosting(peers, tmp_path, "c", ManualClock(T0))
    key = KP.public_key
    b = peers("b", follow=[url(c)], clock=ManualClock(T0 + TTL + 1), compact_every=0)
    wait_until(lambda: length_on(b) == 10, what="B to follow C")
    feed = b.host.get(key).feed
    assert [r.seq for r in feed.records() if r.cleared] == [2, 5]
    assert feed.core.hole_count(0, 10) == 0  # cleared by its own rule: nothing to fill
    assert not holds(b.data)


def test_a_pass_reads_only_steps_with_something_due(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    author(tmp_path / "host" / "f", clock).close()
    host = FeedHost(tmp_path / "host", clock=clock)
    try:
        comp = Compactor(host, 0, step=4, pause_s=0)
        first = comp.run_once()
        assert (first.entries, first.skipped, first.cleared) == (10, 0, 0)
        # steps [0, 4) and [4, 8) keep an entry expiring at T0 + TTL: skipped until then; the tail is read
        second = comp.run_once()
        assert (second.entries, second.skipped) == (2, 8)
        clock.advance(TTL + 1)
        third = comp.run_once()
        assert (third.entries, third.cleared) == (10, 2)
        fourth = comp.run_once()  # nothing left to expire in the whole steps
        assert (fourth.entries, fourth.skipped, fourth.cleared) == (2, 8, 0)
        assert SECRET not in (tmp_path / "host" / "f" / storage.LOG).read_bytes()
    finally:
        host.close()


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("0s", 0.0), ("30s", 30.0), ("1m", 60.0), ("2h", 7200.0)])
def test_compact_every_takes_a_duration_or_zero(text: str, seconds: float) -> None:
    assert compact_every(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1m", "1.5m", ""])
def test_compact_every_refuses_what_is_no_duration(text: str) -> None:
    with pytest.raises(InvalidArgument, match="--compact-every"):
        compact_every(text)


def test_info_tells_when_a_copy_forgets(peers: Peers, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from feedlog.cli import main
    from feedlog.replication import wire

    clock = ManualClock(T0)
    off = hosting(peers, tmp_path, "off", clock)
    scheduled = peers("scheduled", clock=clock, compact_every=90)
    push(tmp_path / "author", Address(scheduled.address, KP.public_key.hex()), token=scheduled.token)
    with FeedClient(off.address) as c:
        assert "kept on the peer's disk (compaction off)" in str(wire.info_json(c.info(KP.public_key))["forgetting"])
    with FeedClient(scheduled.address) as c:
        said = str(wire.info_json(c.info(KP.public_key))["forgetting"])
    assert "never served after expiry" in said and "within 90s of it" in said
    capsys.readouterr()
    assert main(["info", str(tmp_path / "author"), "--json"]) == 0
    assert "`feedlog compact`" in json.loads(capsys.readouterr().out)["forgetting"]  # a local copy: compact does it
