"""The peer commands end to end: create/put/info on a peer, clone, pull, push, tail; one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.clock import ManualClock, SystemClock
from feedlog.log.feed import Feed
from feedlog_server.app import PeerServer

from .test_shutdown import free_port


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_clone_then_pull_shows_the_same_signed_state(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = peers("a")
    url = f"grpc://{a.address}"
    auth = ("--token-file", str(a.token_file))
    code, out, _ = run(capsys, "create", url, "--timestamps", "exact", "--json", *auth)
    assert code == 0
    key = json.loads(out)["key"]
    feed = f"{url}/{key}"
    assert run(capsys, "put", feed, "/a", "1", *auth)[0] == 0
    assert run(capsys, "clone", feed, str(tmp_path / "copy"))[0] == 0
    assert run(capsys, "put", feed, "/b", "2", "--json", *auth)[0] == 0
    assert run(capsys, "del", feed, "/a", *auth)[0] == 0
    code, out, _ = run(capsys, "pull", str(tmp_path / "copy"), "--json")
    assert code == 0 and json.loads(out) == {"fetched": 2, "length": 4, "filled": 0, "holes": 0}
    remote = json.loads(run(capsys, "info", feed, "--json")[1])
    local = json.loads(run(capsys, "info", str(tmp_path / "copy"), "--json")[1])
    for field in ("key", "length", "tree_hash", "signature", "max_timestamp"):
        assert remote[field] == local[field], field
    code, out, _ = run(capsys, "tail", feed, "--count", "3", "--json")
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and [(x["seq"], x["key"], x["deleted"]) for x in lines] == [
        (1, "/a", False),
        (2, "/b", False),
        (3, "/a", True),
    ]
    assert run(capsys, "get", str(tmp_path / "copy"), "/b")[1].strip() == "2"

    # a locally written feed, pushed
    assert run(capsys, "create", str(tmp_path / "mine"))[0] == 0
    assert run(capsys, "put", str(tmp_path / "mine"), "/x", "y")[0] == 0
    code, out, _ = run(capsys, "push", str(tmp_path / "mine"), url, "--json", *auth)
    assert code == 0 and json.loads(out) == {"pushed": 2, "length": 2}


def test_mistakes_are_one_line_with_the_right_exit_code(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = peers("a")
    nobody = "ab" * 32
    cases = [
        (["info", "grpc://127.0.0.1/xyz"], 2),  # no port
        (["info", f"grpc://{a.address}/nothex"], 2),
        (["info", f"grpc://{a.address}/{nobody}"], 3),
        (["clone", f"grpc://{a.address}/{nobody}", str(tmp_path / "c")], 3),
        (["info", f"grpc://127.0.0.1:{free_port()}/{nobody}"], 8),  # nobody listening
        (["pull", str(tmp_path)], 3),
        (["pull", str(tmp_path), "--peer", "grpc://nowhere"], 2),
        (["serve", "--data", str(tmp_path / "s"), "--tls-cert", "x.pem"], 2),
        (["tail", f"grpc://{a.address}/{nobody}", "--from", "-1"], 2),
    ]
    for args, expected in cases:
        code, _out, err = run(capsys, *args)
        assert code == expected, (args, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "c").exists()


def test_pull_from_another_peer_fills_the_holes_the_origin_left(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 37: a peer whose clock is two days ahead serves the hour-long entry cleared; a clone keeps it
    as a hole (shown as such), and `pull --peer` from a peer that still serves it fills it."""
    with Feed.create(tmp_path / "mine", timestamps="exact") as f:
        f.put("/short", b"for an hour", ttl="1h")
        f.put("/long", b"for ever")
        key = f.key.hex()
    ahead = peers("ahead", clock=ManualClock(SystemClock().now_ms() + 2 * 86_400_000))
    now = peers("now")
    for p in (ahead, now):
        assert (
            run(capsys, "push", str(tmp_path / "mine"), f"grpc://{p.address}", "--token-file", str(p.token_file))[0]
            == 0
        )
    assert run(capsys, "clone", f"grpc://{ahead.address}/{key}", str(tmp_path / "copy"))[0] == 0
    assert (
        run(capsys, "cat", str(tmp_path / "copy"))[1].splitlines()[0]
        == "1\t(cleared: expired, overwritten, forgotten, or withheld by a peer)"
    )
    code, out, _ = run(capsys, "pull", str(tmp_path / "copy"))
    assert code == 0 and "1 hole left" in out
    code, out, _ = run(capsys, "pull", str(tmp_path / "copy"), "--peer", f"grpc://{now.address}")
    assert code == 0 and out.strip() == "fetched 0 blocks; length 3; filled 1 hole"
    assert run(capsys, "get", str(tmp_path / "copy"), "/short")[1].strip() == "for an hour"
