"""OPTIMIZE (feedlog/delta/optimize.py): the plan without a disk, then real tables, outside readers,
concurrent writers, a commit owner, an object store, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta.actions import Add, CommitInfo, Remove, decode_commit
from feedlog.delta.managed import Binding
from feedlog.delta.optimize import (
    AUTO_COMPACT,
    AUTO_COMPACT_MIN_FILES,
    DEFAULT_AUTO_TARGET,
    DEFAULT_TARGET_SIZE,
    TARGET_FILE_SIZE,
    AutoCompact,
    CompactionConflict,
    auto_compact_rule,
    needs_compaction,
    operation_metrics,
    order_key,
    parse_size,
    plan,
    target_size,
    tiered,
)
from feedlog.errors import InvalidArgument

from .conftest import SCHEMA, T0, counter_ids, deltalake_read, duckdb_read, rows, sorted_rows
from .s3 import S3Server, s3_server_fixture  # noqa: F401 (the fixture)

FEED_SCHEMA = pa.schema([("feed", pa.string()), ("seq", pa.int64()), ("value", pa.string()), ("p", pa.string())])
MiB = 1 << 20


def add(
    path: str,
    size: int,
    *,
    feed: str | None = None,
    seq: int | None = None,
    part: str | None = None,
    dv: bool = False,
    written: int = 0,
) -> Add:
    mins: dict[str, Any] = {}
    if feed is not None:
        mins["feed"] = feed
    if seq is not None:
        mins["seq"] = seq
    stats = json.dumps({"numRecords": 1, "minValues": mins, "maxValues": mins, "nullCount": {}})
    extra = {"deletionVector": {"storageType": "i", "pathOrInlineDv": "x", "sizeInBytes": 1, "cardinality": 1}}
    return Add(path, {} if part is None else {"p": part}, size, written, True, stats, None, extra if dv else {})


def paths(bins: Any) -> list[list[str]]:
    return [[a.path for a in b.files] for b in bins]


# --- the plan, without a disk ----------------------------------------------------------------------


def test_bins_fill_up_to_the_target_in_order_and_single_file_bins_are_dropped() -> None:
    files = [add(f"f{i}", 30) for i in range(7)]
    assert paths(plan(files, 100)) == [["f0", "f1", "f2"], ["f3", "f4", "f5"]]  # f6 alone: left as it is
    assert paths(plan(files, 1000)) == [[f"f{i}" for i in range(7)]]
    assert plan(files, 59) == []  # one file per bin: nothing would change


def test_files_go_in_feed_seq_order_whatever_order_they_come_in() -> None:
    files = [
        add("late", 10, feed="a", seq=200, written=1),
        add("other-feed", 10, feed="b", seq=0, written=2),
        add("first", 10, feed="a", seq=0, written=3),
        add("middle", 10, feed="a", seq=100, written=4),
    ]
    assert paths(plan(list(reversed(files)), 1000)) == [["first", "middle", "late", "other-feed"]]
    assert paths(plan(files, 25)) == [["first", "middle"], ["late", "other-feed"]]
    # a table without feed and seq columns: the order the files were written in
    plain = [add("b", 1, written=2), add("c", 1, written=3), add("a", 1, written=1)]
    assert paths(plan(plain, 10)) == [["a", "b", "c"]]
    assert order_key(add("x", 1, written=5)) == ("", -1, 5, "x")


def test_a_file_too_big_to_compact_ends_a_run_rather_than_being_jumped() -> None:
    """Jumping it would give the new file a seq range that overlaps the big file's."""
    files = [
        add("s0", 10, feed="a", seq=0),
        add("s1", 10, feed="a", seq=10),
        add("big", 100, feed="a", seq=20),
        add("s2", 10, feed="a", seq=30),
        add("s3", 10, feed="a", seq=40),
    ]
    assert paths(plan(files, 100)) == [["s0", "s1"], ["s2", "s3"]]
    assert paths(plan(files, 1000)) == [["s0", "s1", "big", "s2", "s3"]]


def test_bins_are_per_partition() -> None:
    files = [add(f"a{i}", 10, part="a") for i in range(3)] + [add(f"b{i}", 10, part="b") for i in range(2)]
    files += [add("n0", 10), add("n1", 10)]  # unpartitioned files are a partition of their own
    bins = plan(files, 100)
    assert {b.partition: [a.path for a in b.files] for b in bins} == {
        (("p", "a"),): ["a0", "a1", "a2"],
        (("p", "b"),): ["b0", "b1"],
        (): ["n0", "n1"],
    }


