"""Auto-compaction in the lake: after every sink commit (so ingest and any stream), in `maintain`'s
pass, against TTL compaction running meanwhile, and never re-delivered to a stream of the table."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta.optimize import AUTO_COMPACT, AUTO_COMPACT_MIN_FILES, TARGET_FILE_SIZE, CompactionConflict
from feedlog.lake.audit import audit_table
from feedlog.lake.delta_source import DeltaStreamReader, FilesPartition
from feedlog.lake.expire import expire
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.maintain import maintain
from feedlog.lake.sink import DeltaSink, table_token, trusted

from .conftest import KEY_A, append, make_feed

HOUR = 3_600_000


def quiet(_m: str) -> None:
    pass


def opened(table: Path, storage: LocalStorage | None = None) -> DeltaTable:
    """The ingested table as feedlog's jobs open it: its embedded owner trusted, its token presented."""
    return DeltaTable.open(storage or table, owner_token=table_token(str(table), None), owner=trusted(str(table), None))


def ingest_rounds(tmp_path: Path, rounds: int, *, per: int = 5, ttl: int | None = None) -> tuple[Path, list[int]]:
    """A feed and a table ingested from it `rounds` times, `per` new entries a time (one small file
    per commit, as a stream makes them); the table's live files after each round."""
    feed = make_feed(tmp_path / "feed", per)
    table = tmp_path / "table"
    spec = [str(tmp_path / "feed")]
    ingest_batch(None, spec, str(table), progress=quiet)
    opened(table).set_properties({AUTO_COMPACT_MIN_FILES: "5"})
    live = []
    for _ in range(rounds):
        append(feed, per, ttl=ttl)
        ingest_batch(None, spec, str(table), progress=quiet)
        live.append(len(opened(table).snapshot().files()))
    feed.close()
    return table, live


def test_tables_ingest_creates_have_auto_compaction_on_and_stay_bounded(tmp_path: Path) -> None:
    table, live = ingest_rounds(tmp_path, 24)
    t = opened(table)
    assert t.snapshot().properties[AUTO_COMPACT] == "true"
    assert max(live) <= 5 and live[-1] < 5, live  # 25 commits of one file each, never more than 5 live
    ops = [h.operation for h in t.history()]
    assert ops.count("OPTIMIZE") >= 4
    auto = next(h for h in t.history() if h.operation == "OPTIMIZE")
    assert auto.operation_parameters["auto"] is True
    assert sorted(t.to_arrow().column("seq").to_pylist()) == list(range(1, 126))  # (a feed's entries start at seq 1)
    assert audit_table(str(table), [KEY_A.public_key]).ok


def test_auto_compaction_is_honoured_off(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 5)
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    opened(table).set_properties({AUTO_COMPACT: "false", AUTO_COMPACT_MIN_FILES: "2"})
    for _ in range(4):
        append(feed, 5)
        ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    feed.close()
    t = opened(table)
    assert len(t.snapshot().files()) == 5 and "OPTIMIZE" not in [h.operation for h in t.history()]
    assert maintain(str(table), engine="local").compacted_version is None


