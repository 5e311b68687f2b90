"""The storage contract (feedlog/delta/storage.py's docstring), run against every implementation.

Each contract is one test, parametrized over `LocalStorage` on a temporary directory,
`MemoryStorage`, and `ObjectStorage` on S3 (moto's server on loopback), on obstore's memory store
and on file:// URLs; the Delta tables at the end show that the in-memory storage is enough for
the protocol, which keeps protocol tests off the disk.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable, Storage
from feedlog.delta.log import list_log
from feedlog.delta.maintenance import DAY_MS
from feedlog.delta.objectstore import ObjectStorage
from feedlog.delta.storage import LocalStorage, MemoryStorage, delete_in, read_many, walk
from feedlog.errors import NotFound

from .conftest import SCHEMA, T0, counter_ids, rows, sorted_rows

IMPLEMENTATIONS: dict[str, Callable[[pytest.FixtureRequest, Any], Storage]] = {
    "local": lambda request, tmp_path: LocalStorage(tmp_path / "root"),
    "memory": lambda request, tmp_path: MemoryStorage("contract"),
    "obstore-s3": lambda request, tmp_path: ObjectStorage(
        request.getfixturevalue("s3_server").url("contract"), request.getfixturevalue("s3_server").options
    ),
    "obstore-memory": lambda request, tmp_path: ObjectStorage(f"memory://contract-{uuid.uuid4().hex}"),
    "obstore-file": lambda request, tmp_path: ObjectStorage(f"file://{tmp_path}/root"),
}

COMMIT_1 = "_delta_log/00000000000000000001.json"


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def storage(request: pytest.FixtureRequest, tmp_path) -> Storage:
    return IMPLEMENTATIONS[request.param](request, tmp_path)


def run_threads(n: int, target: Callable[[int], None]) -> None:
    """Start `n` threads at once (a barrier) and wait for all of them, bounded."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            target(i)
        except BaseException as e:  # surfaced below: a thread's exception must fail the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors


# location


def test_location_names_the_table(storage: Storage) -> None:
    assert isinstance(storage.location, str) and storage.location


def test_memory_location_is_a_memory_url() -> None:
    assert MemoryStorage("t1").location == "memory://t1"


# read and stat


def test_missing_files_are_not_found(storage: Storage) -> None:
    for path in ("missing", "_delta_log/00000000000000000000.json", "no/such/dir/file"):
        with pytest.raises(NotFound):
            storage.read(path)
        with pytest.raises(NotFound):
            storage.stat(path)


def test_a_path_under_a_file_is_not_found(storage: Storage) -> None:
    assert storage.put_if_absent("plain", b"x")
    with pytest.raises(NotFound):
        storage.read("plain/child")
    with pytest.raises(NotFound):
        storage.stat("plain/child")


def test_read_returns_exactly_the_bytes_written(storage: Storage) -> None:
    every_byte = bytes(range(256)) * 3
    assert storage.put_if_absent("bin", every_byte)
    assert storage.put_if_absent("empty", b"")
    assert storage.put_if_absent("a/b/c/deep.json", b"{}\n")  # missing directories are created
    assert storage.read("bin") == every_byte
    assert storage.read("empty") == b""
    assert storage.read("a/b/c/deep.json") == b"{}\n"


def test_read_many_is_each_read_in_order_with_each_failure_in_its_place(storage: Storage) -> None:
    """`read_many` (a storage's own, or one read after another): the bytes `read` returns, in the
    order asked, a NotFound where `read` would raise one, nothing raised for the others; files
    larger than a local read's first chunk, several directories, the same path twice."""
    files = {
        "_delta_log/00000000000000000001.json": b'{"commitInfo":{}}\n',
        "_delta_log/00000000000000000002.json": bytes(range(256)) * 1000,  # 256,000 bytes
        "_delta_log/_commits/00000000000000000003.0.json": b"",
        "top": b"x" * 65_536,  # exactly one first read: the next read finds the end
    }
    for path, data in files.items():
        assert storage.put_if_absent(path, data)
    asked = [
        "_delta_log/00000000000000000002.json",
        "_delta_log/00000000000000000009.json",
        "top",
        "no/such/dir/file",
        "_delta_log/_commits/00000000000000000003.0.json",
        "top/child",
        "_delta_log/00000000000000000001.json",
        "_delta_log/00000000000000000002.json",
    ]
    got = read_many(storage, asked)
    assert len(got) == len(asked)
    for path, result in zip(asked, got, strict=True):
        if path in files:
            assert result == files[path], path
        else:
            assert isinstance(result, NotFound), (path, result)
            with pytest.raises(NotFound):
                storage.read(path)
    assert read_many(storage, []) == []


