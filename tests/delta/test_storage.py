"""The storage contract (see feedlog/delta/storage.py), run against every implementation."""

import os
import threading

import pytest

from feedlog.delta.storage import LocalStorage
from feedlog.errors import NotFound

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