def test_a_file_with_a_deletion_vector_is_rewritten_even_alone_or_big() -> None:
    """Rewriting it purges the rows its deletion vector deletes (delta-spark's OPTIMIZE does)."""
    assert paths(plan([add("d", 500, dv=True)], 100)) == [["d"]]
    assert paths(plan([add("d", 50, dv=True), add("x", 500)], 100)) == [["d"]]


def test_the_auto_threshold_counts_small_files_per_partition() -> None:
    rule = AutoCompact(max_file_size=100, min_file_size=50, min_num_files=3)
    small = [add(f"s{i}", 10, part="a") for i in range(2)] + [add("big", 60, part="a")]
    assert not needs_compaction(small, rule)  # two small files; the 60-byte one is not small
    assert plan(small, 100, small_below=50, min_num_files=3) == []
    more = [*small, add("s2", 10, part="a"), add("other", 10, part="b"), add("other2", 10, part="b")]
    assert needs_compaction(more, rule)
    # the partition that qualifies only; its small files only (the big one ends a run)
    assert paths(plan(more, 100, small_below=50, min_num_files=3)) == [["s0", "s1", "s2"]]


def test_auto_compaction_merges_the_newest_files_into_no_bigger_ones() -> None:
    """A stream's run, oldest first: a merged file joins the new small files only if it is no bigger than
    they are together (a binary counter), so old rows are not rewritten every 50 commits."""
    new = [add(f"n{i}", 10, feed="f", seq=100 + i) for i in range(50)]  # 500 bytes of new files
    equal = add("m500", 500, feed="f", seq=0)
    bigger = add("m1000", 1000, feed="f", seq=0)
    for old, joins in ((equal, True), (bigger, False)):
        bins = tiered(plan([old, *new], 10_000, small_below=5_000, min_num_files=50), 10_000)
        assert paths(bins) == [([old.path] if joins else []) + [a.path for a in new]]
    # sizes of new files vary with load: none is left out for being a little bigger than another
    uneven = [add(f"u{i}", 10 + (i % 3) * 7, feed="f", seq=i) for i in range(50)]
    assert paths(tiered(plan(uneven, 10_000, small_below=5_000, min_num_files=50), 10_000)) == [
        [a.path for a in uneven]
    ]


def test_the_choice_does_not_hang_on_where_a_big_file_sorts() -> None:
    """A soak's table stopped compacting for good: files sort by their smallest (feed, seq), so with
    several feeds a merged file can sort after most new files and before the last one; a choice that
    walked back from the last file stopped at it, chose one file, and compacted nothing ever after."""
    new = [add(f"a{i}", 10, feed="a", seq=i) for i in range(60)]
    merged = add("b-merged", 500, feed="b", seq=0)
    last = add("c0", 10, feed="c", seq=0)
    bins = tiered(plan([*new, merged, last], 10_000, small_below=5_000, min_num_files=50), 10_000)
    chosen = {a.path for b in bins for a in b.files}
    assert chosen == {a.path for a in [*new, merged, last]}  # 500 <= the 610 bytes of new files


@pytest.mark.parametrize("feeds", [1, 8])
def test_a_long_stream_rewrites_each_row_about_log_n_times_and_keeps_few_files(feeds: int) -> None:
    """10,000 commits of one 1 KiB file each under the default rule: the live files stay near the
    threshold and the bytes rewritten grow as n log n, not n squared (every 50 commits rewriting the
    whole merged file, as bin-packing every small file would, writes ~100x more here). With 8 feeds
    a commit's file starts at whichever feed had entries in it (its smallest (feed, seq)), so the
    (feed, seq) order interleaves old and new files: the choice must not depend on that order (a
    soak stopped compacting for good when it did)."""
    rule = AutoCompact(max_file_size=128 * MiB, min_file_size=64 * MiB, min_num_files=50)
    live: list[Add] = []
    rewritten = most = 0
    for i in range(10_000):
        live.append(add(f"c{i}", 1024, feed=f"f{(i * 7919) % feeds}", seq=i * 10))
        if needs_compaction(live, rule):
            bins = tiered(
                plan(live, rule.max_file_size, small_below=rule.min_file_size, min_num_files=50), rule.max_file_size
            )
            assert bins, "over the threshold, nothing chosen: it would never compact again"
            for b in bins:
                gone = {a.path for a in b.files}
                live = [a for a in live if a.path not in gone]
                live.append(add(f"m{i}", b.size, feed=order_key(b.files[0])[0], seq=order_key(b.files[0])[1]))
                rewritten += b.size
        most = max(most, len(live))
    written = 10_000 * 1024
    assert most <= 60, most  # the threshold's 50 new files plus log2(10,000 / 50) ~ 8 merged ones
    assert rewritten <= 10 * written, rewritten / written  # ~log2(200) rewrites a row, not ~100


