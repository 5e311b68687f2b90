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
feed: exactly once). A task that fails for good answers with its error rather than failing the
job (a feedlog error as it is, any other wrapped in one, its traceback on the worker's stderr), so
the driver still holds the other tasks' files: it deletes them and raises that error, as it does
when its commit fails. An error that may pass (a peer or the store unavailable, one not foreseen)
is first raised for Spark to run the task again, up to its last attempt (`gives_up`). A task whose
worker dies is Spark's to retry; a job that fails for good that way (a worker lost more often
than Spark retries) leaves the files of the tasks that had finished unreferenced, as a killed
driver does: no reader sees them, and vacuum removes them. The other tasks of a job one task
failed still run to their end (their files are then deleted): the driver learns of the failure
only from the results.

`feedlog ingest` runs its Spark jobs this way (`ingest.ingest_batch`); streaming goes through the
source and the sink.
"""

from __future__ import annotations

import functools
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from pyspark import TaskContext
from pyspark.sql.pandas.types import from_arrow_schema

from .. import failpoints
from ..delta.transaction import CommitResult
from ..errors import FeedlogError, Unavailable
from .rows import SCHEMA
from .sink import FilesWritten, SinkConfig, TableRef
from .source import FeedBatchReader, FeedPartition, SourceFeed, read_partition


def land(
    spark: Any,
    read_options: Mapping[str, str],
    table: str,
    write_options: Mapping[str, str],
    *,
    ref: TableRef | None = None,
) -> CommitResult | None:
    """Read the feeds `read_options` name (the `feedlog` source's options) and append their rows to
    `table` (the `feedlog-delta` sink's options): the commit made, or None if there was nothing new.
    `ref`: the job's table, resolved once; the driver's commit goes through its handle."""
    reader, parts, config = _prepare(read_options, table, write_options, ref)
    if not parts:
        return None
    task = functools.partial(_write_partition, reader.feeds, config, task_attempts(spark))
    results = spark.sparkContext.parallelize(parts, len(parts)).map(task).collect()
    written = [r for r in results if isinstance(r, FilesWritten)]
    failed = [r for r in results if isinstance(r, FeedlogError)]
    if failed:
        _abort(config, written, failed[0])
        raise failed[0]
    try:
        return config.commit(written)
    except Exception as e:
        _abort(config, written, e)  # keeps any file a commit (or a staged one the owner may ratify) holds
        raise


def _abort(config: SinkConfig, written: list[FilesWritten], error: BaseException) -> None:
    """`config.abort`, whose own failure (the owner it asks may be what failed) is a note on `error`,
    the error the caller raises."""
    try:
        config.abort(written)
    except Exception as e:
        error.add_note(f"(the job's files were not removed: {e}; vacuum removes them)")


def task_attempts(spark: Any) -> int:
    """How many times Spark runs a failing task before it fails the job: once on `local[N]`, F times
    on `local[N, F]`, spark.task.maxFailures (4) times on a cluster."""
    sc = spark.sparkContext
    return attempts_on(sc.master, sc.getConf().get("spark.task.maxFailures", None))


def attempts_on(master: str, max_failures: str | None) -> int:
    """`task_attempts` for a session on `master` with spark.task.maxFailures `max_failures`."""
    if m := re.fullmatch(r"local(?:\[\s*(?:\d+|\*)\s*(?:,\s*(\d+)\s*)?\])?", master.strip()):
        return max(1, int(m.group(1) or 1))
    try:
        return max(1, int(max_failures or 4))
    except ValueError:
        return 4  # Spark itself refuses such a setting when it starts


def gives_up(error: Exception, attempt: int, attempts: int) -> bool:
    """Whether a task's `attempt` (0 first) that failed with `error` answers with it rather than
    raising it for Spark to run the task again: errors that may pass (the store or a peer
    unavailable, an error feedlog did not foresee) are raised until the last attempt; the others
    (a block that does not verify, a refused input) would fail the same way again."""
    passing = isinstance(error, Unavailable) or not isinstance(error, FeedlogError)
    return not passing or attempt + 1 >= attempts


def land_here(
    read_options: Mapping[str, str],
    table: str,
    write_options: Mapping[str, str],
    tasks: Callable[[int, int], None] | None = None,
    *,
    ref: TableRef | None = None,
) -> CommitResult | None:
    """`land` without Spark: the same tasks one after another in this process, then the same commit.

    For ranges small enough that starting Spark (10 s and more) costs more than the work itself.
    The checks, files, txn claims and commit are the sink's, so the table cannot tell the two apart
    and a rerun by either picks up where the other stopped. A task or commit that fails removes the
    files no commit holds (as Spark's abort does); a process killed outright before its commit leaves
    its files unreferenced, as a killed Spark driver does: no reader sees them. `tasks`: told
    (done, total) as each task ends; `ref` as `land`'s."""
    reader, parts, config = _prepare(read_options, table, write_options, ref)
    if not parts:
        return None
    written: list[FilesWritten] = []
    try:
        for part in parts:
            written.append(config.write(read_partition(reader.feeds, part)))
            if tasks is not None:
                tasks(len(written), len(parts))
        return config.commit(written)
    except BaseException as e:
        _abort(config, written, e)  # keeps any file a commit (or a staged one the owner may ratify) holds
        raise


def _prepare(
    read_options: Mapping[str, str], table: str, write_options: Mapping[str, str], ref: TableRef | None
) -> tuple[FeedBatchReader, list[FeedPartition], SinkConfig]:
    """The reader, its tasks and the sink's checked configuration (the table created if missing)."""
    reader = FeedBatchReader(read_options)
    parts = list(reader.partitions())
    config = SinkConfig.prepare(
        {**write_options, "path": table}, from_arrow_schema(SCHEMA), overwrite=False, streaming=False, ref=ref
    )
    return reader, parts, config


def _write_partition(
    feeds: list[SourceFeed], config: SinkConfig, attempts: int, part: FeedPartition
) -> FilesWritten | FeedlogError:
    """One task: its range read and verified, written as Parquet files (not yet in the table), or
    the error it failed with (its own files removed by `config.write`): the driver removes the
    job's other files before raising it. An error that may pass is raised instead, for Spark to
    run the task again, until its last attempt (`gives_up`)."""
    try:
        failpoints.point("land.task")
        return config.write(read_partition(feeds, part))
    except Exception as e:
        context = TaskContext.get()
        if not gives_up(e, context.attemptNumber() if context is not None else 0, attempts):
            raise
        if isinstance(e, FeedlogError):
            return e
        # not foreseen: its traceback goes to the executor's log, its line to the user
        traceback.print_exc(file=sys.stderr)
        feed = feeds[part.index].source
        return FeedlogError(
            f"a task of the job (feed {feed.key_hex[:16]}..., seqs {part.start}..{part.end - 1}) failed: "
            f"{type(e).__name__}: {e}"
        )
