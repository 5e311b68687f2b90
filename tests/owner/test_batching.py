"""Group ratification and background backfill (feedlog/delta/managed/batching.py), and what a writer
sees when backfill happens between its listing and its question to the owner."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from feedlog.delta.committer import commit_path
from feedlog.delta.managed import COMMITS_DIR, OWNER_ENV, Auth, Binding, ManagedCommitter, TableRef
from feedlog.delta.managed.batching import Backfiller, Group
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.table import DeltaTable
from feedlog.errors import FeedlogError, InvalidArgument, Unavailable

from .conftest import SCHEMA, Owner, batch


def test_a_group_answers_each_member_with_its_own_result_or_error() -> None:
    batches: list[list[int]] = []
    gate = threading.Event()

    def run(items: Sequence[int]) -> list[int | BaseException]:
        gate.wait(5)  # the first group holds the "transaction" while the others queue up
        batches.append(list(items))
        return [InvalidArgument(f"odd {i}") if i % 2 else i * 10 for i in items]

    group: Group[int, int] = Group(run)
    results: dict[int, object] = {}

    def member(i: int) -> None:
        try:
            results[i] = group.submit(i)
        except InvalidArgument as e:
            results[i] = str(e)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(12)]
    threads[0].start()
    time.sleep(0.2)  # member 0 leads alone; the rest arrive while it runs
    for th in threads[1:]:
        th.start()
    time.sleep(0.3)
    gate.set()
    for th in threads:
        th.join(10)
    assert results == {i: f"odd {i}" if i % 2 else i * 10 for i in range(12)}
    assert sorted(i for b in batches for i in b) == list(range(12))  # each exactly once
    assert batches[0] == [0] and len(batches) < 12  # the waiting members shared transactions
    assert group.groups == len(batches)


def test_a_failed_group_fails_every_member_and_the_next_group_runs() -> None:
    calls = []

    def run(items: Sequence[str]) -> list[str | BaseException]:
        calls.append(list(items))
        if len(calls) == 1:
            raise Unavailable("database gone")
        return [s.upper() for s in items]

    group: Group[str, str] = Group(run)
    with pytest.raises(Unavailable):
        group.submit("a")
    assert group.submit("b") == "B"


def test_background_backfill_runs_each_queued_table_once_and_survives_errors() -> None:
    calls: list[list[tuple[str, int]]] = []
    release = threading.Event()

    def backfill(tables: list[tuple[str, int]]) -> None:
        release.wait(5)
        calls.append(tables)
        if any(t == "bad" for t, _ in tables):
            raise FeedlogError("disk on fire")

    b = Backfiller(backfill)
    b.due("first", 1)  # the thread takes it and blocks in backfill
    time.sleep(0.2)
    for t, v in (("bad", 1), ("x", 3), ("x", 5), ("x", 4), ("y", 1)):
        b.due(t, v)
    assert b.requested("x") == 5 and b.requested("nope") == -1
    release.set()
    assert b.wait_idle(10)
    # the tables queued while the first call ran go in one call, each once, as far as its furthest request
    assert calls == [[("first", 1)], [("bad", 1), ("x", 5), ("y", 1)]]
    assert isinstance(b.last_error, FeedlogError) and b.requested("x") == -1
    b.due("z", 1)
    assert b.wait_idle(10) and calls[-1] == [("z", 1)] and b.last_error is None
    b.close(5)
    b.due("after-close", 1)  # starts again
    assert b.wait_idle(10) and calls[-1] == [("after-close", 1)]
    b.close(5)


def test_the_served_owner_acknowledges_before_backfilling_and_readers_see_everything(owner: Owner) -> None:
    t = owner.create(batch_size=1)
    for i in range(20):
        t.append(batch([i]))
        # whatever the background backfill has done so far, a reader that asks the owner sees it all
        assert t.version() == i + 1
    owner.settle()
    log = Path(t.storage.location) / "_delta_log"
    assert (log / commit_path(20).rsplit("/", 1)[1]).exists()
    assert sorted(t.to_arrow().column("id").to_pylist()) == list(range(20))


def test_commits_backfilled_after_the_writers_listing_are_found_in_the_log(owner: Owner) -> None:
    """The owner forgets a commit once backfilled: a writer whose listing predates that backfill gets
    the versions it missed from the owner's `latest`, as their `_delta_log` files, not a stale view."""
    t = owner.create(batch_size=1)
    for i in range(3):
        t.append(batch([i]))
    owner.settle()
    snapshot = t.snapshot()
    ref = TableRef(snapshot.metadata.id, t.storage.location)
    committer = ManagedCommitter(owner.api, ref, Auth(t.owner_token))
    got = committer.ratified_commits(t.storage, 1)  # as if the listing had stopped at version 0
    assert [(v, f.path) for v, f in got] == [(v, commit_path(v)) for v in (1, 2, 3)]
    assert committer.ratified_commits(t.storage, 4) == []
    assert not any(f.path.startswith(COMMITS_DIR) for _, f in got)


def test_a_backfill_overtaken_by_another_between_its_two_reads_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The served owner backfills in the background while a writer may ask for a backfill: one of
    them can read the table's row, then find the commits it expected already copied and forgotten by
    the other. That is not a gap in the ratified commits (CI once saw "jump from 27 to 31")."""
    db = tmp_path / "owner.db"
    monkeypatch.setenv(OWNER_ENV, str(db))
    api = LocalOwner(db)
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.feedlog(db=str(db), batch_size=100))
    for i in range(5):  # none backfilled as it commits (batch size 100)
        t.append(batch([i]))
    tid = t.snapshot().metadata.id
    real_read, raced = api._read, list[int]()

    def read(sql: str, args: tuple[object, ...]) -> list[tuple[object, ...]]:
        if sql.startswith("SELECT version, file FROM commits") and not raced:
            raced.append(0)
            raced[0] = api._backfill(tid, 3)  # the other backfill copies and forgets 1..3 first
        return real_read(sql, args)

    monkeypatch.setattr(api, "_read", read)
    assert api._backfill(tid, 5) == 5
    assert raced == [3]
    log = tmp_path / "t" / "_delta_log"
    assert [(log / commit_path(v).rsplit("/", 1)[1]).exists() for v in range(1, 6)] == [True] * 5
    assert sorted(t.to_arrow().column("id").to_pylist()) == list(range(5))
    api.close()
