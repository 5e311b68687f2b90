"""The storage contract (see feedlog/delta/storage.py), run against every implementation."""

import os
import threading

import pytest

from feedlog.delta.storage import LocalStorage
from feedlog.errors import NotFound, Unavailable

IMPLEMENTATIONS = {"local": LocalStorage}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def storage(request, tmp_path):
    return IMPLEMENTATIONS[request.param](tmp_path / "root")


def test_put_if_absent_has_exactly_one_winner_under_contention(storage):
    n = 16
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(n)

    def attempt(i: int) -> None:
        barrier.wait(timeout=10)
        results.append((i, storage.put_if_absent("_delta_log/00000000000000000001.json", f"writer {i}\n".encode())))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    winners = [i for i, won in results if won]
    assert len(results) == n and len(winners) == 1
    assert storage.read("_delta_log/00000000000000000001.json") == f"writer {winners[0]}\n".encode()
    assert [f.path for f in storage.list("_delta_log")] == ["_delta_log/00000000000000000001.json"]


def test_list_read_write_delete(storage):
    assert storage.list("_delta_log") == []
    with pytest.raises(NotFound):
        storage.read("missing")
    assert storage.put_if_absent("b", b"2") and storage.put_if_absent("a", b"1")
    assert not storage.put_if_absent("a", b"other")
    assert storage.read("a") == b"1"
    storage.write_atomic("a", b"replaced")
    assert storage.read("a") == b"replaced"
    listed = storage.list("")
    assert [f.path for f in listed] == ["a", "b"] and listed[0].size == len(b"replaced")
    assert storage.stat("a").modified_ms == listed[0].modified_ms
    storage.delete("a")
    storage.delete("a")  # deleting what is gone is fine
    assert [f.path for f in storage.list("")] == ["b"]


def test_in_flight_temp_files_are_not_listed(tmp_path):
    storage = LocalStorage(tmp_path)
    os.makedirs(tmp_path / "_delta_log")
    (tmp_path / "_delta_log" / ".00000000000000000000.json.abc.tmp").write_bytes(b"partial")
    assert storage.list("_delta_log") == []


def test_put_new_writes_a_name_of_its_own_in_place(tmp_path, monkeypatch):
    """`LocalStorage.put_new` (a staged commit's UUID name): no temp file, its directory made on first
    use, an existing file left alone (False), and a write that fails leaves no file behind."""
    storage = LocalStorage(tmp_path / "root")
    name = "_delta_log/_commits/00000000000000000001.0a1b.json"
    assert storage.put_new(name, b"first\n")
    assert storage.read(name) == b"first\n"
    assert [f.path for f in storage.list("_delta_log/_commits")] == [name]
    assert not storage.put_new(name, b"second\n")
    assert storage.read(name) == b"first\n"

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    other = "_delta_log/_commits/00000000000000000002.0a1b.json"
    with pytest.raises(Unavailable, match="No space left"):
        storage.put_new(other, b"x" * 10)
    monkeypatch.undo()
    assert [f.path for f in storage.list("_delta_log/_commits")] == [name]
    assert sorted(os.listdir(tmp_path / "root" / "_delta_log" / "_commits")) == ["00000000000000000001.0a1b.json"]

    # a cleanup that deletes the file while it is written: the write's own error, not the unlink's
    def cleaned_then_full(fd, data):
        os.unlink(storage._abs(other))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", cleaned_then_full)
    with pytest.raises(Unavailable, match="No space left"):
        storage.put_new(other, b"x")
    monkeypatch.undo()

    def fsync_fails(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(Unavailable, match="Input/output error"):
        storage.put_new(other, b"x")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "root" / "_delta_log" / "_commits")) == ["00000000000000000001.0a1b.json"]


def test_a_storage_that_overrides_put_if_absent_alone_gets_staged_files_through_it(tmp_path):
    """`storage.put_new` takes `LocalStorage.put_new` only where it goes with the class's own
    put_if_absent: a subclass that counts or fails put_if_absent sees every new file."""
    from feedlog.delta.storage import put_new

    class Counting(LocalStorage):
        puts = 0

        def put_if_absent(self, path, data):
            Counting.puts += 1
            return super().put_if_absent(path, data)

    counting = Counting(tmp_path / "a")
    assert put_new(counting, "x/1.json", b"1") and Counting.puts == 1
    plain = LocalStorage(tmp_path / "b")
    assert put_new(plain, "x/1.json", b"1") and not put_new(plain, "x/1.json", b"2")
    assert plain.read("x/1.json") == b"1"
