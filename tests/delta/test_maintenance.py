import json

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.checkpoint import canonical_json, checksum
from feedlog.delta.log import list_log, load_state
from feedlog.delta.maintenance import DAY_MS
from feedlog.delta.replay import parse_interval
from feedlog.errors import InvalidArgument, NotFound

from .conftest import T0, rows, sorted_rows


def test_last_checkpoint_checksum_matches_the_protocol_example():
    doc = json.loads(
        '{"k0":"\'v 0\'", "checksum": "adsaskfljadfkjadfkj", "k1":{"k2": 2, "k3": ["v3", [1, 2], '
        '{"k4": "v4", "k5": ["v5", "v6", "v7"]}]}}'
    )
    assert canonical_json(doc) == (
        '"k0"="%27v%200%27","k1"+"k2"=2,"k1"+"k3"+0="v3","k1"+"k3"+1+0=1,"k1"+"k3"+1+1=2,'
        '"k1"+"k3"+2+"k4"="v4","k1"+"k3"+2+"k5"+0="v5","k1"+"k3"+2+"k5"+1="v6","k1"+"k3"+2+"k5"+2="v7"'
    )
    assert checksum(doc) == "6a92d155a59bf2eecbd4b4ec7fd1f875"


def test_parse_interval():
    assert parse_interval("interval 30 days") == 30 * DAY_MS
    assert parse_interval("INTERVAL 1 week") == 7 * DAY_MS
    assert parse_interval("interval 2 hours") == 7_200_000
    with pytest.raises(InvalidArgument, match="bad interval"):
        parse_interval("30 days")


def test_checkpoint_replays_to_the_same_state_and_points_last_checkpoint_at_it(new_table, clock):
    t = new_table(partition_by=["p"])
    t.append(rows(0, 3, "a"), txn=("app", 1))
    t.append(rows(3, 3, "b"))
    clock.advance(1000)
    t.append(rows(6, 1, "a"), mode="overwrite")
    assert t.checkpoint() == 3
    last = json.loads(t.storage.read("_delta_log/_last_checkpoint"))
    assert last["version"] == 3 and last["checksum"] == checksum(last)
    assert last["numOfAddFiles"] == 1 and last["size"] == 2 + 1 + 1 + 2  # protocol, metaData, txn, add, removes

    listing = list_log(t.storage)
    from_checkpoint = load_state(t.storage, listing)
    from_commits = load_state(t.storage, type(listing)(listing.commits, {}))
    for field in ("version", "protocol", "metadata", "txns", "files", "commit_info"):
        assert getattr(from_checkpoint, field) == getattr(from_commits, field), field
    assert {p: r.path for p, r in from_checkpoint.tombstones.items()} == {
        p: r.path for p, r in from_commits.tombstones.items()
    }
    assert from_checkpoint.ict == from_commits.ict  # read from the commit file beside the checkpoint

    t.checkpoint(1)  # an older checkpoint does not move _last_checkpoint back
    assert json.loads(t.storage.read("_delta_log/_last_checkpoint"))["version"] == 3


def test_checkpoint_drops_expired_tombstones(new_table, clock):
    t = new_table(properties={"delta.deletedFileRetentionDuration": "interval 1 hours"})
    t.append(rows(0, 1))
    t.append(rows(1, 1), mode="overwrite")
    clock.advance(3_600_001)
    t.checkpoint()
    listing = list_log(t.storage)
    assert load_state(t.storage, type(listing)({2: listing.commits[2]}, listing.checkpoints)).tombstones == {}


def test_cleanup_keeps_the_cutoff_checkpoint_its_commit_and_everything_after(new_table, clock):
    t = new_table()
    for i in range(1, 10):
        clock.set(T0 + i * DAY_MS)
        t.append(rows(i, 1))
        if i in (3, 6):
            t.checkpoint()
    clock.set(T0 + 9 * DAY_MS)
    # nothing is old enough: no checkpoint at or before the cutoff commit
    assert t.cleanup(retain_ms=9 * DAY_MS + 1) == []
    deleted = t.cleanup(retain_ms=4 * DAY_MS)  # cutoff commit 5 -> cutoff checkpoint 3
    names = [p.rsplit("/", 1)[-1] for p in deleted]
    assert names == [f"{v:020d}.json" for v in range(3)]
    listing = list_log(t.storage)
    assert listing.earliest == 3 and 3 in listing.commits and 3 in listing.checkpoints
    assert sorted_rows(t.to_arrow(3), "seq") == [(1,), (2,), (3,)]
    with pytest.raises(NotFound, match="older than the retained log"):
        t.snapshot(2)
    with pytest.raises(NotFound, match="before the earliest available commit"):
        t.version_at(T0 + 2 * DAY_MS)
    assert t.version_at(T0 + 3 * DAY_MS) == 3
    assert t.history()[-1].version == 3

    deleted = t.cleanup(retain_ms=0)  # cutoff commit 9 -> cutoff checkpoint 6
    assert [p.rsplit("/", 1)[-1] for p in deleted] == [  # every commit before any checkpoint
        "00000000000000000003.json",
        "00000000000000000004.json",
        "00000000000000000005.json",
        "00000000000000000003.checkpoint.parquet",
    ]
    assert t.snapshot().num_records() == 9 and t.version() == 9
    assert sorted_rows(t.to_arrow(6), "seq") == [(i,) for i in range(1, 7)]
    with pytest.raises(InvalidArgument):
        t.cleanup(retain_ms=-1)


def test_cleanup_uses_the_table_retention_by_default(new_table, clock):
    t = new_table(properties={"delta.logRetentionDuration": "interval 2 days"})
    for i in range(1, 5):
        clock.set(T0 + i * DAY_MS)
        t.append(rows(i, 1))
    t.checkpoint(2)
    clock.set(T0 + 4 * DAY_MS)
    assert [p.rsplit("/", 1)[-1] for p in t.cleanup()] == ["00000000000000000000.json", "00000000000000000001.json"]
    assert DeltaTable.open(t.storage).snapshot().num_records() == 4