def test_stat_matches_list(storage: Storage) -> None:
    storage.put_if_absent("_delta_log/x.json", b"12345")
    (listed,) = storage.list("_delta_log")
    assert storage.stat("_delta_log/x.json") == listed
    assert listed.path == "_delta_log/x.json" and listed.size == 5


def test_modification_time_is_the_time_of_the_write(storage: Storage) -> None:
    before = SystemClock().now_ms()
    storage.put_if_absent("f", b"1")
    after = SystemClock().now_ms()
    modified = storage.stat("f").modified_ms
    # a file system's timestamps may be coarser than the clock's: one second of slack either side
    assert modified is not None and before - 1000 <= modified <= after + 1000


# put_if_absent


def test_put_if_absent_refuses_an_existing_file_and_keeps_it(storage: Storage) -> None:
    assert storage.put_if_absent(COMMIT_1, b"first\n") is True
    assert storage.put_if_absent(COMMIT_1, b"second\n") is False
    assert storage.read(COMMIT_1) == b"first\n"
    storage.write_atomic("other", b"x")
    assert storage.put_if_absent("other", b"y") is False  # whichever call wrote it
    assert storage.read("other") == b"x"


def test_put_if_absent_has_exactly_one_winner_under_contention(storage: Storage) -> None:
    n = 16
    results: dict[int, bool] = {}

    def attempt(i: int) -> None:
        results[i] = storage.put_if_absent(COMMIT_1, f"writer {i}\n".encode())

    run_threads(n, attempt)
    winners = [i for i, won in results.items() if won]
    assert len(results) == n and len(winners) == 1
    assert storage.read(COMMIT_1) == f"writer {winners[0]}\n".encode()
    assert [f.path for f in storage.list("_delta_log")] == [COMMIT_1]


def test_put_if_absent_races_for_many_versions_have_one_winner_each(storage: Storage) -> None:
    """Writers racing version by version, as committers do: every version is won exactly once."""
    versions, n = 20, 4
    won: dict[int, list[int]] = {v: [] for v in range(versions)}

    def writer(i: int) -> None:
        for v in range(versions):
            if storage.put_if_absent(f"_delta_log/{v:020d}.json", f"{i}\n".encode()):
                won[v].append(i)  # list.append is atomic

    run_threads(n, writer)
    assert all(len(w) == 1 for w in won.values()), won
    for v, (i,) in won.items():
        assert storage.read(f"_delta_log/{v:020d}.json") == f"{i}\n".encode()


def test_put_if_absent_on_different_paths_all_succeed(storage: Storage) -> None:
    n = 8
    results: dict[int, bool] = {}

    def attempt(i: int) -> None:
        results[i] = storage.put_if_absent(f"part-{i:05d}.parquet", bytes([i]) * 100)

    run_threads(n, attempt)
    assert results == {i: True for i in range(n)}
    assert [f.path for f in storage.list("")] == [f"part-{i:05d}.parquet" for i in range(n)]


def test_readers_never_see_a_partial_put(storage: Storage) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    seen: list[int] = []
    done = threading.Event()

    def run(i: int) -> None:
        if i == 0:
            try:
                for k in range(8):
                    assert storage.put_if_absent(f"f{k}", big)
            finally:
                done.set()
            return
        for _ in range(10_000):  # bounded; the writer finishes long before
            for k in range(8):
                try:
                    data = storage.read(f"f{k}")
                except NotFound:
                    continue
                assert data == big, f"read {len(data)} bytes of f{k}"
                seen.append(k)
            if done.is_set():
                break

    run_threads(3, run)
    assert all(storage.read(f"f{k}") == big for k in range(8))


