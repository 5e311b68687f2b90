import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock
from feedlog.delta import ConcurrentModification, DeltaTable, SchemaMismatch, TableNotFound
from feedlog.delta.actions import Add
from feedlog.errors import AlreadyExists, Conflict, Corruption, InvalidArgument, NotFound, Unsupported

from .conftest import SCHEMA, T0, rows, sorted_rows


def commit_json(table: DeltaTable, version: int) -> list[dict[str, Any]]:
    raw = table.storage.read(f"_delta_log/{version:020d}.json")
    return [json.loads(line) for line in raw.splitlines()]


def test_append_and_time_travel_by_version_and_timestamp(new_table, clock):
    t = new_table(partition_by=["p"])
    for i in range(3):
        clock.advance(1000)
        assert t.append(rows(i * 10, 10, part="ab"[i % 2])).version == i + 1
    assert t.version() == 3
    assert sorted_rows(t.to_arrow(), "seq")[-1] == (29,)
    assert t.snapshot(1).num_records() == 10 and t.to_arrow(2).num_rows == 20
    assert t.snapshot(timestamp_ms=T0 + 2500).version == 2
    assert t.snapshot(timestamp_ms=T0 + 10**9).version == 3
    with pytest.raises(NotFound, match="before the earliest available commit"):
        t.snapshot(timestamp_ms=T0 - 1)
    with pytest.raises(NotFound, match="version 9 does not exist"):
        t.snapshot(9)
    s = t.snapshot()
    assert {a.partition_values["p"] for a in s.files()} == {"a", "b"}
    assert s.to_arrow().schema == SCHEMA  # partition column restored, in schema order


def test_every_commit_starts_with_commit_info_carrying_a_monotonic_ict(new_table, clock):
    t = new_table()
    icts = [t.snapshot().in_commit_timestamp]
    for skew in (5000, -60_000, 0, -1, 120_000):  # a clock that jumps around
        clock.advance(skew)
        icts.append(t.append(rows(0, 1)).in_commit_timestamp)
    assert all(b > a for a, b in itertools.pairwise(icts))
    for v in range(t.version() + 1):
        first = commit_json(t, v)[0]
        assert first["commitInfo"]["inCommitTimestamp"] == icts[v]
    assert icts[2] == icts[1] + 1  # clock behind: previous ICT + 1 (ICT writer requirement 3)


def test_exactly_once_txn_skips_a_retried_batch(new_table):
    t = new_table()
    assert t.txn_version("job") is None
    first = t.append(rows(0, 5), txn=("job", 1))
    again = t.append(rows(0, 5), txn=("job", 1))
    older = t.append(rows(0, 5), txn=("job", 0))
    assert first.version == 1 and again.skipped and older.skipped and again.version is None
    t.append(rows(5, 5), txn=("job", 2))
    assert t.txn_version("job") == 2 and t.snapshot().num_records() == 10
    assert t.snapshot(1).txn_version("job") == 1


def test_blind_appends_from_concurrent_writers_all_land(tmp_path):
    clock = ManualClock(T0)
    DeltaTable.create(tmp_path / "t", SCHEMA, clock=clock)
    writers, per_writer = 4, 5
    errors: list[BaseException] = []

    def work(w: int) -> None:
        table = DeltaTable.open(tmp_path / "t", clock=clock)  # its own view, like another process
        try:
            for i in range(per_writer):
                table.append(rows(w * 100 + i, 1))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    t = DeltaTable.open(tmp_path / "t")
    assert t.version() == writers * per_writer
    assert sorted_rows(t.to_arrow(), "seq") == sorted((w * 100 + i,) for w in range(writers) for i in range(per_writer))
    icts = [e.in_commit_timestamp for e in reversed(t.history()) if e.in_commit_timestamp is not None]
    assert len(icts) == writers * per_writer + 1
    assert all(b > a for a, b in itertools.pairwise(icts))  # a frozen clock still gives increasing ICTs


