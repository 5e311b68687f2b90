"""The process's cache of latest table states (`log.load_latest`): a table opened again reads only the
commits written since, and the cache never serves another table's state or a stale one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta import checkpoint as delta_checkpoint
from feedlog.delta import log as delta_log
from feedlog.delta.log import list_log, load_state
from feedlog.errors import FeedlogError

from .conftest import rows


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    delta_log.forget_states()
    yield
    delta_log.forget_states()


def fresh(path: object) -> dict[str, object]:
    """What a reader that never saw the table gets (the log read whole, no cache)."""
    storage = LocalStorage(str(path))
    state = load_state(storage, list_log(storage))
    return {"version": state.version, "files": dict(state.files), "metadata": state.metadata, "txns": state.txns}


def cached(path: object) -> dict[str, object]:
    s = DeltaTable(str(path)).snapshot()
    return {"version": s.version, "files": dict(s.state.files), "metadata": s.metadata, "txns": s.state.txns}


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path LocalStorage reads from now on (one at a time or many at once), the real reads done."""
    reads: list[str] = []
    read, read_many = LocalStorage.read, LocalStorage.read_many

    def counting(self: LocalStorage, p: str) -> bytes:
        reads.append(p)
        return read(self, p)

    def counting_many(self: LocalStorage, ps: Sequence[str]) -> list[bytes | FeedlogError]:
        reads.extend(ps)
        return read_many(self, ps)

    monkeypatch.setattr(LocalStorage, "read", counting)
    monkeypatch.setattr(LocalStorage, "read_many", counting_many)
    return reads