# write_atomic


def test_write_atomic_creates_and_replaces(storage: Storage) -> None:
    storage.write_atomic("_delta_log/_last_checkpoint", b"old")
    assert storage.read("_delta_log/_last_checkpoint") == b"old"
    storage.write_atomic("_delta_log/_last_checkpoint", b"new, longer")
    assert storage.read("_delta_log/_last_checkpoint") == b"new, longer"
    assert storage.stat("_delta_log/_last_checkpoint").size == len(b"new, longer")
    assert [f.path for f in storage.list("_delta_log")] == ["_delta_log/_last_checkpoint"]


def test_readers_see_the_old_or_the_new_file_never_a_mix(storage: Storage) -> None:
    old, new = b"o" * (1 << 20), b"n" * (1 << 19)
    storage.write_atomic("f", old)
    done = threading.Event()

    def run(i: int) -> None:
        if i == 0:
            try:
                for k in range(12):
                    storage.write_atomic("f", new if k % 2 == 0 else old)
            finally:
                done.set()
            return
        for _ in range(10_000):  # bounded; the writer finishes long before
            data = storage.read("f")
            assert data in (old, new), f"read {len(data)} bytes mixing the two versions"
            if done.is_set():
                break

    run_threads(3, run)
    assert storage.read("f") == old


# delete


def test_delete_removes_and_forgives_missing_files(storage: Storage) -> None:
    storage.put_if_absent("a", b"1")
    storage.put_if_absent("b", b"2")
    storage.delete("a")
    with pytest.raises(NotFound):
        storage.read("a")
    with pytest.raises(NotFound):
        storage.stat("a")
    storage.delete("a")  # deleting what is gone is fine
    storage.delete("never/was")
    assert [f.path for f in storage.list("")] == ["b"]
    assert storage.put_if_absent("a", b"again")  # the name is free again
    assert storage.read("a") == b"again"


def test_walk_passes_over_the_names_skip_gives(storage: Storage) -> None:
    for path in ("p=a/x", "p=a/y", "p=a/q=1/x", "z", "x"):
        storage.put_if_absent(path, b"1")
    skip = {"p=a": {"x"}, "": {"z"}}
    found = {f.path: f for f in walk(storage, None, lambda d: skip.get(d, ()))}
    assert set(found) == {"p=a/y", "p=a/q=1/x", "x"}
    assert all(f.size == 1 and f.modified_ms is not None for f in found.values())


def test_delete_in_removes_names_of_one_directory_and_forgives_missing_ones(storage: Storage) -> None:
    for path in ("p=a/x", "p=a/y", "p=a/z", "top", "keep"):
        storage.put_if_absent(path, b"1")
    assert delete_in(storage, "p=a", iter(["x", "gone", "y"])) == 3
    assert delete_in(storage, "", ["top"]) == 1
    assert delete_in(storage, "never", ["was"]) == 1
    assert [f.path for f in storage.list("p=a")] == ["p=a/z"] and [f.path for f in storage.list("")] == ["keep"]


# list


def test_a_missing_directory_lists_as_empty(storage: Storage) -> None:
    assert storage.list("_delta_log") == []
    assert storage.list("_delta_log/_commits", start_after="x", stat=False) == []
    assert storage.list("") == []


def test_list_is_sorted_by_name_whatever_the_write_order(storage: Storage) -> None:
    names = [f"{v:020d}.json" for v in range(12)]
    names += ["00000000000000000010.checkpoint.parquet", "_last_checkpoint", "Z", "a", "a0", "a-b", "é"]
    shuffled = names[:]
    random.Random(7).shuffle(shuffled)
    for name in shuffled:
        assert storage.put_if_absent(f"_delta_log/{name}", name.encode())
    listed = storage.list("_delta_log")
    assert [f.path for f in listed] == [f"_delta_log/{n}" for n in sorted(names)]
    assert [f.size for f in listed] == [len(n.encode()) for n in sorted(names)]
    assert all(isinstance(f.modified_ms, int) for f in listed)