def test_sizes_and_settings() -> None:
    assert parse_size("128MiB") == parse_size("128mb") == parse_size("128m") == 128 * MiB
    assert parse_size("1GB") == 1 << 30 and parse_size(" 1048576 ") == MiB and parse_size("2k") == 2048
    for bad in ("", "1.5GB", "-1", "0", "12XB", "MiB"):
        with pytest.raises(InvalidArgument, match="bad size"):
            parse_size(bad)
    assert target_size({}) == DEFAULT_TARGET_SIZE == 100 * MiB
    assert target_size({TARGET_FILE_SIZE: "104857600"}) == 100 * MiB
    assert target_size({TARGET_FILE_SIZE: "32mb"}, 7) == 7  # given beats the property
    with pytest.raises(InvalidArgument, match=TARGET_FILE_SIZE):
        target_size({TARGET_FILE_SIZE: "lots"})
    assert auto_compact_rule({}) is None and auto_compact_rule({AUTO_COMPACT: "false"}) is None
    assert auto_compact_rule({AUTO_COMPACT: "true"}) == AutoCompact(DEFAULT_AUTO_TARGET, DEFAULT_AUTO_TARGET // 2, 50)
    assert auto_compact_rule({AUTO_COMPACT: "auto", TARGET_FILE_SIZE: "10m", AUTO_COMPACT_MIN_FILES: "4"}) == (
        AutoCompact(10 * MiB, 5 * MiB, 4)
    )
    assert auto_compact_rule({AUTO_COMPACT: "true", AUTO_COMPACT_MIN_FILES: "4"}, 9).min_num_files == 9  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument):
        auto_compact_rule({AUTO_COMPACT: "true", AUTO_COMPACT_MIN_FILES: "x"})


def test_operation_metrics_are_delta_sparks_names_as_strings() -> None:
    removed = [add(f"r{i}", 10 * (i + 1)) for i in range(4)]
    added = [add(f"a{i}", s) for i, s in enumerate([400, 100, 300, 200])]
    m = operation_metrics(removed, added)
    assert m == {
        "numRemovedFiles": "4",
        "numRemovedBytes": "100",
        "numAddedFiles": "4",
        "numAddedBytes": "1000",
        "minFileSize": "100",
        "p25FileSize": "100",
        "p50FileSize": "200",
        "p75FileSize": "300",
        "maxFileSize": "400",
        "numDeletionVectorsRemoved": "0",
    }


# --- real tables -----------------------------------------------------------------------------------


def feed_rows(feed: str, start: int, n: int, part: str = "x") -> pa.Table:
    seqs = list(range(start, start + n))
    return pa.table(
        {"feed": [feed] * n, "seq": seqs, "value": [f"{feed}{s}" for s in seqs], "p": [part] * n}, FEED_SCHEMA
    )


def small_appends(t: DeltaTable, commits: int, per: int = 5) -> None:
    """`commits` commits of two feeds' next `per` rows each, the feeds interleaved in each file."""
    for i in range(commits):
        t.append(pa.concat_tables([feed_rows("b", i * per, per), feed_rows("a", i * per, per)]))


def commit_actions(root: Path, version: int) -> list[Any]:
    return decode_commit((root / "_delta_log" / f"{version:020d}.json").read_bytes(), version)