def test_lost_race_rebases_and_recomputes_version_and_ict(new_table, clock, tmp_path):
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    tx = t.transaction()
    tx.add_files(t.write_files(rows(0, 3)))
    clock.advance(1000)
    won = other.append(rows(10, 3))
    clock.advance(-500)  # our clock is behind the winner's
    result = tx.commit()
    assert (won.version, result.version, result.attempts) == (1, 2, 2)
    assert won.in_commit_timestamp is not None
    assert result.in_commit_timestamp == won.in_commit_timestamp + 1
    assert commit_json(t, 2)[0]["commitInfo"]["readVersion"] == 0
    assert t.snapshot().num_records() == 6


def test_real_conflicts_are_reported_not_rebased(new_table, clock, tmp_path):
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    t.append(rows(0, 1))

    tx = t.transaction()  # same txn appId committed concurrently
    tx.set_txn("job", 1)
    other.append(rows(1, 1), txn=("job", 1))
    with pytest.raises(ConcurrentModification, match="txn appId 'job'"):
        tx.commit()

    tx = t.transaction()  # metadata changed concurrently
    tx.add_files(t.write_files(rows(2, 1)))
    other.set_properties({"delta.logRetentionDuration": "interval 2 days"})
    with pytest.raises(ConcurrentModification, match="protocol or metadata"):
        tx.commit()

    tx = t.transaction()  # an overwrite must not silently drop a concurrent append
    tx.reads_whole_table = True
    tx.remove_files(tx.base.files.values())
    other.append(rows(3, 1))
    with pytest.raises(ConcurrentModification, match="overwrite did not see"):
        tx.commit()

    assert isinstance(ConcurrentModification("x"), Conflict)


def test_claimed_txn_ranges_are_rechecked_on_every_rebase(new_table, clock, tmp_path):
    """The Spark sink's exactly-once: a range another writer landed meanwhile is skipped, half of it
    is a Conflict, an earlier range is no conflict at all (the transaction rebases over it)."""
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)

    def claim(first: int, end: int) -> Any:
        tx = t.transaction()
        tx.set_txn("feedlog:aa", end, since=first)
        tx.add_files(t.write_files(rows(first, end - first)))
        return tx

    def land(first: int, end: int) -> None:
        tx = other.transaction()
        tx.set_txn("feedlog:aa", end, since=first)
        tx.add_files(other.write_files(rows(first, end - first)))
        assert other.commit(tx).version is not None

    tx = claim(0, 10)
    land(0, 10)  # the same range, landed first: ours is a duplicate
    result = tx.commit()
    assert result.skipped and result.version is None and t.snapshot().num_records() == 10

    tx = claim(20, 30)
    land(10, 20)  # the range before ours: compatible, so we rebase and land after it
    result = tx.commit()
    assert (result.version, result.attempts) == (3, 2)
    assert t.txn_version("feedlog:aa") == 30 and t.snapshot().num_records() == 30

    tx = claim(30, 40)
    land(30, 35)  # part of ours
    with pytest.raises(Conflict, match=r"inside this commit's range 30\.\.40"):
        tx.commit()
    with pytest.raises(InvalidArgument, match="is empty"):
        t.transaction().set_txn("feedlog:aa", 5, since=5)


def test_failed_commit_leaves_no_data_files(new_table, clock, tmp_path):
    new_table()
    t = DeltaTable.open(tmp_path / "t", clock=clock)  # a handle with no state yet: its append reads the table
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    other.append(rows(0, 1), txn=("job", 5))
    t.max_commit_attempts = 1
    # t's append reads the table, then loses the race to a commit of the same appId
    tx_files_before = {p.name for p in (tmp_path / "t").glob("*.parquet")}
    orig = t.transaction

    def racing_transaction(operation: str = "WRITE", **kw: Any):
        tx = orig(operation, **kw)
        other.append(rows(1, 1), txn=("job", 6))
        return tx

    t.transaction = racing_transaction  # type: ignore[method-assign]
    with pytest.raises(ConcurrentModification):
        t.append(rows(2, 1), txn=("job", 6))
    after = {p.name for p in (tmp_path / "t").glob("*.parquet")}
    assert len(after - tx_files_before) == 1  # only the winner's file