def test_list_holds_only_the_files_directly_in_the_directory(storage: Storage) -> None:
    storage.put_if_absent("_delta_log/00000000000000000000.json", b"0")
    storage.put_if_absent("_delta_log/_commits/00000000000000000001.abc.json", b"1")
    storage.put_if_absent("_delta_log_other/x", b"x")  # shares a prefix, not the directory
    storage.put_if_absent("part-0.parquet", b"p")
    assert [f.path for f in storage.list("_delta_log")] == ["_delta_log/00000000000000000000.json"]
    assert [f.path for f in storage.list("_delta_log/_commits")] == [
        "_delta_log/_commits/00000000000000000001.abc.json"
    ]
    assert [f.path for f in storage.list("")] == ["part-0.parquet"]


def test_list_starts_after_a_name(storage: Storage) -> None:
    for v in range(5):
        storage.put_if_absent(f"_delta_log/{v:020d}.json", b"{}")
    after_2 = storage.list("_delta_log", start_after=f"{2:020d}.json")
    assert [f.path for f in after_2] == [f"_delta_log/{v:020d}.json" for v in (3, 4)]
    # start_after is a name, compared as a string: it need not exist, and it is excluded if it does
    assert [f.path for f in storage.list("_delta_log", start_after="00000000000000000001")] == [
        f"_delta_log/{v:020d}.json" for v in (1, 2, 3, 4)
    ]
    assert storage.list("_delta_log", start_after=f"{4:020d}.json") == []
    assert len(storage.list("_delta_log", start_after=None)) == 5


def test_list_without_stat_still_names_every_file(storage: Storage) -> None:
    for name in ("b", "a", "c"):
        storage.put_if_absent(f"d/{name}", b"123")
    plain = storage.list("d", stat=False)
    assert [f.path for f in plain] == ["d/a", "d/b", "d/c"]
    # size and time may be left out, but if given they are the real ones
    assert all(f.size in (None, 3) for f in plain)
    assert [f.path for f in storage.list("d", start_after="a", stat=False)] == ["d/b", "d/c"]


def test_hidden_names_are_not_listed(storage: Storage) -> None:
    storage.put_if_absent("_delta_log/.00000000000000000000.json.abc.tmp", b"partial")
    storage.put_if_absent("_delta_log/00000000000000000000.json", b"{}")
    assert [f.path for f in storage.list("_delta_log")] == ["_delta_log/00000000000000000000.json"]
    assert storage.read("_delta_log/.00000000000000000000.json.abc.tmp") == b"partial"  # hidden, not gone


def test_listing_while_writers_add_files_sees_only_whole_files(storage: Storage) -> None:
    done = threading.Event()

    def run(i: int) -> None:
        if i == 0:
            try:
                for v in range(30):
                    storage.put_if_absent(f"_delta_log/{v:020d}.json", b"x" * 1000)
            finally:
                done.set()
            return
        for _ in range(10_000):  # bounded; the writer finishes long before
            listed = storage.list("_delta_log")
            assert [f.size for f in listed] == [1000] * len(listed)
            # names are taken in order, so a listing is always a prefix of the versions
            assert [f.path for f in listed] == [f"_delta_log/{v:020d}.json" for v in range(len(listed))]
            if done.is_set():
                break

    run_threads(2, run)
    assert len(storage.list("_delta_log")) == 30


# MemoryStorage's own promises


def test_memory_storage_takes_modification_times_from_its_clock() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage("t", clock=clock)
    storage.put_if_absent("a", b"1")
    clock.advance(5)
    storage.write_atomic("b", b"2")
    clock.advance(5)
    assert [f.modified_ms for f in storage.list("")] == [T0, T0 + 5]
    storage.write_atomic("a", b"3")
    assert storage.stat("a").modified_ms == T0 + 10


def test_memory_storage_keeps_a_copy_of_what_it_is_given() -> None:
    storage = MemoryStorage()
    data = bytearray(b"abc")
    storage.put_if_absent("a", data)  # type: ignore[arg-type]
    data[0] = ord("x")
    assert storage.read("a") == b"abc"