def test_optimize_compacts_carries_stats_and_commits_no_data_change(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "t"
    t = DeltaTable.create(root, FEED_SCHEMA, clock=clock, new_id=counter_ids())
    small_appends(t, 12)
    before = t.to_arrow()
    v_before = t.version()
    clock.advance(1000)
    r = t.optimize()
    assert (r.version, r.files_before, r.files_after, r.files_removed, r.files_added) == (13, 12, 1, 12, 1)
    assert r.target_size == DEFAULT_TARGET_SIZE and not r.auto and r.partitions_optimized == 1
    actions = commit_actions(root, 13)
    info = next(a for a in actions if isinstance(a, CommitInfo))
    assert info.operation == "OPTIMIZE"
    assert info.operation_parameters == {
        "predicate": "[]",
        "zOrderBy": "[]",
        "clusterBy": "[]",
        "auto": False,
        "targetSize": str(DEFAULT_TARGET_SIZE),
    }
    assert info.extra["readVersion"] == 12 and info.extra["isBlindAppend"] is False
    metrics = info.extra["operationMetrics"]
    assert metrics["numRemovedFiles"] == "12" and metrics["numAddedFiles"] == "1"
    assert int(metrics["numAddedBytes"]) == r.bytes_added == (root / next(iter(live(t)))).stat().st_size
    assert all(isinstance(v, str) for v in metrics.values())
    removes = [a for a in actions if isinstance(a, Remove)]
    adds = [a for a in actions if isinstance(a, Add)]
    assert len(removes) == 12 and len(adds) == 1
    assert not any(a.data_change for a in removes) and not adds[0].data_change
    # the stats: every row, and seq bounds as tight as the rows
    stats = json.loads(adds[0].stats or "{}")
    assert stats["numRecords"] == 120
    assert (stats["minValues"]["seq"], stats["maxValues"]["seq"]) == (0, 59)
    assert (stats["minValues"]["feed"], stats["maxValues"]["feed"]) == ("a", "b")
    # the same rows, now in (feed, seq) order in the one file
    after = t.to_arrow()
    assert sorted_rows(after, "feed", "seq", "value") == sorted_rows(before, "feed", "seq", "value")
    pairs = list(zip(after.column("feed").to_pylist(), after.column("seq").to_pylist(), strict=True))
    assert pairs == sorted(pairs)
    # time travel to before OPTIMIZE reads the old files, the same rows
    assert sorted_rows(t.to_arrow(v_before), "feed", "seq") == sorted_rows(after, "feed", "seq")
    assert t.optimize().version is None  # nothing left to compact: no commit
    assert t.version() == 13


def live(t: DeltaTable) -> set[str]:
    return {a.path for a in t.snapshot().files()}


def test_delta_rs_and_duckdb_read_the_optimized_table_row_for_row(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = DeltaTable.create(root, FEED_SCHEMA, partition_by=["p"])
    for i in range(6):
        t.append(pa.concat_tables([feed_rows("a", i * 3, 3, "x"), feed_rows("a", 100 + i * 3, 3, "y")]))
    old = t.version()
    r = t.optimize()
    assert r.partitions_optimized == 2 and r.files_before == 12 and r.files_after == 2
    cols = ("feed", "seq", "value", "p")
    ours = sorted_rows(t.to_arrow(), *cols)
    assert len(ours) == 36
    assert sorted_rows(deltalake_read(root), *cols) == ours
    assert sorted_rows(duckdb_read(root), *cols) == ours
    assert sorted_rows(deltalake_read(root, old), *cols) == ours == sorted_rows(duckdb_read(root, old), *cols)
    import deltalake

    # delta-rs sees the commit as ours: an OPTIMIZE with its metrics
    last = deltalake.DeltaTable(str(root)).history(1)[0]
    assert last["operation"] == "OPTIMIZE" and last["operationMetrics"]["numAddedFiles"] == "2"


def test_a_target_size_splits_the_bins(tmp_path: Path) -> None:
    t = DeltaTable.create(tmp_path / "t", FEED_SCHEMA)
    small_appends(t, 8)
    size = max(a.size for a in t.snapshot().files())
    r = t.optimize(target_size=2 * size)
    assert r.files_removed == 8 and r.files_added == 4 and r.target_size == 2 * size
    t.set_properties({TARGET_FILE_SIZE: "1"})  # the table's own setting: every file is big enough already
    assert t.optimize().version is None


def test_a_column_mapped_table_compacts_by_physical_names(tmp_path: Path) -> None:
    import deltalake

    root = tmp_path / "t"
    deltalake.write_deltalake(
        str(root), rows(0, 2).cast(SCHEMA), configuration={"delta.columnMapping.mode": "name"}, partition_by=["p"]
    )
    for i in range(1, 4):
        deltalake.write_deltalake(str(root), rows(i * 2, 2).cast(SCHEMA), mode="append")
    t = DeltaTable.open(root)
    want = sorted_rows(t.to_arrow(), "seq", "key", "p")
    assert t.optimize().files_removed == 4
    assert sorted_rows(t.to_arrow(), "seq", "key", "p") == want == sorted_rows(deltalake_read(root), "seq", "key", "p")


# --- concurrent writers ----------------------------------------------------------------------------


class _BeforeNextCommit(LocalStorage):
    """The real local storage, running `pending` (another writer's commit) just before the next
    commit file is written: a writer that commits while OPTIMIZE rewrites."""

    pending: Callable[[], object] | None = None

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if self.pending is not None and path.startswith("_delta_log/") and path.endswith(".json"):
            pending, self.pending = self.pending, None
            pending()
        return super().put_if_absent(path, data)


def _data_files(root: Path) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), root)
        for d, _dirs, files in os.walk(root)
        if "_delta_log" not in d
        for f in files
    }


