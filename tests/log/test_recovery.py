"""Crashes at exact steps of recovery and creation (fail points in real child processes)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from feedlog import faults
from feedlog.log.feed import Feed

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, failpoints: str = "") -> int:
    """Run `code` in a fresh interpreter (FEEDLOG_FAILPOINTS set), return its exit status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), faults.ENV: failpoints}
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
    assert run_child(opener, "core.replayed_batch=exit@1") == faults.EXIT_CODE
    with Feed.open(p, writable=False) as f:  # a reader replays without writing: it sees the caches as left
        assert f.length == 4
        assert f.verify().length == 4
        assert [r.key for r in f.records()] == ["a", "b", "c"]
    with Feed.open(p) as f:
        assert f.core.recovered_batches == 2 and f.verify().length == 4