def test_a_table_read_again_is_extended_by_the_commits_since(
    new_table: Callable[..., DeltaTable], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = new_table()
    path = t.storage.location
    t.append(rows(0, 5))
    assert cached(path) == fresh(path)
    assert path in delta_log._STATES
    writer = DeltaTable(path)
    writer.append(rows(5, 5), txn=("app", 1))
    writer.append(rows(10, 5))
    reads = counted_reads(monkeypatch)
    again = cached(path)
    monkeypatch.undo()
    assert again == fresh(path) and again["version"] == 3
    # the cached version's commit (its fingerprint) and the ones written since; nothing older
    commits = sorted(p.rsplit("/", 1)[-1] for p in reads if p.endswith(".json"))
    assert commits[0] == "00000000000000000001.json" and "00000000000000000003.json" in commits


def test_a_table_created_again_at_the_same_place_is_not_served_from_the_cache(
    new_table: Callable[..., DeltaTable], tmp_path: object
) -> None:
    t = new_table()
    path = t.storage.location
    for i in range(3):
        t.append(rows(i, 1))
    assert cached(path)["version"] == 3
    shutil.rmtree(path)
    other = pa.schema([("x", pa.int64())])
    u = DeltaTable.create(path, other)  # a different table, and as many commits as the cached one had
    for i in range(3):
        u.append(pa.table({"x": [i]}, schema=other))
    got = cached(path)
    assert got == fresh(path) and DeltaTable(path).snapshot().schema == other
    shutil.rmtree(path)
    DeltaTable.create(path, other)  # fewer commits than the cached version
    assert cached(path) == fresh(path) and cached(path)["version"] == 0


def test_a_rewritten_commit_at_the_cached_version_is_not_trusted(new_table: Callable[..., DeltaTable]) -> None:
    t = new_table()
    path = t.storage.location
    t.append(rows(0, 2))
    assert cached(path)["version"] == 1
    # version 1 replaced by another commit 1 (a table restored from a backup taken before the last
    # append, then appended to by another writer): the cached state of version 1 is not this one
    other = new_table("other")
    other.append(rows(100, 7))
    commit_1 = "_delta_log/00000000000000000001.json"
    t.storage.write_atomic(commit_1, other.storage.read(commit_1))
    assert cached(path) == fresh(path)
    assert DeltaTable(path).snapshot().num_records() == 7


def test_the_cache_is_bounded(new_table: Callable[..., DeltaTable]) -> None:
    paths = [new_table(f"t{i}").storage.location for i in range(delta_log._KEEP + 3)]
    for p in paths:
        cached(p)
    assert len(delta_log._STATES) == delta_log._KEEP
    assert list(delta_log._STATES) == paths[-delta_log._KEEP :]  # the least recently read went first


def test_a_state_handed_out_is_a_copy(new_table: Callable[..., DeltaTable]) -> None:
    t = new_table()
    path = t.storage.location
    t.append(rows(0, 3))
    for _ in range(2):  # the state read (a miss), then the one extended from the cache (a hit)
        DeltaTable(path).snapshot().state.files.clear()  # a caller changing its state changes nobody else's
        assert cached(path) == fresh(path)


def test_a_checkpoints_protocol_and_metadata_are_decoded_once_and_never_served_for_another_table(
    new_table: Callable[..., DeltaTable], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every listing asks for the table's protocol and metadata; from a checkpoint they are decoded once
    (~2 ms of Parquet each time otherwise), and a table created again at the same place, with its own
    checkpoint at the same version, gets its own."""
    t = new_table()
    path = t.storage.location
    t.append(rows(0, 2))
    t.checkpoint()
    decoded: list[int] = []
    decode = delta_checkpoint.decode_parquet

    def counting(*args: Any, **kw: Any) -> Any:
        decoded.append(1)
        return decode(*args, **kw)

    def metadata_id() -> str:
        storage = LocalStorage(path)
        return delta_log.load_protocol_metadata(storage, list_log(storage))[1].id

    first_id = metadata_id()
    DeltaTable(path).version()  # the latest state read once (the other cache)
    monkeypatch.setattr(delta_checkpoint, "decode_parquet", counting)
    for _ in range(5):
        assert metadata_id() == first_id
        DeltaTable(path).version()
    assert decoded == []
    monkeypatch.undo()
    shutil.rmtree(path)
    other = pa.schema([("x", pa.int64())])
    u = DeltaTable.create(path, other)
    u.append(pa.table({"x": [1]}, schema=other))
    u.checkpoint()
    assert metadata_id() == u.snapshot().metadata.id != first_id


def test_a_table_without_checkpoints_is_read_once_by_open_and_snapshot(
    new_table: Callable[..., DeltaTable], monkeypatch: pytest.MonkeyPatch
) -> None:
    # open() would find the protocol and metadata in commit 0 only by reading every commit back to
    # it: it replays the log instead and remembers the state, and the snapshot reads none of it again
    t = new_table()
    path = t.storage.location
    n = delta_log._TAIL_SCAN + 4
    for i in range(n):
        t.append(rows(i, 2), txn=("app", i))
    delta_log.forget_states()
    reads = counted_reads(monkeypatch)
    s = DeltaTable.open(path).snapshot()
    monkeypatch.undo()
    got = {"version": s.version, "files": dict(s.state.files), "metadata": s.metadata, "txns": s.state.txns}
    commits = [p.rsplit("/", 1)[-1] for p in reads if p.endswith(".json")]
    assert got == fresh(path) and got["version"] == n
    # every commit, each once but the newest few (searched first) and the latest (its fingerprint,
    # read when the state is remembered and when it is used)
    assert sorted(set(commits)) == [f"{v:020d}.json" for v in range(n + 1)]
    assert len(commits) <= n + 1 + delta_log._TAIL_SCAN + 2


# ---- a handle catching up on a local disk looks up the next versions, it does not list the log ----


def test_a_transaction_on_a_table_nobody_else_wrote_lists_nothing(
    new_table: Callable[..., DeltaTable], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = new_table()
    for i in range(3):
        t.append(rows(i, 1))
    other = DeltaTable.open(t.storage.location)
    other.append(rows(10, 2))  # version 4, written by another handle
    listed: list[str] = []
    storage_list = LocalStorage.list

    def counting(self: LocalStorage, *a: Any, **k: Any) -> Any:
        listed.append(str(a[0] if a else k))
        return storage_list(self, *a, **k)

    monkeypatch.setattr(LocalStorage, "list", counting)  # the real listing, counted
    tx = t.transaction()
    assert tx.base.version == 4 and t.snapshot().num_records() == 5  # the other handle's commit seen
    assert listed == []  # versions 4 and 5 looked up (found, not found): `_delta_log` was not listed


def test_a_handle_whose_version_was_cleaned_up_lists_and_reads_the_latest(
    new_table: Callable[..., DeltaTable], clock: Any
) -> None:
    t = new_table()
    t.append(rows(0, 1))
    reader = DeltaTable.open(t.storage.location, clock=clock)
    assert reader.snapshot().version == 1
    for i in range(5):
        t.append(rows(10 + i, 1))
    t.checkpoint()
    clock.advance(30 * 86_400_000)
    deleted = t.cleanup(retain_ms=0)
    assert "_delta_log/00000000000000000001.json" in deleted  # the reader's version is gone
    # version 2 is gone too: looking up the versions after 1 would find none, and take the table
    # for unchanged; its own commit missing tells the reader to list instead
    s = reader.snapshot()
    assert s.version == 6 and s.num_records() == 6
    assert reader.append(rows(20, 1)).version == 7


def test_a_handle_further_behind_than_the_lookups_lists_once(new_table: Callable[..., DeltaTable]) -> None:
    t = new_table()
    reader = DeltaTable.open(t.storage.location)
    assert reader.snapshot().version == 0
    n = delta_log._PROBE_LIMIT + 5
    for i in range(n):
        t.append(rows(i, 1))
    storage = reader.storage
    assert isinstance(storage, LocalStorage)
    assert delta_log._probe_commits_after(storage, 0) is None  # too far: a listing is cheaper
    assert sorted(delta_log.commits_after(storage, 0)) == list(range(1, n + 1))
    s = reader.snapshot()
    assert s.version == n and s.num_records() == n


def test_a_managed_table_whose_latest_is_not_backfilled_yet_lists_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its handle's version is ratified but not yet in `_delta_log` (backfill in batches): an older
    commit there, and no checkpoint past the version, say nothing was cleaned up, so the lookups
    settle it without a listing."""
    from feedlog.delta.managed import Binding

    t = DeltaTable.create(
        tmp_path / "t", rows(0, 1).schema, owner=Binding.feedlog(db=str(tmp_path / "o.db"), batch_size=100)
    )
    for i in range(2):
        t.append(rows(i, 1))
    t.checkpoint()  # version 2, backfilled for it; `_last_checkpoint` names it
    t.append(rows(2, 1))
    assert not (tmp_path / "t" / "_delta_log" / f"{3:020d}.json").exists()  # ratified, not backfilled
    storage = t.storage
    assert isinstance(storage, LocalStorage)
    assert delta_log._probe_commits_after(storage, 3, managed=True) == {}
    assert delta_log._probe_commits_after(storage, 3) is None  # a table with no owner: cleaned up
    other = DeltaTable.open(
        t.storage.location, owner=Binding.feedlog(db=str(tmp_path / "o.db")), owner_token=t.owner_token
    )
    other.append(rows(10, 2))  # version 4, ratified by another handle: the owner names it
    listed: list[str] = []
    storage_list = LocalStorage.list

    def counting(self: LocalStorage, *a: Any, **k: Any) -> Any:
        listed.append(str(a[0] if a else k))
        return storage_list(self, *a, **k)

    monkeypatch.setattr(LocalStorage, "list", counting)
    assert t.transaction().base.version == 4 and t.snapshot().num_records() == 5
    assert "_delta_log" not in " ".join(listed)


def test_a_missing_commit_below_a_newer_checkpoint_is_settled_by_a_listing(
    new_table: Callable[..., DeltaTable],
) -> None:
    """A cleanup that deletes out of order (an object store's batch delete, interrupted) leaves older
    commits beside a hole: with a checkpoint past the hole, only a listing can tell what is there,
    even on a managed table (where a missing latest commit is usually one not backfilled yet)."""
    t = new_table()
    reader = DeltaTable.open(t.storage.location)
    for i in range(4):
        t.append(rows(i, 1))
    assert reader.snapshot().version == 4
    for i in range(3):
        t.append(rows(10 + i, 1))
    t.checkpoint()  # version 7
    root = t.storage.location
    for v in (4, 5):  # the hole: the reader's version and the next, older ones kept
        os.remove(os.path.join(root, "_delta_log", f"{v:020d}.json"))
    storage = reader.storage
    assert isinstance(storage, LocalStorage)
    assert delta_log._probe_commits_after(storage, 4) is None
    # were the table managed, the hole would not pass for a commit not yet backfilled either
    assert delta_log._probe_commits_after(storage, 4, managed=True) is None
    s = reader.snapshot()
    assert s.version == 7 and s.num_records() == 7
