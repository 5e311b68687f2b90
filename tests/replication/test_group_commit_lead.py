"""Group commit led by blocking callers (server/group_commit.py `put`): a caller commits the queued
group in its own thread when none is being committed, or is handed the lead by the group before it;
the committer thread takes what pipelined callers (`submit`) queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from feedlog.errors import InvalidArgument, Unavailable
from feedlog.log.feed import Appended, Feed, Write
from feedlog_server.group_commit import GroupCommitter, Result


@pytest.fixture
def unsynced(tmp_path: Path) -> Iterator[Callable[..., tuple[Feed, GroupCommitter]]]:
    """A feed without fsync and its group committer (`max_batch` as given), both closed afterwards."""
    made: list[tuple[Feed, GroupCommitter]] = []

    def make(max_batch: int = 10_000) -> tuple[Feed, GroupCommitter]:
        feed = Feed.create(tmp_path / f"f{len(made)}", timestamps="exact", fsync=False)
        made.append((feed, GroupCommitter(feed, lambda: None, max_batch=max_batch)))
        return made[-1]

    yield make
    for feed, gc in made:
        gc.close()
        feed.close()


def test_leading_callers_and_the_committer_thread_commit_every_entry_once(tmp_path: Path) -> None:
    feed = Feed.create(tmp_path / "f", timestamps="exact", fsync=True)
    commits = [0]
    gc = GroupCommitter(feed, lambda: commits.__setitem__(0, commits[0] + 1), max_batch=4)
    got: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(30):
                if i % 3:  # most block and lead; some pipeline, left to the committer thread
                    (a,), _ = gc.put([Write(f"/c{n}/{i}", b"v")], 10)
                else:
                    (a,), _ = gc.submit([Write(f"/c{n}/{i}", b"v")]).result(10)
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


def test_a_leader_commits_its_own_entry_and_a_refused_member_fails_alone(
    unsynced: Callable[..., tuple[Feed, GroupCommitter]],
) -> None:
    _feed, gc = unsynced()
    with gc._cond:  # (reentrant) the committer thread cannot take the queue while this is held
        futs: list[Future[Result]] = [gc.submit([Write(f"/k{i}", b"v")]) for i in range(5)]
        hostile = gc.submit([Write("/evil", b"x", False, (1 << 64) - 1)])
        before = gc.batches
        (mine,), _ = gc.put([Write("/mine", b"v")], 5)
        assert gc.batches > before  # committed in this thread, not handed to another
    assert sorted([*(f.result(5)[0][0].seq for f in futs), mine.seq]) == list(range(1, 7))
    with pytest.raises(InvalidArgument, match="TTL"):
        hostile.result(5)


def test_a_full_group_hands_the_lead_to_the_next_blocked_caller(
    unsynced: Callable[..., tuple[Feed, GroupCommitter]],
) -> None:
    # groups of at most 2 entries: 9 blocked callers need 5 commits, each led by a caller of the
    # queue (the committer thread takes none: only pipelined submits wake it)
    feed, gc = unsynced(max_batch=2)
    results: dict[int, int] = {}
    leaders: set[str] = set()
    real_append = feed.append

    def append(writes: Sequence[Write]) -> list[Appended]:
        leaders.add(threading.current_thread().name)
        return real_append(writes)

    feed.append = append  # type: ignore[method-assign]
    with feed.core.lock:  # the first leader waits here: the others queue behind it
        threads = [
            threading.Thread(
                target=lambda i=i: results.__setitem__(i, gc.put([Write(f"/k{i}", b"v")], 10)[0][0].seq),
                name=f"caller-{i}",
            )
            for i in range(9)
        ]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 5
        while len(gc._queue) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    for th in threads:
        th.join(10)
    assert sorted(results.values()) == list(range(1, 10))
    assert gc.batches == 5 and leaders <= {f"caller-{i}" for i in range(9)}


def test_a_blocked_caller_past_its_deadline_leaves_the_queue_and_nothing_is_written(
    unsynced: Callable[..., tuple[Feed, GroupCommitter]],
) -> None:
    feed, gc = unsynced()
    with gc._cond:
        gc._busy = True  # a group being committed that never ends
    with pytest.raises(Unavailable, match="nothing was written"):
        gc.put([Write("/late", b"v")], 0.05)
    assert not gc._queue
    with gc._cond:
        gc._busy = False
    (a,), _ = gc.put([Write("/next", b"v")], 5)
    assert a.seq == 1 and feed.length == 2  # the header and /next: /late never landed