def test_a_failing_auto_compaction_is_a_warning_and_the_commit_stands(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 5)
    table = tmp_path / "table"
    spec = [str(tmp_path / "feed")]
    ingest_batch(None, spec, str(table), progress=quiet)
    # a property auto-compaction cannot read: every attempt fails
    opened(table).set_properties({AUTO_COMPACT_MIN_FILES: "2", TARGET_FILE_SIZE: "lots"})
    append(feed, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = ingest_batch(None, spec, str(table), progress=quiet)
    feed.close()
    assert r.rows == 5 and r.version is not None
    assert any("auto-compaction deferred" in str(w.message) for w in caught)
    assert opened(table).version() == r.version  # landed; nothing after it


def test_maintain_compacts_after_the_rewrites_before_the_checkpoint(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 5)
    table = tmp_path / "table"
    spec = [str(tmp_path / "feed")]
    ingest_batch(None, spec, str(table), progress=quiet)
    t = opened(table)
    t.set_properties({AUTO_COMPACT: "false"})  # the ingest's hook off: maintain's step does it
    for _ in range(6):
        append(feed, 5, ttl=60_000)
        ingest_batch(None, spec, str(table), progress=quiet)
    feed.close()
    t.set_properties({AUTO_COMPACT: "true", AUTO_COMPACT_MIN_FILES: "4"})
    clock = ManualClock(SystemClock().now_ms() + 2 * HOUR)
    r = maintain(str(table), clock=clock, engine="local")
    assert r.rows_expired == 30 and r.expired_version is not None
    assert r.compacted_version == r.expired_version + 1 and r.files_compacted == 7 and r.files_written == 1
    assert r.checkpoint == r.compacted_version  # the checkpoint lists the one file
    after = opened(table)
    assert len(after.snapshot().files()) == 1 and after.to_arrow().num_rows == 35
    assert audit_table(str(table), [KEY_A.public_key]).ok
    again = maintain(str(table), clock=clock, engine="local")
    assert again.compacted_version is None


class _Before(LocalStorage):
    """Runs `pending` (another job's commit) just before the next commit file is written."""

    pending: Callable[[], object] | None = None

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if self.pending is not None and path.startswith("_delta_log/") and path.endswith(".json"):
            pending, self.pending = self.pending, None
            pending()
        return super().put_if_absent(path, data)


def test_ttl_compaction_meanwhile_makes_optimize_give_up_then_it_succeeds(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 5)
    table = tmp_path / "table"
    spec = [str(tmp_path / "feed")]
    ingest_batch(None, spec, str(table), progress=quiet)
    opened(table).set_properties({AUTO_COMPACT: "false"})
    for _ in range(4):
        append(feed, 5, ttl=60_000)
        ingest_batch(None, spec, str(table), progress=quiet)
    feed.close()
    storage = _Before(table)
    t = opened(table, storage)
    later = SystemClock().now_ms() + 2 * HOUR
    storage.pending = lambda: expire(None, str(table), now_ms=later, engine="local")
    with pytest.raises(CompactionConflict):
        t.optimize()
    assert opened(table).history(1)[0].operation == "TTL COMPACTION"
    r = t.optimize()  # planned again on the rewritten files: they are all live
    assert r.version is not None and r.files_after == 1
    rows = opened(table).to_arrow()
    assert rows.num_rows == 25 and sum(rows.column("cleared").to_pylist()) == 20
    assert audit_table(str(table), [KEY_A.public_key]).ok


def test_a_stream_of_the_table_does_not_see_optimize_again(tmp_path: Path) -> None:
    """readStream.format("feedlog-delta"): an OPTIMIZE commit (dataChange=false) delivers no rows; the
    reader (here in this process, as Spark's driver and tasks call it) moves past it to the next append."""
    table, _ = ingest_rounds(tmp_path / "a", 0)
    t = opened(table)
    t.set_properties({AUTO_COMPACT: "false"})
    reader = DeltaSink(CaseInsensitiveDict({"path": str(table)})).streamReader(StructType())
    assert isinstance(reader, DeltaStreamReader)

    def read(start: dict[str, Any], end: dict[str, Any]) -> list[int]:
        seqs: list[int] = []
        for part in reader.partitions(start, end):
            assert isinstance(part, FilesPartition)
            for batch in reader.read(part):
                seqs += pa.Table.from_batches([batch]).column("seq").to_pylist()
        return sorted(seqs)

    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert read(start, end) == list(range(1, 6))
    for i in range(3):
        t.append(_more(t, 100 + i))
    start, end = end, reader.latestOffset(end, ReadAllAvailable())
    assert read(start, end) == [100, 101, 102]
    r = t.optimize()
    assert r.version is not None and r.files_removed == 4
    start, end = end, reader.latestOffset(end, ReadAllAvailable())
    assert read(start, end) == []  # the compacted rows are not delivered again
    t.append(_more(t, 200))
    start, end = end, reader.latestOffset(end, ReadAllAvailable())
    assert read(start, end) == [200]


def _more(t: DeltaTable, seq: int) -> pa.Table:
    """One row like the table's first, at `seq`."""
    row = t.to_arrow().slice(0, 1)
    return row.set_column(row.schema.get_field_index("seq"), "seq", pa.array([seq], pa.int64()))
