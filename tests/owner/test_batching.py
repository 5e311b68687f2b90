"""Group ratification and background backfill (feedlog/delta/managed/batching.py), and what a writer
sees when backfill happens between its listing and its question to the owner."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from feedlog.delta.committer import Committed, commit_path
from feedlog.delta.managed import COMMITS_DIR, OWNER_ENV, Auth, Binding, ManagedCommitter, TableRef, resolve_owner
from feedlog.delta.managed.batching import Backfiller, Group
from feedlog.delta.managed.database import Tx
from feedlog.delta.managed.sqlite import LocalOwner, SqliteDatabase
from feedlog.delta.storage import Storage
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
    assert b.requested("x", 6) == 5 and b.requested("nope", 6) == -1
    release.set()
    assert b.wait_idle(10)
    # the tables queued while the first call ran go in one call, each once, as far as its furthest request
    assert calls == [[("first", 1)], [("bad", 1), ("x", 5), ("y", 1)]]
    assert isinstance(b.last_error, FeedlogError) and b.requested("x", 6) == -1
    # a finished backfill still counts: a commit whose view of the table predates it must not start
    # another batch from the version before it
    assert b.requested("first", 2) == 1
    b.due("z", 3)
    assert b.wait_idle(10) and calls[-1] == [("z", 3)] and b.last_error is None and b.requested("z", 4) == 3
    # ...but not for a commit at or below it (the table released, then registered again lower)
    assert b.requested("z", 2) == -1 and b.requested("z", 3) == -1 and b.requested("z", 4) == 3
    b.due("z", 1)  # that new life's first backfill replaces the old record
    assert b.wait_idle(10) and b.requested("z", 2) == 1
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


def test_a_request_for_a_taken_version_is_answered_without_reading_its_staged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most requests on a contended table lost their race before they were sent: the owner answers
    them (Conflict with the winners, or Repeat) from its database alone, and reads the staged file
    only of a request it may ratify."""
    db = tmp_path / "owner.db"
    monkeypatch.setenv(OWNER_ENV, str(db))
    t1 = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.feedlog(db=str(db), batch_size=100))
    api = resolve_owner(Binding.feedlog(db=str(db)))
    assert isinstance(api, LocalOwner)
    real_staged, read = api._staged, list[int]()

    def staged(storage: Storage, version: int, name: str, ict: int, table_id: str, install: bool = False) -> Any:
        read.append(version)
        return real_staged(storage, version, name, ict, table_id, install)

    monkeypatch.setattr(api, "_staged", staged)
    t2 = DeltaTable.open(tmp_path / "t", owner_token=t1.owner_token)
    late = t2.transaction()  # read version 0
    late.set_txn("late", 0)
    t1.append(batch([1]))  # takes version 1
    result = late.commit()  # loses version 1, rebases, takes 2
    assert (result.version, result.attempts) == (2, 2)
    assert read == [1, 2]  # the request for the taken version 1 was not read
    ref = TableRef(t1.snapshot().metadata.id, str(tmp_path / "t"))
    winners = api.get_commits(ref, 1).commits
    # a repeated request (its first answer lost) is still recognised without reading
    assert api.commit(ref, 2, winners[1].file, winners[1].ict, Auth(t1.owner_token)) == Committed(2)
    assert read == [1, 2]
    assert sorted(DeltaTable.open(tmp_path / "t").to_arrow().column("id").to_pylist()) == [1]


def test_only_bookkeeping_writes_skip_the_fsync(tmp_path: Path) -> None:
    """A ratification is fsynced before it is answered (synchronous=FULL); forgetting backfilled
    commits may skip it, on the same connection, and the next ratification is FULL again, even after
    a failed bookkeeping write."""
    database = SqliteDatabase(str(tmp_path / "owner.db"))
    database.setup()

    def level(tx: Tx) -> int:
        return int(tx.rows("PRAGMA synchronous")[0][0])

    with database.transaction(["k"]) as tx:
        assert level(tx) == 2  # FULL
    with database.transaction(["k"], durable=False) as tx:
        assert level(tx) == 1  # NORMAL: in WAL mode the commit is not fsynced
    with database.transaction(["k"]) as tx:
        assert level(tx) == 2
    with pytest.raises(Unavailable), database.transaction(["k"], durable=False) as tx:
        tx.execute("INSERT INTO no_such_table VALUES (1)")
    with database.transaction(["k"]) as tx:
        assert level(tx) == 2
    database.close()


def test_a_forget_lost_in_a_crash_is_done_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of a backfill is written without an fsync: a crash may lose it after the staged
    files were cleaned up. The owner then still tracks commits whose `_delta_log/<v>.json` exists;
    readers read them from the log, and the next backfill forgets them again."""
    db = tmp_path / "owner.db"
    monkeypatch.setenv(OWNER_ENV, str(db))
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.feedlog(db=str(db), batch_size=100))
    for i in range(3):
        t.append(batch([i]))
    api = resolve_owner(Binding.feedlog(db=str(db)))
    assert isinstance(api, LocalOwner)
    tid = t.snapshot().metadata.id
    tracked = api._read("SELECT table_id, version, file, ict, ratified_ms FROM commits", ())
    assert [r[1] for r in tracked] == [1, 2, 3]
    assert t.backfill() == 3
    assert not (tmp_path / "t" / COMMITS_DIR).exists() or not list((tmp_path / "t" / COMMITS_DIR).iterdir())
    with api._write(tid) as tx:  # what the lost write leaves: the rows as before it, staged files gone
        for row in tracked:
            tx.execute("INSERT INTO commits VALUES (?, ?, ?, ?, ?)", row)
        tx.execute("UPDATE tables SET backfilled = 0 WHERE id = ?", (tid,))
    reader = DeltaTable.open(tmp_path / "t")
    assert reader.version() == 3
    assert sorted(reader.to_arrow().column("id").to_pylist()) == [0, 1, 2]
    assert api.backfill_all() == {tid: 3}
    assert api._read("SELECT COUNT(*) FROM commits", ()) == [(0,)]
    t.append(batch([3]))
    assert sorted(DeltaTable.open(tmp_path / "t").to_arrow().column("id").to_pylist()) == [0, 1, 2, 3]
