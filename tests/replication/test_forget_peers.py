"""`feedlog forget` on every copy (issue 37), with real peers on loopback: the peer that owns a feed,
a follower of it, a pulled local copy, and a peer a local writer pushes to."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.errors import InvalidArgument
from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

from ..conftest import wait_until


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def files_holding(d: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and needle in p.read_bytes())


def test_forget_on_the_owning_peer_reaches_its_follower_and_a_pulled_copy(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = peers("a")
    url = f"grpc://{a.address}"
    auth = ("--token-file", str(a.token_file))
    code, out, _ = run(capsys, "create", url, "--json", *auth)
    assert code == 0
    key = json.loads(out)["key"]
    feed = f"{url}/{key}"
    b = peers("b", follow=[Address(a.address, key)])
    assert run(capsys, "put", feed, "/token", "needle-1", *auth)[0] == 0
    assert run(capsys, "put", feed, "/other", "kept", *auth)[0] == 0
    assert run(capsys, "put", feed, "/token", "needle-2", *auth)[0] == 0
    assert run(capsys, "clone", feed, str(tmp_path / "copy"))[0] == 0
    wait_until(lambda: b.host.get(bytes.fromhex(key)).feed.length == 4, what="the follower to catch up")
    assert files_holding(tmp_path / "b", b"needle-2") != []

    code, out, err = run(capsys, "forget", feed, "/token", "--json", *auth)
    assert code == 0, err
    assert json.loads(out)["seq"] == 4
    wait_until(lambda: b.host.get(bytes.fromhex(key)).feed.length == 5, what="the follower to store the forget")
    assert run(capsys, "pull", str(tmp_path / "copy"))[0] == 0
    for where in ("a", "b", "copy"):
        assert files_holding(tmp_path / where, b"needle") == [], where
    # the follower and the copy say why, and still verify
    for copy in (b.host.get(bytes.fromhex(key)).feed,):
        assert copy.forgotten("/token") == 4 and copy.verify().cleared == 2
    code, out, err = run(capsys, "get", str(tmp_path / "copy"), "/token")
    assert code == 3 and "forgotten at seq 4" in err and err.count("\n") == 1
    code, out, _ = run(capsys, "history", str(tmp_path / "copy"), "/token")
    assert code == 0 and out.count("\n") == 1 and "forgotten" in out and out.startswith("4\t")
    assert run(capsys, "get", str(tmp_path / "copy"), "/other")[1].strip() == "kept"
    assert run(capsys, "verify", str(tmp_path / "copy"))[0] == 0


def test_a_pushed_forget_clears_on_the_peer(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A local writer's forget, pushed (Append: the key holder's signed batch) to a peer holding its feed."""
    c = peers("c")
    auth = ("--token-file", str(c.token_file))
    mine = str(tmp_path / "mine")
    assert run(capsys, "create", mine)[0] == 0
    assert run(capsys, "put", mine, "k", "needle-pushed")[0] == 0
    assert run(capsys, "push", mine, f"grpc://{c.address}", *auth)[0] == 0
    assert files_holding(tmp_path / "c", b"needle-pushed") != []
    code, out, err = run(capsys, "forget", mine, "k")
    assert code == 0 and out.startswith("2\t"), err
    assert files_holding(tmp_path / "mine", b"needle") == []
    assert run(capsys, "push", mine, f"grpc://{c.address}", *auth)[0] == 0
    assert files_holding(tmp_path / "c", b"needle") == []


def test_forget_where_we_cannot_sign_is_one_line_and_changes_nothing(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = peers("a")
    auth = ("--token-file", str(a.token_file))
    mine = str(tmp_path / "mine")
    assert run(capsys, "create", mine)[0] == 0
    assert run(capsys, "put", mine, "k", "v")[0] == 0
    assert run(capsys, "push", mine, f"grpc://{a.address}", *auth)[0] == 0
    key = json.loads(run(capsys, "info", mine, "--json")[1])["key"]
    assert run(capsys, "clone", f"grpc://{a.address}/{key}", str(tmp_path / "copy"))[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()}
    # a local copy without the secret key
    code, out, err = run(capsys, "forget", str(tmp_path / "copy"), "k")
    assert (code, out) == (7, "") and err.count("\n") == 1 and "no secret key" in err
    after = {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()}
    assert after.keys() == before.keys() and after["log"] == before["log"] and after["index"] == before["index"]
    # a peer that holds the feed but not its key (it was pushed there)
    code, out, err = run(capsys, "forget", f"grpc://{a.address}/{key}", "k", *auth)
    assert code == 7 and out == "" and err.count("\n") == 1, (code, err)
    assert a.host.get(bytes.fromhex(key)).feed.length == 2


def test_a_peer_forgets_on_a_drive_event_feed_and_refuses_a_forget_with_a_value(
    peers: Callable[..., PeerServer], clients: Callable[[PeerServer], FeedClient]
) -> None:
    a = peers("a")
    client = clients(a)
    key = client.create(content_type="drive-event").key
    client.put(key, [Write("/secret.txt", {"mode": 33188, "size": 424242}), Write("/kept", {"mode": 33188})])
    with pytest.raises(InvalidArgument, match="no value"):
        client.put(key, [Write("/secret.txt", b"x", forget=True)])
    (done,) = client.put(key, [Write("/secret.txt", deleted=True, forget=True)])
    feed = a.host.get(key).feed
    assert feed.length == 4 and done.seq == 3
    assert feed.record(1).cleared and not feed.record(2).cleared
    r = feed.record(3)
    assert r.forget and r.deleted and r.stat is None and feed.forgotten("/secret.txt") == 3