def test_overwrite_replaces_rows_and_keeps_tombstones(new_table):
    t = new_table()
    t.append(rows(0, 5))
    result = t.append(rows(100, 2), mode="overwrite")
    assert sorted_rows(t.to_arrow(), "seq") == [(100,), (101,)]
    assert len(t.snapshot().state.tombstones) == 1 and t.to_arrow(result.version - 1).num_rows == 5
    with pytest.raises(InvalidArgument, match="mode must be"):
        t.append(rows(0, 1), mode="upsert")


def test_append_only_tables_refuse_removals(new_table):
    t = new_table(properties={"delta.appendOnly": "true"})
    assert t.snapshot().protocol.writer_features == ("appendOnly", "inCommitTimestamp")
    t.append(rows(0, 1))
    with pytest.raises(InvalidArgument, match="append-only"):
        t.append(rows(0, 1), mode="overwrite")


def test_errors_are_typed_and_say_what_is_wrong(new_table, tmp_path):
    with pytest.raises(TableNotFound, match="no Delta table"):
        DeltaTable.open(tmp_path / "missing")
    t = new_table()
    with pytest.raises(AlreadyExists):
        new_table()
    with pytest.raises(SchemaMismatch, match="columns not in the table schema"):
        t.append(pa.table({"seq": [1], "extra": [2]}))
    with pytest.raises(InvalidArgument, match="partition columns not in the schema"):
        new_table("u", partition_by=["nope"])

    t.storage.write_atomic("_delta_log/00000000000000000001.json", b'{"commitInfo":{"inCommitTimestamp":1}')
    with pytest.raises(Corruption, match="commit 1 line 1 is not JSON"):
        t.snapshot()


def write_commit(table: DeltaTable, version: int, *actions: dict[str, Any]) -> None:
    body = "\n".join(json.dumps(a) for a in actions) + "\n"
    assert table.storage.put_if_absent(f"_delta_log/{version:020d}.json", body.encode())


def test_unsupported_features_refused_with_their_names(new_table):
    reader = new_table("r")
    write_commit(
        reader,
        1,
        {"commitInfo": {"inCommitTimestamp": T0 + 1}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["someFutureFeature"],
                      "writerFeatures": ["someFutureFeature", "inCommitTimestamp"]}},
    )  # fmt: skip
    with pytest.raises(Unsupported, match=r"reader feature\(s\) feedlog does not support: \['someFutureFeature'\]"):
        reader.snapshot()
    writer = new_table("w")
    write_commit(
        writer,
        1,
        {"commitInfo": {"inCommitTimestamp": T0 + 1}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                      "writerFeatures": ["inCommitTimestamp", "generatedColumns"]}},
    )  # fmt: skip
    assert writer.to_arrow().num_rows == 0  # readable...
    with pytest.raises(Unsupported, match="generatedColumns"):
        writer.append(rows(0, 1))  # ...but not writable


def test_a_bad_ict_is_reported_where_times_matter_and_reading_and_writing_go_on(new_table):
    """Issue 16 item 5: one commit without an ICT, or with one that goes backwards, leaves every
    version readable and the table writable; history and time lookups name the commit."""
    t = new_table()
    t.append(rows(0, 1))
    add = Add("x.parquet", {}, 1, T0, True).to_json()
    write_commit(t, 2, {"add": add})
    fresh = DeltaTable.open(t.storage)
    assert [f.path for f in fresh.snapshot().files()][-1] == "x.parquet"
    assert fresh.snapshot(1).version == 1
    for read in (fresh.history, lambda: fresh.version_at(T0 + 10**9)):
        with pytest.raises(Corruption, match=r"commit 2 has no inCommitTimestamp"):
            read()
    t.storage.delete("_delta_log/00000000000000000002.json")
    write_commit(t, 2, {"commitInfo": {"inCommitTimestamp": T0 - 5}}, {"add": add})
    fresh = DeltaTable.open(t.storage)
    assert fresh.snapshot().version == 2 and fresh.snapshot(2).in_commit_timestamp == T0 - 5
    with pytest.raises(Corruption, match=r"commit 2 has inCommitTimestamp .* not after version 1's"):
        fresh.history()
    with pytest.raises(Corruption, match=r"commit 2 has inCommitTimestamp .* not after version \d's"):
        fresh.version_at(T0 - 1)
    # the repair: the next commit's ICT goes past the bad one, and times from then on resolve
    result = fresh.append(rows(1, 1))
    assert result.version == 3
    ict3 = fresh.snapshot().in_commit_timestamp
    assert ict3 is not None and ict3 > max(T0 - 5, fresh.snapshot(1).in_commit_timestamp or 0)
    assert fresh.version_at(ict3) == 3 and fresh.version_at(ict3 + 10**6) == 3


