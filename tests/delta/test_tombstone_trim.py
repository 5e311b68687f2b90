"""A state extended commit after commit forgets its expired tombstones (`TableState.trim_tombstones`):
a streaming ingest's table handle kept every file its auto-compaction ever removed, ~10 a second,
and its memory grew for as long as it ran."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable, replay
from feedlog.delta.actions import DELETED_FILE_RETENTION, Add, CommitInfo, Metadata, Protocol, Remove
from feedlog.delta.replay import TRIM_TOMBSTONES_FROM, TableState

from .conftest import rows

RETENTION_MS = 60_000


def a_state() -> TableState:
    state = TableState()
    schema = '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}}]}'
    metadata = Metadata("id", schema, (), {DELETED_FILE_RETENTION: "interval 60 seconds"})
    state.apply(0, [CommitInfo(1_000, 1_000), Protocol(1, 2), metadata])
    return state


def test_a_state_applying_commit_after_commit_keeps_only_the_unexpired_tombstones() -> None:
    """10,000 commits 100 ms apart, each replacing a file (as a compaction does): without the trim
    the state held all 10,000 removes; 60 s of retention is 600 of them, kept at most twice over."""
    state = a_state()
    for v in range(1, 10_001):
        t = 1_000 + 100 * v
        removes = [Remove(f"f{v - 1}", t)] if v > 1 else []
        state.apply(v, [CommitInfo(t, t), Add(f"f{v}", {}, 10, t, True), *removes])
    last = 1_000 + 100 * 10_000
    unexpired = {f"f{v - 1}" for v in range(2, 10_001) if 1_000 + 100 * v + RETENTION_MS > last}
    assert unexpired <= set(state.tombstones)  # every tombstone a vacuum may still need is kept
    assert len(state.tombstones) <= 2 * max(len(unexpired), TRIM_TOMBSTONES_FROM)
    assert list(state.files) == ["f10000"]


def test_tombstones_are_kept_while_the_commits_are_younger_than_the_retention() -> None:
    state = a_state()
    for v in range(1, 3 * TRIM_TOMBSTONES_FROM):  # all within one retention period: none has expired
        t = 1_000 + v
        state.apply(v, [CommitInfo(t, t), Add(f"f{v}", {}, 10, t, True), Remove(f"g{v}", t)])
    assert len(state.tombstones) == 3 * TRIM_TOMBSTONES_FROM - 1


def test_a_table_handle_committing_for_long_keeps_only_the_unexpired_tombstones(
    new_table: Callable[..., DeltaTable], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's handle: appends and compactions on the state it committed last, a second apart."""
    monkeypatch.setattr(replay, "TRIM_TOMBSTONES_FROM", 8)  # a few hundred commits instead of thousands
    table = new_table(properties={DELETED_FILE_RETENTION: "interval 10 seconds"})
    removed = 0
    for i in range(60):
        table.append(rows(i, 1))
        result = table.optimize()
        removed += result.files_removed
        clock.advance(1_000)
    kept = table.snapshot().state.tombstones
    now = clock.now_ms()
    unexpired = {p for p, r in kept.items() if r.deletion_timestamp is not None and r.deletion_timestamp + 10_000 > now}
    assert removed >= 100  # what the handle held before (each a tombstone until this run is long over)
    assert len(kept) <= 2 * max(len(unexpired), 8) < 60
    # a reader opening the table replays the same log and keeps as few
    assert len(DeltaTable(table.storage.location).snapshot().state.tombstones) < 60
