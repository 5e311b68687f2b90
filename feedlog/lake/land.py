"""Feeds into a Delta table in one Spark job whose rows never leave the Python workers, or in
this process without Spark (`land_here`).

    land(spark, {"feeds": ..., "startingOffsets": ..., "endingOffsets": ...}, "data/table", {"jobId": ...})

does what

    spark.read.format("feedlog").options(**read_options).load()
         .write.format("feedlog-delta").options(**write_options).mode("append").save(table)

does, with the same options, checks and commit, minus the trip through the JVM: there every
row goes from the reader's Python worker into Spark (Arrow to rows) and out again to the
writer's (rows to Arrow), two conversions that cost as much as Spark's whole Parquet write
(issue 17; tools/bench/bench_ingest.py). Here each task reads its seq range, verifies every
block, builds the Arrow batches and writes the Parquet files in one process, and returns only
the files' `add` actions; the driver commits them as the sink's commit does (one txn claim per
feed: exactly once). A task that fails returns its error rather than failing the job (a feedlog
error as it is, any other wrapped in one, its traceback on the worker's stderr), so the driver
still holds the other tasks' files: it deletes them and raises that error, as it does when its
commit fails. A task whose worker dies is Spark's to retry; a job that fails for good that way (a
worker lost more often than Spark retries) leaves the files of the tasks that had finished
unreferenced, as a killed driver does: no reader sees them, and vacuum removes them.

`feedlog ingest` runs its Spark jobs this way (`ingest.ingest_batch`); streaming goes through the
source and the sink.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql.pandas.types import from_arrow_schema

from .. import failpoints
from ..delta.transaction import CommitResult
from ..errors import FeedlogError
from .rows import SCHEMA
from .sink import FilesWritten, SinkConfig
from .source import FeedBatchReader, FeedPartition, SourceFeed, read_partition


def land(
    spark: Any, read_options: Mapping[str, str], table: str, write_options: Mapping[str, str]
) -> CommitResult | None:
    """Read the feeds `read_options` name (the `feedlog` source's options) and append their rows to
    `table` (the `feedlog-delta` sink's options): the commit made, or None if there was nothing new."""
    reader, parts, config = _prepare(read_options, table, write_options)
    if not parts:
        return None
    task = functools.partial(_write_partition, reader.feeds, config)
    results = spark.sparkContext.parallelize(parts, len(parts)).map(task).collect()
    written = [r for r in results if isinstance(r, FilesWritten)]
    failed = [r for r in results if isinstance(r, FeedlogError)]
    if failed:
        config.abort(written)
        raise failed[0]
    try:
        return config.commit(written)
    except BaseException:
        config.abort(written)  # keeps any file a commit (or a staged one the owner may ratify) holds
        raise


def land_here(
    read_options: Mapping[str, str],
    table: str,
    write_options: Mapping[str, str],
    tasks: Callable[[int, int], None] | None = None,
) -> CommitResult | None:
    """`land` without Spark: the same tasks one after another in this process, then the same commit.

    For ranges small enough that starting Spark (10 s and more) costs more than the work itself.
    The checks, files, txn claims and commit are the sink's, so the table cannot tell the two apart
    and a rerun by either picks up where the other stopped. A task or commit that fails removes the
    files no commit holds (as Spark's abort does); a process killed outright before its commit leaves
    its files unreferenced, as a killed Spark driver does: no reader sees them. `tasks`: told
    (done, total) as each task ends."""
    reader, parts, config = _prepare(read_options, table, write_options)
    if not parts:
        return None
    written: list[FilesWritten] = []
    try:
        for part in parts:
            written.append(config.write(read_partition(reader.feeds, part)))
            if tasks is not None:
                tasks(len(written), len(parts))
        return config.commit(written)
    except BaseException:
        config.abort(written)  # keeps any file a commit (or a staged one the owner may ratify) holds
        raise


def _prepare(
    read_options: Mapping[str, str], table: str, write_options: Mapping[str, str]
) -> tuple[FeedBatchReader, list[FeedPartition], SinkConfig]:
    """The reader, its tasks and the sink's checked configuration (the table created if missing)."""
    reader = FeedBatchReader(read_options)
    parts = list(reader.partitions())
    config = SinkConfig.prepare(
        {**write_options, "path": table}, from_arrow_schema(SCHEMA), overwrite=False, streaming=False
    )
    return reader, parts, config


def _write_partition(feeds: list[SourceFeed], config: SinkConfig, part: FeedPartition) -> FilesWritten | FeedlogError:
    """One task: its range read and verified, written as Parquet files (not yet in the table), or
    the error it failed with (its own files removed by `config.write`): the driver removes the
    job's other files before raising it."""
    try:
        failpoints.point("land.task")
        return config.write(read_partition(feeds, part))
    except FeedlogError as e:
        return e
    except Exception as e:  # not foreseen: its traceback goes to the executor's log, its line to the user
        traceback.print_exc(file=sys.stderr)
        feed = feeds[part.index].source
        return FeedlogError(
            f"a task of the job (feed {feed.key_hex[:16]}..., seqs {part.start}..{part.end - 1}) failed: "
            f"{type(e).__name__}: {e}"
        )
