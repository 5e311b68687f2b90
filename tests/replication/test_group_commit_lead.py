"""Group commit led by blocking callers (server/group_commit.py `lead`): a caller commits the queued
group in its own thread when none is being committed; the committer thread takes the rest."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from feedlog.errors import InvalidArgument
from feedlog.log.feed import Feed, Write
from feedlog_server.group_commit import GroupCommitter, Result


def test_leading_callers_and_the_committer_thread_commit_every_entry_once(tmp_path: Path) -> None:
    feed = Feed.create(tmp_path / "f", timestamps="exact", fsync=True)
    commits = [0]
    gc = GroupCommitter(feed, lambda: commits.__setitem__(0, commits[0] + 1))
    got: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(30):
                fut = gc.submit([Write(f"/c{n}/{i}", b"v")])
                if i % 3:  # some lead, some leave it to the committer thread
                    gc.lead(fut)
                (a,), _ = fut.result(10)
                with lock:
                    got[f"/c{n}/{i}"] = a.seq
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(12)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        assert sorted(got.values()) == list(range(1, 12 * 30 + 1))  # none lost, none doubled
        assert all(feed.record(seq).key == k for k, seq in got.items())
        assert gc.batches == commits[0] and gc.batches < 12 * 30  # callers shared commits
    finally:
        gc.close()
        feed.close()


def test_a_leader_commits_its_own_entry_and_a_refused_member_fails_alone(tmp_path: Path) -> None:
    feed = Feed.create(tmp_path / "f", timestamps="exact", fsync=False)
    gc = GroupCommitter(feed, lambda: None)
    try:
        with gc._cond:  # (reentrant) the committer thread cannot take the queue while this is held
            futs: list[Future[Result]] = [gc.submit([Write(f"/k{i}", b"v")]) for i in range(5)]
            hostile = gc.submit([Write("/evil", b"x", False, (1 << 64) - 1)])
            mine = gc.submit([Write("/mine", b"v")])
            gc.lead(mine)
            assert mine.done() and gc.batches >= 1  # committed in this thread, not handed to another
        assert sorted(f.result(5)[0][0].seq for f in [*futs, mine]) == list(range(1, 7))
        with pytest.raises(InvalidArgument, match="TTL"):
            hostile.result(5)
    finally:
        gc.close()
        feed.close()