def test_a_blind_append_meanwhile_is_rebased_over(tmp_path: Path) -> None:
    root = tmp_path / "t"
    DeltaTable.create(root, FEED_SCHEMA)
    storage = _BeforeNextCommit(root)
    t = DeltaTable.open(storage)
    small_appends(t, 5)
    other = DeltaTable.open(root)
    storage.pending = lambda: other.append(feed_rows("c", 0, 4))
    r = t.optimize()
    assert r.version == 7  # the append took 6
    assert r.files_after == 2 == len(t.snapshot().files())  # the compacted file and the append's
    assert sorted(t.to_arrow().column("feed").to_pylist()).count("c") == 4


def _rewrite_first(table: DeltaTable, operation: str) -> Callable[[], None]:
    """A concurrent rewrite (TTL compaction's or a forget's shape): one live file removed, its rows
    written again as a new file."""

    def run() -> None:
        tx = table.transaction(operation)
        victim = sorted(tx.base.files.values(), key=order_key)[0]
        rewritten = table.write_files(feed_rows("a", 0, 1))
        tx.remove_files([victim])
        tx.add_files(rewritten)
        table.commit(tx)

    return run


@pytest.mark.parametrize("operation", ["TTL COMPACTION", "FORGET", "OPTIMIZE"])
def test_a_concurrent_rewrite_of_a_compacted_file_makes_it_give_up_cleanly(tmp_path: Path, operation: str) -> None:
    root = tmp_path / "t"
    DeltaTable.create(root, FEED_SCHEMA)
    storage = _BeforeNextCommit(root)
    t = DeltaTable.open(storage)
    small_appends(t, 5)
    storage.pending = _rewrite_first(DeltaTable.open(root), operation)
    with pytest.raises(CompactionConflict, match="removed") as e:
        t.optimize()
    assert e.value.retryable
    after = DeltaTable.open(root)
    assert after.version() == 6 and after.history(1)[0].operation == operation
    assert _data_files(root) - {"_delta_log"} == live(after) | _removed(after)  # no stray file left
    again = t.optimize()  # planned afresh: every file is live now
    assert again.version == 7 and again.files_after == 1


def _removed(t: DeltaTable) -> set[str]:
    out = set()
    for v in range(t.version() + 1):
        out |= {a.path for a in t.snapshot(v).files()}
    return out - live(t)


def test_a_concurrent_rewrite_of_other_files_is_rebased_over(tmp_path: Path) -> None:
    """Delta's rule: OPTIMIZE retries when every file it compacted is still live."""
    root = tmp_path / "t"
    t0 = DeltaTable.create(root, FEED_SCHEMA)
    t0.append(feed_rows("z", 0, 1000))  # big: not compacted (target below)
    storage = _BeforeNextCommit(root)
    t = DeltaTable.open(storage)
    small_appends(t, 4)
    big = max(t.snapshot().files(), key=lambda a: a.size)

    def rewrite_big() -> None:
        other = DeltaTable.open(root)
        tx = other.transaction("TTL COMPACTION")
        tx.remove_files([big])
        tx.add_files(other.write_files(feed_rows("z", 0, 1000)))
        other.commit(tx)

    storage.pending = rewrite_big
    r = t.optimize(target_size=big.size - 1)
    assert r.version == 7 and r.files_removed == 4
    assert len(t.snapshot().files()) == 2 and t.to_arrow().num_rows == 1040


