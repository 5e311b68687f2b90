"""History and timestamp time travel across the in-commit-timestamp enablement boundary."""

import math
import os

import pytest

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.actions import ICT_ENABLEMENT_TIMESTAMP, ICT_ENABLEMENT_VERSION
from feedlog.errors import InvalidArgument, NotFound

from .conftest import SCHEMA, T0, CountingStorage, counter_ids, rows


def set_file_time(table: DeltaTable, version: int, ms: int) -> None:
    path = os.path.join(table.storage.location, "_delta_log", f"{version:020d}.json")
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


@pytest.fixture
def enabled_late(tmp_path):
    """Versions 0-3 without ICT (file times T0, T0+10s, ...), ICT enabled at 4 by a clock running behind."""
    clock = ManualClock(T0)
    t = DeltaTable.create(tmp_path / "t", SCHEMA, in_commit_timestamps=False, clock=clock, new_id=counter_ids())
    for i in range(3):
        t.append(rows(i, 1))
    for v in range(4):
        set_file_time(t, v, T0 + v * 10_000)
    clock.set(T0 - 3_600_000)  # an hour behind the file times
    result = t.enable_ict()
    assert result.version == 4
    for _ in range(3):
        clock.advance(5)
        t.append(rows(9, 1))
    return t, clock


def test_enabling_ict_on_an_existing_table(enabled_late):
    t, _ = enabled_late
    s = t.snapshot(4)
    assert s.protocol.writer_features == ("appendOnly", "invariants", "inCommitTimestamp")
    ict = s.in_commit_timestamp
    assert ict == T0 + 30_000 + 1  # ICT writer requirement 5: after the previous commit file's time
    assert s.properties[ICT_ENABLEMENT_VERSION] == "4"
    assert s.properties[ICT_ENABLEMENT_TIMESTAMP] == str(ict)
    assert t.enable_ict().skipped


def test_history_uses_file_times_before_and_icts_from_the_enablement_version(enabled_late):
    t, _ = enabled_late
    h = list(reversed(t.history()))
    assert [e.version for e in h] == list(range(8))
    assert [e.timestamp for e in h[:4]] == [T0, T0 + 10_000, T0 + 20_000, T0 + 30_000]
    assert [e.in_commit_timestamp for e in h[:4]] == [None] * 4
    assert [e.timestamp for e in h[4:]] == [T0 + 30_001 + i for i in range(4)]
    assert h[4].operation == "SET TBLPROPERTIES" and h[5].operation_parameters["mode"] == "Append"
    assert [e.version for e in t.history(limit=2)] == [7, 6]
    assert t.history(limit=0) == []
    with pytest.raises(InvalidArgument, match="history limit must be >= 0"):
        t.history(limit=-1)  # before: every commit but the oldest


def test_version_at_follows_the_reader_rules_across_the_boundary(enabled_late):
    t, _ = enabled_late
    assert t.version_at(T0) == 0
    assert t.version_at(T0 + 19_999) == 1
    assert t.version_at(T0 + 30_000) == 3  # before the enablement timestamp: only versions < 4
    assert t.version_at(T0 + 30_001) == 4  # at it: only versions >= 4
    assert t.version_at(T0 + 30_002) == 5
    assert t.version_at(T0 + 10**9) == 7
    with pytest.raises(NotFound, match="before the earliest available commit"):
        t.version_at(T0 - 1)
    # a file time edited after the fact does not move ICT versions
    set_file_time(t, 5, T0 + 10**8)
    assert t.version_at(T0 + 30_002) == 5


def test_file_times_are_made_monotonic(tmp_path):
    t = DeltaTable.create(tmp_path / "t", SCHEMA, in_commit_timestamps=False)
    t.append(rows(0, 1))
    t.append(rows(1, 1))
    for v, ms in ((0, T0), (1, T0 + 5000), (2, T0 + 1000)):  # version 2's file time went backwards
        set_file_time(t, v, ms)
    assert [e.timestamp for e in reversed(t.history())] == [T0, T0 + 5000, T0 + 5001]
    assert t.version_at(T0 + 5000) == 1 and t.version_at(T0 + 5001) == 2


def test_version_at_reads_a_logarithmic_number_of_commits(tmp_path):
    clock = ManualClock(T0)
    DeltaTable.create(tmp_path / "t", SCHEMA, clock=clock)
    storage = CountingStorage(tmp_path / "t")
    t = DeltaTable.open(storage, clock=clock)
    n = 300
    for _i in range(n):
        clock.advance(10)
        tx = t.transaction()
        tx.commit()  # empty commits: only commitInfo
    t.checkpoint()
    storage.reads.clear()
    assert t.version_at(T0 + 10 * 123 + 5) == 123
    commit_reads = [p for p in storage.reads if p.endswith(".json")]
    # the latest snapshot (checkpoint + its commit) plus the binary search
    assert len(commit_reads) <= 2 + math.ceil(math.log2(n + 1)) + 1, commit_reads
