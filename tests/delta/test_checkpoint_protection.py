"""Checkpoint protection (its RFC): writer requirements (a)-(d) in checkpoint creation and cleanup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.actions import Protocol, encode_commit
from feedlog.delta.committer import FilesystemCommitter, commit_path
from feedlog.delta.transaction import Transaction
from feedlog.errors import Unsupported

from .conftest import deltalake_read, rows

DAY = 86_400_000
PROTECT = "delta.requireCheckpointProtectionBeforeVersion"


def names(paths: list[str]) -> list[str]:
    return [p.rsplit("/", 1)[-1] for p in paths]


def history(new_table: Callable[..., DeltaTable], clock: ManualClock, boundary: int) -> DeltaTable:
    """Versions 0..7, one a day, checkpoints at 2, 4 and 6, protection before `boundary`."""
    t = new_table(properties={PROTECT: str(boundary)})
    assert "checkpointProtection" in (t.snapshot().protocol.writer_features or ())
    for v in range(1, 8):
        clock.advance(DAY)
        t.append(rows(v, 1))
        if v in (2, 4, 6):
            t.checkpoint()
    return t


def test_partial_cleanup_keeps_protected_checkpoints_and_deletes_commits_first(
    new_table: Callable[..., DeltaTable], clock: ManualClock
) -> None:
    t = history(new_table, clock, boundary=7)
    clock.advance(DAY // 2)
    deleted = names(t.cleanup(retain_ms=3 * DAY))  # cutoff commit 4 -> cutoff checkpoint 4 < 7
    assert deleted == [f"{v:020d}.json" for v in range(4)]  # (a): checkpoint 2 (< 7) stays
    assert (Path(t.storage.location) / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    assert t.to_arrow().num_rows == 7 and deltalake_read(t.storage.location).num_rows == 7


def test_cleanup_through_the_boundary_goes_in_one_go(new_table: Callable[..., DeltaTable], clock: ManualClock) -> None:
    t = history(new_table, clock, boundary=5)
    clock.advance(DAY // 2)
    deleted = names(t.cleanup(retain_ms=DAY))  # cutoff checkpoint 6 >= 5: everything before it
    commits = [f"{v:020d}.json" for v in range(6)]
    checkpoints = [f"{v:020d}.checkpoint.parquet" for v in (2, 4)]
    assert deleted == commits + checkpoints  # (d): all commits before any checkpoint
    assert t.to_arrow().num_rows == 7


def raw_commit(t: DeltaTable, clock: ManualClock, protocol: Protocol) -> int:
    """A protocol change written as another engine would (feedlog itself refuses unknown features)."""
    clock.advance(DAY)
    # not t.transaction(): that refuses such a table
    tx = Transaction(t.snapshot(), FilesystemCommitter(), clock, t.new_id)
    info = tx.plan(tx.base, clock.now_ms(), t.new_id())[0][0]
    version = tx.base.version + 1
    assert t.storage.put_if_absent(commit_path(version), encode_commit([info, protocol]))
    return version


def test_dropped_feature_history_is_checkpointed_and_truncated_only_safely(
    new_table: Callable[..., DeltaTable], clock: ManualClock
) -> None:
    """DROP FEATURE's layout: v1 adds a feature feedlog lacks, v2 drops it, protection before v5."""
    t = new_table(properties={PROTECT: "5"})
    supported = t.snapshot().protocol
    raw_commit(t, clock, Protocol(1, 7, None, (*(supported.writer_features or ()), "someFutureFeature")))
    with pytest.raises(Unsupported):
        t.append(rows(0, 1))
    raw_commit(t, clock, supported)
    for v in range(3, 8):
        clock.advance(DAY)
        t.append(rows(v, 1))
        if v in (3, 5, 6):
            t.checkpoint()
    with pytest.raises(Unsupported, match="protected version 5"):
        t.checkpoint(1)  # (b): version 1's protocol is not one feedlog supports
    assert t.checkpoint(2) == 2  # but version 2's is
    clock.advance(DAY // 2)
    assert t.cleanup(retain_ms=3 * DAY) == []  # (c): would cut [0, 3) with v1 in it, not through 5
    deleted = names(t.cleanup(retain_ms=DAY))  # cutoff checkpoint 6: all of history before 5 in one go
    assert deleted == [f"{v:020d}.json" for v in range(6)] + [f"{v:020d}.checkpoint.parquet" for v in (2, 3, 5)]
    assert t.to_arrow().num_rows == 5 and deltalake_read(t.storage.location).num_rows == 5