def test_the_optimize_that_wins_makes_a_later_rewrite_of_its_files_conflict(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = DeltaTable.create(root, FEED_SCHEMA)
    small_appends(t, 3)
    slow = DeltaTable.open(root)
    tx = slow.transaction("TTL COMPACTION")  # chose its files before OPTIMIZE committed
    victim = next(iter(tx.base.files.values()))
    t.optimize()
    tx.remove_files([victim])
    tx.add_files(slow.write_files(feed_rows("a", 0, 1)))
    with pytest.raises(Exception, match="concurrently removed"):
        slow.commit(tx)


# --- a commit owner, an object store ----------------------------------------------------------------


def test_through_a_commit_owner(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "t"
    binding = Binding.parse(str(tmp_path / "owner.db"), 10)  # backfills every 10 commits: the owner holds them
    t = DeltaTable.create(root, FEED_SCHEMA, owner=binding, owner_token="tok", clock=clock)
    small_appends(t, 4)
    r = t.optimize()
    assert r.version == 5 and r.files_after == 1
    assert not (root / "_delta_log" / f"{5:020d}.json").exists()  # ratified by the owner, not backfilled
    assert t.history(1)[0].operation == "OPTIMIZE"
    assert DeltaTable.open(root, owner=binding).to_arrow().num_rows == 40
    t.backfill()
    assert sorted_rows(deltalake_read(root), "feed", "seq") == sorted_rows(t.to_arrow(), "feed", "seq")


@pytest.mark.slow
def test_on_an_object_store(s3_server: S3Server) -> None:
    from .test_objectstore import assert_readers_agree

    url = s3_server.url()  # (the system clock: the readers below time-travel with it)
    t = DeltaTable.create(url, SCHEMA, partition_by=["p"], storage_options=s3_server.options)
    for i in range(5):
        t.append(rows(i * 2, 2, "a"))
    r = t.optimize()
    assert r.version == 6 and r.files_after == 1
    prefix = url.split("/", 3)[3] + "/"
    keys = {k[len(prefix) :] for k in s3_server.keys(prefix) if not k[len(prefix) :].startswith("_delta_log")}
    assert len(keys) == 6  # five old files (vacuum's, later) and the new one
    assert assert_readers_agree(s3_server, url) == 6


# --- the CLI ------------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "feedlog", "table", "optimize", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_optimize_human_and_json(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = DeltaTable.create(root, FEED_SCHEMA, clock=ManualClock(T0))
    small_appends(t, 6)
    size = max(a.size for a in t.snapshot().files())
    p = cli(str(root), "--target-size", str(3 * size))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("compacted 6 files (") and "into 2 files" in p.stdout
    assert "6 -> 2 live files (version 7" in p.stdout, p.stdout
    p = cli(str(root), "--json")
    doc = json.loads(p.stdout)
    assert (doc["version"], doc["files_before"], doc["files_after"], doc["target_size"]) == (8, 2, 1, 100 * MiB)
    assert doc["metrics"]["numRemovedFiles"] == "2" and doc["seconds"] >= 0
    p = cli(str(root))
    assert p.returncode == 0 and p.stdout.startswith("nothing to compact: 1 live file"), p.stdout


def test_cli_bad_input_is_one_line_with_its_exit_code(tmp_path: Path) -> None:
    root = tmp_path / "t"
    small_appends(DeltaTable.create(root, FEED_SCHEMA), 3)
    before = sorted(os.listdir(root / "_delta_log"))
    for args, code in (
        ([str(root), "--target-size", "12XB"], 2),
        ([str(root), "--target-size", "0"], 2),
        ([str(root), "--target-size", "-5MiB"], 2),
        ([str(tmp_path / "missing")], 3),
    ):
        p = cli(*args)
        assert p.returncode == code, (args, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert sorted(os.listdir(root / "_delta_log")) == before
