"""`log.read_commits`: a replay's commit files read many at a time (`storage.read_many`), decoded in
order, with a gap and a staged file cleaned up meanwhile handled as one commit at a time would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedlog.delta.actions import CommitInfo
from feedlog.delta.committer import commit_path
from feedlog.delta.log import READ_CHUNK, READ_CHUNK_BYTES, next_chunk, read_commits
from feedlog.delta.storage import FileInfo, LocalStorage, MemoryStorage, Storage, read_many
from feedlog.errors import Corruption, NotFound


def commit(version: int) -> bytes:
    return (
        json.dumps({"commitInfo": {"timestamp": version, "inCommitTimestamp": 1000 + version, "op": "x"}}) + "\n"
    ).encode()


def log_of(storage: Storage, versions: range) -> dict[int, FileInfo]:
    for v in versions:
        assert storage.put_if_absent(commit_path(v), commit(v))
    return {v: FileInfo(commit_path(v), None, None) for v in versions}


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return LocalStorage(tmp_path / "t") if request.param == "local" else MemoryStorage("reads")


def test_versions_across_chunks_come_in_order_the_last_with_its_whole_commit_info(storage: Storage) -> None:
    commits = log_of(storage, range(0, 23))
    got = list(read_commits(storage, commits, range(3, 23), last=22, chunk=4))
    assert [v for v, _ in got] == list(range(3, 23))
    infos = [actions[0] for _, actions in got]
    assert all(isinstance(i, CommitInfo) for i in infos)
    assert [i.in_commit_timestamp for i in infos] == [1000 + v for v in range(3, 23)]  # type: ignore[union-attr]
    # before `last`, the in-commit timestamp alone; the last keeps everything
    assert all(i.extra == {} for i in infos[:-1]), infos[0]  # type: ignore[union-attr]
    assert infos[-1].extra.get("op") == "x"  # type: ignore[union-attr]
    newest_first = [v for v, _ in read_commits(storage, commits, range(22, 9, -1), chunk=5)]
    assert newest_first == list(range(22, 9, -1))


def test_a_gap_is_corruption_after_every_version_before_it(storage: Storage) -> None:
    commits = log_of(storage, range(0, 12))
    del commits[9]
    seen = []
    with pytest.raises(Corruption, match=r"^commit 9 is missing from .* the log has a gap$"):
        for v, _ in read_commits(storage, commits, range(0, 12), chunk=4):
            seen.append(v)
    assert seen == list(range(0, 9))


def test_a_staged_commit_cleaned_up_after_its_backfill_is_read_from_the_log(storage: Storage) -> None:
    commits = log_of(storage, range(0, 3))
    staged = {v: FileInfo(f"_delta_log/_commits/{v:020d}.gone.json", None, None) for v in (1, 2)}
    got = dict(read_commits(storage, {**commits, **staged}, range(0, 3)))
    assert [a.in_commit_timestamp for v in range(3) for a in got[v]] == [1000, 1001, 1002]  # type: ignore[union-attr]
    storage.delete(commit_path(2))
    with pytest.raises(NotFound, match=r"^commit 2 disappeared while reading"):
        list(read_commits(storage, {**commits, **staged}, range(0, 3)))


def test_an_error_reading_a_later_commit_does_not_pre_empt_an_earlier_ones(storage: Storage) -> None:
    commits = log_of(storage, range(0, 6))
    storage.write_atomic(commit_path(2), b"not json\n")
    storage.delete(commit_path(4))  # read in the same chunk as 2: gone, and no staged copy either
    seen = []
    with pytest.raises(Corruption, match=r"^commit 2 line 1 is not JSON"):
        for v, _ in read_commits(storage, commits, range(0, 6)):
            seen.append(v)
    assert seen == [0, 1]


def test_chunks_shrink_while_commits_are_large() -> None:
    assert next_chunk(800) == READ_CHUNK
    assert next_chunk(READ_CHUNK_BYTES // 10) == 10
    assert next_chunk(READ_CHUNK_BYTES * 3) == 1
    assert next_chunk(0) == READ_CHUNK


def test_a_storage_that_overrides_read_alone_gets_every_read_through_it(tmp_path: Path) -> None:
    """A subclass that counts or fails reads (tests do both) overrides `read`: `read_many` must not
    go around it through the parent's own `read_many`."""

    class Counting(LocalStorage):
        def __init__(self, root: Path) -> None:
            super().__init__(root)
            self.reads: list[str] = []

        def read(self, path: str) -> bytes:
            self.reads.append(path)
            return super().read(path)

    counting = Counting(tmp_path / "t")
    commits = log_of(counting, range(0, 3))
    assert [v for v, _ in read_commits(counting, commits, range(0, 3))] == [0, 1, 2]
    assert counting.reads == [commit_path(v) for v in range(0, 3)]
    assert read_many(counting, ["missing"])[0].__class__ is NotFound


def test_only_ascii_digits_name_a_log_file(storage: Storage) -> None:
    """`\\d` and int() also read other scripts' digits: a file named with Arabic-Indic digits must not
    pass for commit 1 (it sorted after the real one and replaced it in the listing) nor a checkpoint."""
    from feedlog.delta.log import list_log

    log_of(storage, range(0, 3))
    fake = "\u0660" * 19 + "\u0661"
    storage.put_if_absent(f"_delta_log/{fake}.json", b"not a commit\n")
    storage.put_if_absent(f"_delta_log/{fake}.checkpoint.parquet", b"not a checkpoint")
    listing = list_log(storage)
    assert sorted(listing.commits) == [0, 1, 2] and listing.commits[1].path == commit_path(1)
    assert not listing.checkpoints
    # nor for a staged commit, a file cleanup may delete, or a commit on an object store
    from feedlog.delta.maintenance import _COMPACTED, _VERSIONED
    from feedlog.delta.managed.staged import staged_version
    from feedlog.delta.objectstore import _COMMIT_FILE

    assert staged_version(f"{fake}.0a1b2c3d-0000-4000-8000-000000000000.json") is None
    assert staged_version(f"{'0' * 19}1.0a1b2c3d-0000-4000-8000-000000000000.json") == 1
    assert _VERSIONED.fullmatch(f"{fake}.json") is None and _VERSIONED.fullmatch(f"{'0' * 20}.json")
    assert _COMPACTED.fullmatch(f"{fake}.{'0' * 20}.compacted.json") is None
    assert _COMMIT_FILE.search(f"t/_delta_log/{fake}.json") is None and _COMMIT_FILE.search(
        f"t/_delta_log/{'0' * 20}.json"
    )
