"""Crashes at exact steps of recovery and creation (fail points in real child processes)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from feedlog import failpoints
from feedlog.cli import main
from feedlog.errors import InvalidArgument, NotFound
from feedlog.log import entries
from feedlog.log.core import FEED_FILES, Core
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed
from feedlog_server.host import FeedHost

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, points: str = "") -> int:
    """Run `code` in a fresh interpreter (FEEDLOG_FAILPOINTS set), return its exit status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), failpoints.ENV: points}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=60, capture_output=True)
    return proc.returncode


def test_writer_killed_during_replay_leaves_the_tree_verifiable(tmp_path: Path) -> None:
    """Issue 13 item 8: replaying batch A must not zero the parent node that later batch B wrote."""
    p = tmp_path / "f"
    Feed.create(p, timestamps="off").close()  # header at seq 0, checkpointed
    # two batches past the checkpoint, then die without closing (no checkpoint): both get replayed.
    # Batch A (seqs 1, 2) leaves tree node 3 (over seqs 0..3) to batch B (seq 3) to write.
    code = f"""
        import os
        from feedlog.log.feed import Feed, Write
        f = Feed.open({str(p)!r})
        f.append([Write("a", b"1"), Write("b", b"2")])
        f.append([Write("c", b"3")])
        os._exit(0)
    """
    assert run_child(code) == 0
    with Feed.open(p, writable=False) as f:
        assert f.length == 4 and f.verify().length == 4
    # a writer opens the feed, replays batch A, and is killed before replaying batch B
    opener = f"from feedlog.log.feed import Feed\nFeed.open({str(p)!r})\n"
    assert run_child(opener, "core.replayed_batch=exit@1") == failpoints.EXIT_CODE
    with Feed.open(p, writable=False) as f:  # a reader replays without writing: it sees the caches as left
        assert f.length == 4
        assert f.verify().length == 4
        assert [r.key for r in f.records()] == ["a", "b", "c"]
    with Feed.open(p) as f:
        assert f.core.recovered_batches == 2 and f.verify().length == 4


CREATE_STEPS = [
    "create.dir",
    "create.secret",
    "create.key",
    "create.opened",
    "create.settings",
    "create.header",
    "create.built",
    "create.moved",  # into a directory that existed (empty) before
    "create.renamed",
]


@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "existing-dir"])
@pytest.mark.parametrize("step", CREATE_STEPS)
def test_a_create_killed_at_any_step_leaves_no_feed_or_a_complete_one(
    tmp_path: Path, step: str, existing: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 item 7: a put after an interrupted create must never write an entry as block 0."""
    root = tmp_path / "root"
    p = root / "f"
    if existing:  # e.g. a mount point: files move into it, the directory itself stays
        p.mkdir(parents=True)
    code = f"from feedlog.log.feed import Feed\nFeed.create({str(p)!r}, timestamps='off')\n"
    assert run_child(code, f"{step}=exit") in (0, failpoints.EXIT_CODE)
    host = FeedHost(root)  # a peer starting over the directory neither fails nor serves a half feed
    try:
        hosted = host.keys()  # FeedHost's method, not a dict's
        assert all(host.get(k).feed.length >= 1 for k in hosted)
    finally:
        host.close()
    try:
        f = Feed.open(p)
    except NotFound:
        f = Feed.create(p, timestamps="off")  # nothing there: creation is simply run again
    with f:
        assert f.length == 1 and f.content_type == "entry" and f.core.get(0) == entries.encode_header("entry")
        f.put("k", b"v")
    with Feed.open(p, writable=False) as f:
        got = f.get("k")
        assert got is not None and got.value == b"v" and got.seq == 1
        assert f.verify().length == 2 and f.info()["length"] == 2
    assert main(["cat", "--json", str(p)]) == 0
    assert [json.loads(line)["key"] for line in capsys.readouterr().out.splitlines()] == ["k"]
    assert sorted(d.name for d in root.iterdir()) == ["f"]  # leftovers of the killed create are gone


def test_a_feed_left_without_its_header_is_not_found_and_can_be_created_again(tmp_path: Path) -> None:
    """The on-disk state an interrupted create of an older version left: key and secret, an empty log."""
    p = tmp_path / "f"
    Core.create(p, KeyPair.generate()).close()
    with pytest.raises(NotFound, match="interrupted"):
        Feed.open(p)
    with pytest.raises(NotFound, match="interrupted"):
        Feed.open(p, writable=False)
    with Feed.create(p, timestamps="off") as f:
        assert f.length == 1
        f.put("k", b"v")
    with Feed.open(p) as f:
        assert f.verify().length == 2
    # an empty replica (no secret key) is a feed waiting for its author's batches, not a broken one
    with Feed.create_replica(tmp_path / "copy", KeyPair.generate().public_key) as r:
        assert r.length == 0
    with Feed.open(tmp_path / "copy") as r:
        assert r.length == 0


@pytest.mark.parametrize("step", ["create.dir", "create.key", "create.opened", "create.built", "create.renamed"])
def test_a_replica_create_killed_at_any_step_can_still_be_filled(tmp_path: Path, step: str) -> None:
    kp = KeyPair.generate()
    with Feed.create(tmp_path / "author", key_pair=kp, timestamps="off") as author:
        author.put("k", b"v")
        blocks = [b for _, b in author.core.get_range(0, 2)]
        state = author.core.state
    p = tmp_path / "root" / "copy"
    code = f"from feedlog.log.feed import Feed\nFeed.create_replica({str(p)!r}, {kp.public_key!r})\n"
    assert run_child(code, f"{step}=exit") in (0, failpoints.EXIT_CODE)
    try:
        copy = Feed.open(p)
    except NotFound:
        copy = Feed.create_replica(p, kp.public_key)
    with copy:
        assert copy.length == 0
        copy.store_signed([b for b in blocks if b is not None], state)
    with Feed.open(p, writable=False) as copy:
        assert copy.verify().length == 2 and [r.key for r in copy.records()] == ["k"]
    assert sorted(d.name for d in p.parent.iterdir()) == ["copy"]


def test_create_into_an_existing_directory_keeps_it_and_never_touches_other_files(tmp_path: Path) -> None:
    p = tmp_path / "mnt"
    p.mkdir()
    inode = p.stat().st_ino
    with Feed.create(p) as f:  # a mount point or a shell's working directory must stay the same directory
        assert f.length == 1
    assert p.stat().st_ino == inode and sorted(os.listdir(p)) == sorted(FEED_FILES)
    other = tmp_path / "other"
    other.mkdir()
    (other / "log").write_text("someone's log")  # a feed file's name, but no create of ours left it
    with pytest.raises(InvalidArgument, match="not empty"):
        Feed.create(other)
    assert (other / "log").read_text() == "someone's log"


def test_a_feed_whose_latest_batch_was_compacted_reopens(tmp_path: Path) -> None:
    # the checkpoint names the latest record, whose CRC no longer holds once a payload in it is zeroed
    from feedlog.clock import ManualClock

    p = tmp_path / "f"
    clock = ManualClock(1_000_000)
    with Feed.create(p, timestamps="exact", clock=clock) as f:
        f.put("/a", b"x")
        f.put("/ttl", b"short", ttl=10)
    clock.advance(1000)
    with Feed.open(p, clock=clock) as f:
        assert f.compact().cleared == 1
    with Feed.open(p, clock=clock) as f:
        assert f.length == 3 and f.get("/a").value == b"x" and f.get("/ttl") is None  # type: ignore[union-attr]
        assert f.verify().cleared == 1
