"""The `Committer` contract (feedlog/delta/committer.py), run against every implementation.

One parametrized fixture yields a table at version 0 and a way to make committers for it:

- `filesystem`: `FilesystemCommitter`, put-if-absent on `_delta_log/<v>.json`;
- `local-owner`: `ManagedCommitter` over the in-process `LocalOwner` (SQLite in tmp_path);
- `grpc-owner`: `ManagedCommitter` over `GrpcOwner`, talking to a real `OwnerServer` on 127.0.0.1;
- `local-pg-owner`, `grpc-pg-owner`: the same two with the owner's state on PostgreSQL (a schema of
  the test's own, tests/conftest.py's `postgres_url`; skipped, saying why, when no server answers).

The managed tables are registered with a commit 0 encoded here (no `DeltaTable` involved) and a
backfill batch size of 3, so the log a reader sees is sometimes all backfilled and sometimes
partly only in the owner's `ratified_commits`: both halves of the contract are exercised.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from feedlog.delta.actions import (
    ENABLE_ICT,
    ICT,
    MANAGED_COMMITS,
    Action,
    Add,
    CommitInfo,
    Metadata,
    Protocol,
    encode_commit,
)
from feedlog.delta.committer import CommitConflict, Committed, Committer, FilesystemCommitter, commit_path
from feedlog.delta.log import list_log, load_state
from feedlog.delta.managed import COMMITS_DIR, Auth, Binding, CommitOwner, ManagedCommitter, TableRef
from feedlog.delta.managed.client import GrpcOwner
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.storage import LocalStorage
from feedlog.errors import Corruption, NotFound
from feedlog_server.owner import OwnerServer

T0 = 1_790_000_000_000
TABLE_ID = "00000000-0000-0000-0000-00000000c0de"
TOKEN = "contract-token"
BATCH_SIZE = 3
SCHEMA_STRING = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


def commit_zero(binding: Binding | None) -> list[Action]:
    """Commit 0 of the table: a filesystem table, or one that installs `binding` as its owner."""
    if binding is None:
        return [
            CommitInfo(None, T0, "CREATE TABLE"),
            Protocol(1, 2),
            Metadata(TABLE_ID, SCHEMA_STRING, created_time=T0),
        ]
    conf = {ENABLE_ICT: "true", **binding.properties()}
    return [
        CommitInfo(T0, T0, "CREATE TABLE"),
        Protocol(1, 7, None, (ICT, MANAGED_COMMITS)),
        Metadata(TABLE_ID, SCHEMA_STRING, configuration=conf, created_time=T0),
    ]


@dataclass
class Harness:
    kind: str
    storage: LocalStorage
    #: a fresh committer, as a separate writer would hold (racers each get their own)
    new_committer: Callable[[], Committer]
    #: ask the owner to backfill everything it ratified (nothing to do for a filesystem table)
    backfill: Callable[[], object]
    committer: Committer = field(init=False)
    _icts: Iterator[int] = field(default_factory=lambda: itertools.count(T0 + 1000, 1000))
    _tags: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.committer = self.new_committer()

    def proposal(self, ict: int | None = None) -> tuple[bytes, list[Action]]:
        """A distinct commit (its own file, its own commitInfo) with an ICT after every earlier one."""
        tag = next(self._tags)
        ict = next(self._icts) if ict is None else ict
        actions: list[Action] = [
            CommitInfo(ict, ict, "WRITE", {}, {"txnId": f"contract-{tag}"}),
            Add(f"part-{tag:05d}.parquet", {}, 100 + tag, ict),
        ]
        return encode_commit(actions), actions

    def commit(self, version: int, committer: Committer | None = None) -> tuple[bytes, object]:
        data, actions = self.proposal()
        return data, (committer or self.committer).commit(self.storage, version, data, actions)

    def backfilled(self) -> list[int]:
        return sorted(list_log(self.storage).commits)

    def view(self) -> dict[int, bytes]:
        """Every commit a reader that asks the committer sees: the backfilled log, then the ratified rest."""
        fs = list_log(self.storage)
        out = {v: self.storage.read(info.path) for v, info in fs.commits.items()}
        for v, info in self.committer.ratified_commits(self.storage, fs.latest + 1):
            out[v] = read_ratified(self.storage, v, info.path)  # perhaps backfilled since it was listed
        return out

    def latest(self) -> int:
        return max(self.view())

    def staged(self) -> list[str]:
        return [f.path for f in self.storage.list(COMMITS_DIR, stat=False)]


def _managed(kind: str, storage: LocalStorage, owner: CommitOwner, binding: Binding) -> Harness:
    ref = TableRef(TABLE_ID, storage.location)

    def new_committer() -> ManagedCommitter:
        return ManagedCommitter(owner, ref, Auth(TOKEN))

    actions = commit_zero(binding)
    registered = new_committer().register(storage, 0, encode_commit(actions), actions, BATCH_SIZE)
    assert registered == Committed(0)
    return Harness(kind, storage, new_committer, lambda: new_committer().backfill())


@pytest.fixture(params=["filesystem", "local-owner", "grpc-owner", "local-pg-owner", "grpc-pg-owner"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    root = tmp_path / "tables"
    root.mkdir()
    storage = LocalStorage(root / "t")
    # the owner's state: a SQLite file, or a schema of this test's own on PostgreSQL
    db = request.getfixturevalue("postgres_url") if "pg" in request.param else str(tmp_path / "owner.db")
    if request.param == "filesystem":
        fs = FilesystemCommitter()
        actions = commit_zero(None)
        assert fs.commit(storage, 0, encode_commit(actions), actions) == Committed(0)
        yield Harness("filesystem", storage, FilesystemCommitter, lambda: None)
    elif request.param.startswith("local-"):
        local = LocalOwner(db)
        try:
            yield _managed(request.param, storage, local, Binding.feedlog(db=db, batch_size=BATCH_SIZE))
        finally:
            local.close()
    else:
        server = OwnerServer(db, "127.0.0.1:0", roots=[root]).start()
        client = GrpcOwner(server.endpoint, timeout=10)
        try:
            binding = Binding.feedlog(endpoint=server.endpoint, batch_size=BATCH_SIZE)
            yield _managed(request.param, storage, client, binding)
        finally:
            client.close()
            server.stop(grace=1)


def test_the_next_version_commits_and_becomes_readable(harness: Harness) -> None:
    assert harness.latest() == 0
    for version in range(1, 6):  # with a batch of 3, both backfilled and owner-only versions
        data, response = harness.commit(version)
        assert response == Committed(version)
        view = harness.view()
        assert sorted(view) == list(range(version + 1)) and view[version] == data
        # and a different committer (another writer) sees it the same way
        other = harness.new_committer()
        ratified = dict(other.ratified_commits(harness.storage, max(harness.backfilled()) + 1))
        assert version in harness.backfilled() or version in ratified


def test_a_taken_version_is_a_retryable_conflict_value(harness: Harness) -> None:
    first, won = harness.commit(1)
    assert won == Committed(1)
    loser = harness.new_committer()
    for taken in (0, 1):  # backfilled long ago, and just ratified (not backfilled by an owner yet)
        _, response = harness.commit(taken, loser)
        assert isinstance(response, CommitConflict)
        assert (response.version, response.retryable) == (taken, True)
    # the conflict changed nothing: the winner stays, and what won is what the loser reads next
    assert harness.view()[1] == first
    fs_latest = max(harness.backfilled())
    winners = dict(loser.ratified_commits(harness.storage, 1))
    seen = {v: harness.storage.read(commit_path(v)) for v in range(1, fs_latest + 1)}
    seen.update({v: read_ratified(harness.storage, v, info.path) for v, info in winners.items()})
    assert seen[1] == first
    # retryable means it: the next free version takes the loser's commit
    again, response = harness.commit(2, loser)
    assert response == Committed(2) and harness.view()[2] == again


def test_exactly_one_of_many_racers_wins_a_version(harness: Harness) -> None:
    n = 6
    barrier = threading.Barrier(n)
    results: dict[int, tuple[bytes, object]] = {}

    def race(i: int, committer: Committer) -> None:
        data, actions = harness.proposal(ict=T0 + 500)  # one attempt time for all: only the race decides
        barrier.wait(timeout=10)
        results[i] = (data, committer.commit(harness.storage, 1, data, actions))

    threads = [threading.Thread(target=race, args=(i, harness.new_committer())) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == n, "a racer did not finish"
    won = [data for data, r in results.values() if isinstance(r, Committed)]
    lost = [r for _, r in results.values() if not isinstance(r, Committed)]
    assert len(won) == 1 and all(r == Committed(1) for _, r in results.values() if isinstance(r, Committed))
    assert len(lost) == n - 1
    assert all(isinstance(r, CommitConflict) and r.version == 1 and r.retryable for r in lost)
    assert harness.view() == {0: harness.storage.read(commit_path(0)), 1: won[0]}
    # the losers' staged proposals are gone: only the winner's can still be backfilled
    assert len(harness.staged()) == (0 if harness.kind == "filesystem" else 1)


def read_ratified(storage: LocalStorage, version: int, path: str) -> bytes:
    """A listed commit's bytes as readers read them (`log.read_commit`): a served owner backfills in
    the background and then deletes the staged file, so one listed a moment ago may be in
    `_delta_log/<v>.json` by now, with the same bytes."""
    try:
        return storage.read(path)
    except NotFound:
        return storage.read(commit_path(version))


def test_ratified_commits_are_from_start_ascending_and_contiguous_with_the_log(harness: Harness) -> None:
    committed = {0: harness.storage.read(commit_path(0))}
    for version in range(1, 8):
        data, response = harness.commit(version)
        assert response == Committed(version)
        committed[version] = data
        backfilled = harness.backfilled()
        assert backfilled == list(range(len(backfilled)))  # the backfilled log itself has no gap
        for start in range(0, version + 3):
            ratified = harness.committer.ratified_commits(harness.storage, start)
            versions = [v for v, _ in ratified]
            assert all(v >= start for v in versions), (start, versions)
            if versions:
                assert versions == list(range(versions[0], versions[0] + len(versions))), (start, versions)
            for v, info in ratified:
                assert read_ratified(harness.storage, v, info.path) == committed[v]
            assert not versions or versions[0] == start, (start, versions)  # from start, or nothing
            if start <= backfilled[-1] + 1:
                # together with the backfilled log: every version up to the latest; a version the log
                # did not hold when it was listed is among the ratified ones (even if an owner has
                # backfilled it since: then named by its `_delta_log/<v>.json`)
                assert sorted({*backfilled, *versions}) == list(range(version + 1)), (start, versions)
                assert {v for v in range(start, version + 1) if v not in backfilled} <= set(versions)
        assert harness.view() == committed


def test_no_staged_file_is_left_once_backfilled(harness: Harness) -> None:
    for version in range(1, 5):
        assert harness.commit(version)[1] == Committed(version)
        assert isinstance(harness.commit(version, harness.new_committer())[1], CommitConflict)  # a loser too
    harness.backfill()
    assert harness.backfilled() == [0, 1, 2, 3, 4]
    assert harness.committer.ratified_commits(harness.storage, 5) == []
    assert harness.staged() == []


def test_a_gap_is_refused_by_an_owner_and_unreadable_on_a_filesystem(harness: Harness) -> None:
    assert harness.commit(1)[1] == Committed(1)
    gap = harness.latest() + 2
    data, response = harness.commit(gap)
    if harness.kind == "filesystem":
        # put-if-absent is the whole filesystem protocol: the committer cannot know the latest version
        # and takes any free one (writers commit only base + 1). A gap it let in is then reported by
        # every reader as corruption, never skipped over (PROTOCOL.md: versions are contiguous).
        assert response == Committed(gap) and harness.storage.read(commit_path(gap)) == data
        with pytest.raises(Corruption, match="gap"):
            load_state(harness.storage, list_log(harness.storage))
        return
    # managed: the owner checks that version - 1 is the latest (managed-commits RFC, "Commit Protocol"),
    # and retrying at a later version cannot help, so the conflict is not retryable
    assert isinstance(response, CommitConflict)
    assert (response.version, response.retryable) == (gap, False)
    assert sorted(harness.view()) == [0, 1]
    assert all(f"{gap:020d}." not in p for p in harness.staged())  # the refused proposal is not left behind
    assert harness.commit(2)[1] == Committed(2)  # the table is still fine for the next version
