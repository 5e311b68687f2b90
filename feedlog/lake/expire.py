"""TTL compaction of a feedlog table, as a Spark job or in process (SlateDB's compaction filter, for a signed log).

Files whose stats say they may hold rows past `expires_at` are rewritten on
executors (or, when they are few, by threads of this process: `engine`):
each expired row becomes a tombstone that keeps `feed`, `seq`,
`key`, `deleted`, `timestamp`, `expires_at` and `size`, gains `leaf_hash`
(the Merkle leaf of the block it drops) and `cleared = true`, and loses
`value`, `block` and `stat`. The driver commits `remove` + `add` through the
table's commit owner, so `feedlog audit` still verifies every feed: a cleared
row's leaf stands in for its block, as a cleared block does in a feed.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..clock import Clock, SystemClock
from ..delta import DeltaTable, Snapshot
from ..delta.actions import Add
from ..delta.objectstore import open_storage
from ..delta.scan import ScanContext, read_file
from ..delta.writer import WriteOptions
from ..errors import Conflict, FeedlogError, InvalidArgument, Unsupported
from .rows import COLUMNS, TIMESTAMP
from .sink import settle, table_token, trusted
from .spark_errors import marked, spark_job
from .tombstones import write_tombstoned

#: `engine="auto"` rewrites the files in this process, without Spark, when those that may hold expired rows
#: total at most this many bytes (Spark's start, 10-15 s on 2 cores, costs more than rewriting them here)
LOCAL_MAX_BYTES = 256 << 20
ENGINES = ("auto", "spark", "local")


@dataclass
class ExpireResult:
    version: int | None
    files_rewritten: int
    rows_cleared: int
    #: where the files were rewritten: "spark", "local", or None when no file may hold an expired row
    engine: str | None = None


def _may_expire(add: Add, now_ms: int) -> bool:
    if not add.stats:
        return True
    try:
        stats = json.loads(add.stats)
        lo = stats.get("minValues", {}).get("expires_at")
        if stats.get("nullCount", {}).get("expires_at") == stats.get("numRecords"):
            return False
    except (ValueError, AttributeError):
        return True
    if lo is None:
        return True
    when = datetime.strptime(lo, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return when.timestamp() * 1000 <= now_ms  # stats are cut to ms: a tie may hold an expired row


@dataclass(frozen=True)
class _Job:
    path: str
    storage_options: dict[str, str] | None
    schema: pa.Schema
    options: WriteOptions
    now_ms: int
    #: the rewritten files' `add.modificationTime`: read once on the driver, whose clock is the
    #: injected one (a clock need not survive pickling to an executor)
    written_ms: int


def _rewrite_file(job: _Job, add_json: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    """(old add, new add or None, rows cleared) for one file."""
    storage = open_storage(job.path, job.storage_options)
    # as a reader sees the file: logical column names (column mapping), deletion vectors applied
    data = read_file(ScanContext(storage, job.schema, (), job.options.column_mapping), Add.from_json(add_json))
    now = pa.scalar(job.now_ms * 1000, TIMESTAMP)
    expired = pc.and_(pc.fill_null(pc.less(data.column("expires_at"), now), False), pc.invert(data.column("cleared")))
    n = pc.sum(expired.cast(pa.int64())).as_py() or 0
    if n == 0:
        return add_json, None, 0
    new = write_tombstoned(storage, data, expired, job.schema, job.options, job.written_ms, "expire.rewrite")
    return add_json, new.to_json(), n


#: what executors run: a feedlog error reaches the driver as itself
_rewrite = marked()(_rewrite_file)


def _rewrite_here(
    job: _Job, candidates: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any] | None, int]]:
    """Every candidate rewritten by threads of this process (pyarrow reads and writes without the GIL).
    If one fails, the files the others wrote are removed (no commit will hold them) and its error raised."""
    with ThreadPoolExecutor(max(1, min(len(candidates), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(_rewrite_file, job, a) for a in candidates]
    failed = next((e for f in futures if (e := f.exception()) is not None), None)
    if failed is None:
        return [f.result() for f in futures]
    storage = open_storage(job.path, job.storage_options)
    for f in futures:
        if f.exception() is None and (new := f.result()[1]) is not None:
            with contextlib.suppress(OSError, FeedlogError):
                storage.delete(urllib.parse.unquote(new["path"]))
    raise failed


def expire(
    spark: Any | Callable[[], Any] | None,
    path: str,
    *,
    now_ms: int | None = None,
    token: str | None = None,
    owner: str | None = None,
    clock: Clock | None = None,
    storage_options: Mapping[str, str] | None = None,
    engine: str = "auto",
) -> ExpireResult:
    """Clear the payloads of rows expired at `now_ms` (default: now); one commit, or none if nothing expired.

    `spark`: a SparkSession, or a function that gives one, called only if the files are rewritten
    with Spark (what the files' stats say is read without Spark); None: never.
    `engine`: "spark" rewrites the files on Spark's executors, "local" in this process, "auto" (the
    default) in this process when the files that may hold expired rows total at most
    `LOCAL_MAX_BYTES` or `spark` is None, else on Spark. Either way one commit lands the result.

    `owner`: the commit owner to trust (default: the table's embedded one and $FEEDLOG_OWNER).
    `clock` (default: the system clock) tells now, the rewritten files' time and the commit's.
    `storage_options`: the table's object-store options, which the executors get too."""
    if engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "spark" and spark is None:
        raise InvalidArgument('engine "spark" needs a Spark session')
    clock = clock or SystemClock()
    table = DeltaTable.open(
        path,
        owner_token=table_token(path, token),
        owner=trusted(path, owner),
        clock=clock,
        storage_options=storage_options,
    )
    # the transaction starts from the snapshot the files are chosen in: a concurrent compaction that
    # removes one of them makes this commit conflict instead of removing it twice
    tx = table.transaction("TTL COMPACTION")
    snap = Snapshot(table.storage, tx.base)
    if [c for c in COLUMNS if c not in snap.schema.names]:
        raise InvalidArgument(f"{path} is not a feedlog table (feedlog ingest makes those)")
    if snap.partition_columns:
        raise Unsupported("TTL compaction of partitioned tables is not implemented")
    now = clock.now_ms() if now_ms is None else now_ms
    files = [a for a in snap.files() if _may_expire(a, now)]
    if not files:
        return ExpireResult(None, 0, 0)
    candidates = [a.to_json() for a in files]
    if engine == "auto":
        engine = "local" if spark is None or sum(a.size for a in files) <= LOCAL_MAX_BYTES else "spark"
    options = snap.write_options()
    options_for_executors = dict(storage_options) if storage_options else None
    job = _Job(table.storage.location, options_for_executors, snap.schema, options, now, clock.now_ms())
    if engine == "local":
        results = _rewrite_here(job, candidates)
    else:
        session = spark() if callable(spark) else spark
        assert session is not None  # engine "spark" with spark None was refused above
        with spark_job():
            rdd = session.sparkContext.parallelize(candidates, min(len(candidates), 64))
            results = rdd.map(lambda a: _rewrite(job, a)).collect()
    changed = [(Add.from_json(old), Add.from_json(new), n) for old, new, n in results if new is not None]
    if not changed:
        return ExpireResult(None, 0, 0, engine)
    tx.operation_parameters = {"expiredBefore": str(now)}
    tx.remove_files([old for old, _new, _n in changed])
    tx.add_files([new for _old, new, _n in changed])
    cleared = sum(n for _o, _a, n in changed)
    tx.info_extra["feedlog"] = {"expired_before": now, "rows_cleared": cleared}
    try:
        result = tx.commit()
    except Conflict:  # definitely not committed: the new files are nobody's
        storage = table.storage
        for _old, new, _n in changed:
            storage.delete(urllib.parse.unquote(new.path))
        raise
    if result.version is not None:
        settle(table, result.version)
    return ExpireResult(result.version, len(changed), cleared, engine)
