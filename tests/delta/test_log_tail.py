"""`list_log_tail` on a local disk: the newest checkpoint and the commits after it are found by
lookups, not by listing `_delta_log` (whose cost grows with the log's age), and wherever the lookups
cannot be sure, a listing decides as before."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta import log as delta_log
from feedlog.delta.checkpoint import LAST_CHECKPOINT
from feedlog.delta.log import list_log, list_log_tail, load_state

from .conftest import rows

LOG = "_delta_log"


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    delta_log.forget_states()
    yield
    delta_log.forget_states()


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories LocalStorage lists from now on (the real listings, counted)."""
    seen: list[str] = []
    storage_list = LocalStorage.list

    def counting(self: LocalStorage, directory: str, *a: Any, **k: Any) -> Any:
        seen.append(directory)
        return storage_list(self, directory, *a, **k)

    monkeypatch.setattr(LocalStorage, "list", counting)
    return seen


def table_with_checkpoint(new_table: Callable[..., DeltaTable], commits: int = 23, at: int = 20) -> DeltaTable:
    t = new_table()
    for i in range(commits):
        t.append(rows(i, 1))
    t.checkpoint(at)
    return t


def state_of(path: str | os.PathLike[str]) -> tuple[int, list[str], dict[str, Any]]:
    """(version, live files, txns) as a reader that lists the whole log gets them."""
    storage = LocalStorage(path)
    s = load_state(storage, list_log(storage))
    return s.version, sorted(s.files), dict(s.txns)


def snapshot_of(path: str | os.PathLike[str]) -> tuple[int, list[str], dict[str, Any]]:
    s = DeltaTable.open(path).snapshot()
    return s.version, sorted(s.state.files), dict(s.state.txns)


def test_a_cold_open_finds_the_latest_state_without_listing_the_log(
    new_table: Callable[..., DeltaTable], listed: list[str]
) -> None:
    t = table_with_checkpoint(new_table)
    root = t.storage.location
    want = state_of(root)
    listed.clear()
    tail = list_log_tail(LocalStorage(root))
    assert sorted(tail.commits) == [20, 21, 22, 23] and sorted(tail.checkpoints) == [20]
    assert snapshot_of(root) == want and want[0] == 23
    assert LOG not in listed


def test_a_v2_checkpoint_is_found_by_the_name_last_checkpoint_gives(
    new_table: Callable[..., DeltaTable], listed: list[str]
) -> None:
    t = table_with_checkpoint(new_table, commits=5, at=3)
    root = Path(t.storage.location)
    # the same state as a V2 checkpoint (a JSON one, as delta-spark may write), named by _last_checkpoint
    classic = root / LOG / f"{3:020d}.checkpoint.parquet"
    storage = LocalStorage(root)
    actions = [json.loads(line) for line in (root / LOG / f"{0:020d}.json").read_text().splitlines()]
    state = load_state(storage, list_log(storage), 3)
    lines = [json.dumps({"checkpointMetadata": {"version": 3}})]
    lines += [json.dumps(a) for a in actions if "protocol" in a or "metaData" in a]
    lines += [json.dumps({"add": a.to_json()}) for a in state.files.values()]
    name = f"{3:020d}.checkpoint.00000000-0000-0000-0000-000000000001.json"
    (root / LOG / name).write_text("\n".join(lines) + "\n")
    classic.unlink()
    last = json.loads((root / LAST_CHECKPOINT).read_text())
    last["v2Checkpoint"] = {"path": name, "sizeInBytes": 1, "modificationTime": 0}
    (root / LAST_CHECKPOINT).write_text(json.dumps(last))
    want = state_of(root)
    listed.clear()
    tail = list_log_tail(LocalStorage(root))
    assert tail.checkpoints[3].kind == "v2" and tail.checkpoints[3].path == f"{LOG}/{name}"
    assert snapshot_of(root) == want and want[0] == 5
    assert LOG not in listed


@pytest.mark.parametrize("damage", ["checkpoint gone", "its commit cleaned up", "multi-part", "a path elsewhere"])
def test_where_lookups_cannot_be_sure_the_log_is_listed(
    new_table: Callable[..., DeltaTable], listed: list[str], damage: str
) -> None:
    t = table_with_checkpoint(new_table)
    root = Path(t.storage.location)
    t.checkpoint(10)  # an older checkpoint a listing can fall back on
    last = root / LAST_CHECKPOINT
    doc = json.loads(last.read_text())
    if damage == "checkpoint gone":
        doc["version"] = 20
        (root / LOG / f"{20:020d}.checkpoint.parquet").unlink()
    elif damage == "its commit cleaned up":
        doc["version"] = 20
        (root / LOG / f"{20:020d}.json").unlink()
    elif damage == "multi-part":
        doc["parts"] = 2
    else:
        doc["v2Checkpoint"] = {"path": f"../../{20:020d}.checkpoint.parquet"}
    last.write_text(json.dumps(doc))
    want = state_of(root)
    listed.clear()
    assert snapshot_of(root) == want and want[0] == 23
    assert LOG in listed


def test_a_log_far_past_its_checkpoint_is_listed_once_and_read_whole(
    new_table: Callable[..., DeltaTable], listed: list[str]
) -> None:
    t = table_with_checkpoint(new_table, commits=3, at=2)
    for i in range(delta_log._PROBE_LIMIT + 3):
        t.append(rows(100 + i, 1))
    root = t.storage.location
    want = state_of(root)
    listed.clear()
    assert snapshot_of(root) == want
    assert LOG in listed