def test_gap_in_the_log_is_corruption(new_table):
    t = new_table()
    for i in range(3):
        t.append(rows(i, 1))
    t.storage.delete("_delta_log/00000000000000000002.json")
    with pytest.raises(Corruption, match="commit 2 is missing"):
        DeltaTable.open(t.storage).snapshot()  # a reader that has not seen version 2


def test_big_writes_are_split_into_files_written_in_parallel(new_table, monkeypatch):
    from feedlog.delta import writer

    monkeypatch.setattr(writer, "PARALLEL_SPLIT_ROWS", 10)
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    t = new_table(partition_by=["p"])
    t.append(pa.concat_tables([rows(0, 30, "a"), rows(30, 5, "b")]))
    files = t.snapshot().files()
    assert sorted(a.num_records() or 0 for a in files) == [5, 10, 10, 10]
    assert len({a.path for a in files}) == 4
    assert sorted_rows(t.to_arrow(), "seq") == [(i,) for i in range(35)]


def test_a_write_that_fails_on_one_file_leaves_none_of_its_files(tmp_path: Path) -> None:
    """write_files splits big data into files written in parallel: one failing must not strand the
    others (nothing would ever reference them)."""
    from feedlog.delta.storage import LocalStorage
    from feedlog.delta.writer import WriteOptions, write_files
    from feedlog.errors import Unavailable

    class ThirdPutFails(LocalStorage):
        puts = 0

        def put_if_absent(self, path: str, data: bytes) -> bool:
            ThirdPutFails.puts += 1
            if ThirdPutFails.puts == 3:
                raise Unavailable("disk full")
            return super().put_if_absent(path, data)

    storage = ThirdPutFails(str(tmp_path))
    ids = (str(i) for i in itertools.count())
    with pytest.raises(Unavailable, match="disk full"):
        write_files(storage, SCHEMA, (), rows(0, 50), T0, lambda: next(ids), WriteOptions(max_rows_per_file=10))
    assert ThirdPutFails.puts == 5 and not list(tmp_path.rglob("*.parquet"))


def test_a_committer_of_ones_own_with_the_protocols_signature_commits_and_rebases(tmp_path, clock):
    """`DeltaTable(committer=...)` takes any `Committer`: exactly the protocol's four arguments."""
    from feedlog.delta.committer import CommitResponse, FilesystemCommitter
    from feedlog.delta.storage import FileInfo

    class Counting:
        def __init__(self) -> None:
            self.inner, self.calls = FilesystemCommitter(), 0

        def commit(self, storage: Any, version: int, data: bytes, actions: Any) -> CommitResponse:
            self.calls += 1
            return self.inner.commit(storage, version, data, actions)

        def ratified_commits(self, storage: Any, start_version: int) -> list[tuple[int, FileInfo]]:
            return self.inner.ratified_commits(storage, start_version)

    mine = Counting()
    t = DeltaTable.create(tmp_path / "t", SCHEMA, committer=mine, clock=clock)
    tx = t.transaction()
    tx.add_files(t.write_files(rows(0, 2)))
    DeltaTable.open(tmp_path / "t", clock=clock).append(rows(10, 2))  # takes version 1 first
    result = tx.commit()
    assert (result.version, result.attempts, mine.calls) == (2, 2, 3)
    assert t.snapshot().num_records() == 4