def test_memory_storages_are_separate() -> None:
    one, two = MemoryStorage("one"), MemoryStorage("two")
    one.put_if_absent("a", b"1")
    assert two.list("") == [] and two.put_if_absent("a", b"2")
    assert one.read("a") == b"1"


# the protocol on a MemoryStorage: no disk needed


def memory_table(clock: ManualClock, **kw) -> DeltaTable:
    return DeltaTable.create(MemoryStorage("t", clock=clock), SCHEMA, clock=clock, new_id=counter_ids(), **kw)


def test_delta_table_in_memory_creates_appends_reads_and_lists_history() -> None:
    clock = ManualClock(T0)
    table = memory_table(clock, partition_by=["p"])
    assert table.storage.location == "memory://t"
    clock.advance(1000)
    assert table.append(rows(0, 3, "a")).version == 1
    clock.advance(1000)
    assert table.append(rows(3, 2, "b")).version == 2
    clock.advance(1000)
    assert table.append(rows(5, 2), txn=("job", 1)).version == 3
    assert table.append(rows(5, 2), txn=("job", 1)).skipped

    assert table.version() == 3
    assert sorted(table.to_arrow().column("seq").to_pylist()) == list(range(7))
    assert sorted(table.to_arrow(1).column("seq").to_pylist()) == [0, 1, 2]
    assert sorted_rows(table.to_arrow(2), "seq", "p") == [(0, "a"), (1, "a"), (2, "a"), (3, "b"), (4, "b")]
    history = table.history()
    assert [h.version for h in history] == [3, 2, 1, 0]
    assert [h.timestamp for h in history] == [T0 + 3000, T0 + 2000, T0 + 1000, T0]
    assert table.txn_version("job") == 1
    assert table.version_at(T0 + 1500) == 1

    reopened = DeltaTable.open(table.storage, clock=clock)
    assert reopened.version() == 3
    assert sorted(reopened.to_arrow().column("seq").to_pylist()) == list(range(7))


def test_delta_table_in_memory_overwrites_checkpoints_and_cleans_up() -> None:
    clock = ManualClock(T0)
    table = memory_table(clock)
    for start in range(0, 8, 2):
        clock.advance(DAY_MS)
        table.append(rows(start, 2))
    assert table.checkpoint() == 4
    clock.advance(DAY_MS)
    table.append(rows(100, 1), mode="overwrite")
    assert table.to_arrow().column("seq").to_pylist() == [100]
    clock.advance(10 * DAY_MS)
    assert table.cleanup(retain_ms=DAY_MS)
    listing = list_log(table.storage)
    assert listing.earliest == 4 and listing.latest == 5
    assert DeltaTable.open(table.storage).to_arrow().column("seq").to_pylist() == [100]


def test_delta_table_in_memory_ict_enabled_late_uses_the_storage_clock() -> None:
    """The enabling ICT exceeds the previous commit file's time (ICT writer requirement 5)."""
    clock = ManualClock(T0)
    table = memory_table(clock, in_commit_timestamps=False)
    clock.advance(1000)
    table.append(rows(0, 1))
    clock.set(T0)  # the writer's clock is behind the file's time
    result = table.enable_ict()
    assert result.in_commit_timestamp == T0 + 1000 + 1


def test_concurrent_appends_to_a_memory_table_all_land() -> None:
    table = DeltaTable.create(MemoryStorage("t"), SCHEMA)
    n, each = 4, 3
    versions: list[int | None] = []

    def writer(i: int) -> None:
        mine = DeltaTable.open(table.storage)
        for k in range(each):
            versions.append(mine.append(rows(100 * i + k, 1)).version)

    run_threads(n, writer)
    assert sorted(v for v in versions if v is not None) == list(range(1, n * each + 1))
    assert sorted(table.to_arrow().column("seq").to_pylist()) == sorted(
        100 * i + k for i in range(n) for k in range(each)
    )


def test_memory_table_arrow_types_round_trip() -> None:
    clock = ManualClock(T0)
    table = memory_table(clock)
    table.append(rows(0, 2))
    out = table.to_arrow()
    assert out.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert out.column("value").to_pylist() == [(0).to_bytes(4, "big"), (1).to_bytes(4, "big")]