def read_counter(t: DeltaTable) -> list[bool]:
    """Records each time `t` reads the table's latest state (a listing, or the owner's round trip)."""
    reads: list[bool] = []
    latest = t._latest

    def counted(write: bool = False) -> Any:
        reads.append(write)
        return latest(write)

    t._latest = counted  # type: ignore[method-assign]
    return reads


def parquet_files(t: DeltaTable) -> set[str]:
    return {p.name for p in Path(t.storage.location).glob("*.parquet")}


def test_a_handle_that_keeps_its_state_writes_on_it_and_rebases_when_it_is_stale(new_table, clock, tmp_path):
    """transaction(refresh=False) starts from what the handle last read or committed, without asking the
    table; the commit rebases onto anything newer, so nothing is lost and versions stay contiguous."""
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    assert t.append(rows(0, 1)).version == 1
    assert other.append(rows(1, 1)).version == 2  # t's state is now one version behind
    reads = read_counter(t)
    tx = t.transaction("WRITE", refresh=False)
    assert tx.base.version == 1 and not reads  # the handle's own state: the table was not read
    tx.add_files(t.write_files(rows(2, 1)))
    result = t.commit(tx)
    assert (result.version, result.attempts) == (3, 2)  # lost to version 2, rebased onto it
    tx = t.transaction("WRITE", refresh=False)
    assert tx.base.version == 3  # the state it committed
    assert t.transaction("WRITE").base.version == 3  # the default reads the table: nothing newer
    other.append(rows(3, 1))
    assert t.transaction("WRITE").base.version == 4
    assert sorted_rows(DeltaTable.open(tmp_path / "t").to_arrow(), "seq") == [(0,), (1,), (2,), (3,)]


def test_appends_through_one_handle_do_not_reread_the_table_and_lose_nothing(new_table, clock, tmp_path):
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    t.append(rows(0, 1))
    reads = read_counter(t)
    for i in range(1, 4):
        assert t.append(rows(i, 1)).attempts == 1
    assert not reads  # alone on the table, each append was its commit and nothing else
    other.append(rows(10, 1))
    other.append(rows(11, 1))
    result = t.append(rows(4, 1))
    assert (result.version, result.attempts) == (7, 2)  # stale: lost once, rebased onto the winners
    assert t.version() == 7
    assert sorted_rows(t.to_arrow(), "seq") == [(i,) for i in (0, 1, 2, 3, 4, 10, 11)]
    assert len(parquet_files(t)) == 7


def test_an_append_on_a_stale_handle_after_a_metadata_change_is_written_again_on_the_latest_state(
    new_table, clock, tmp_path
):
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    t.append(rows(0, 1))
    other.set_properties({"delta.logRetentionDuration": "interval 2 days"})
    result = t.append(rows(1, 1))  # its files were shaped by the old metadata: dropped, written again
    assert result.version == 3
    s = DeltaTable.open(tmp_path / "t").snapshot()
    assert s.metadata is not None and s.metadata.configuration["delta.logRetentionDuration"] == "interval 2 days"
    assert sorted_rows(s.to_arrow(), "seq") == [(0,), (1,)]
    assert parquet_files(t) == {Path(a.path).name for a in s.files()}  # the first try's file is gone


def test_a_stale_append_whose_txn_landed_meanwhile_is_skipped_and_leaves_no_files(new_table, clock, tmp_path):
    t = new_table()
    other = DeltaTable.open(tmp_path / "t", clock=clock)
    t.append(rows(0, 1), txn=("job", 1))
    other.append(rows(1, 1), txn=("job", 2))  # the retried batch another process landed first
    result = t.append(rows(1, 1), txn=("job", 2))  # t's state still says job is at 1
    assert result.skipped and result.version is None
    s = DeltaTable.open(tmp_path / "t").snapshot()
    assert s.version == 2 and s.txn_version("job") == 2 and s.num_records() == 2
    assert parquet_files(t) == {Path(a.path).name for a in s.files()}  # no file of the skipped batch
