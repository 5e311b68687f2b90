"""The feedlog error behind a failed Spark job: marked in the worker, found again on the driver."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog import errors
from feedlog.delta import DeltaTable
from feedlog.delta.schema import SchemaMismatch
from feedlog.extras import MissingExtra
from feedlog.lake import spark_errors
from feedlog.lake.spark_errors import find, first_line, mark, marked, root_error, spark_job

from .conftest import make_feed


def worker_text(err: BaseException, prefix: str = "Job aborted due to stage failure: ") -> str:
    """What a PySpark worker sends the JVM for `err` (its formatted traceback), as Spark embeds it."""
    try:
        raise err
    except BaseException as e:
        tb = "".join(traceback.TracebackException(type(e), e, e.__traceback__, compact=True).format())
    frames = tb.split("\n", 1)[1]  # (TracebackException's own first line is the same header)
    return f"{prefix}Traceback (most recent call last):\n{frames} SQLSTATE: 38000\n\tat org.apache.X"


def test_a_marked_error_comes_back_as_its_own_class_and_message() -> None:
    err = mark(SchemaMismatch("columns not in the table schema: ['a']\nand a second line"))
    found = find(worker_text(err))
    assert type(found) is SchemaMismatch
    assert str(found) == "columns not in the table schema: ['a']\nand a second line"
    assert errors.exit_code(found) == 2


def test_the_last_marked_error_wins_and_constructor_arguments_survive() -> None:
    first = mark(errors.NotFound("not this one"))
    last = mark(errors.StaleLength("someone appended first", 42))
    found = find(worker_text(first) + "\nDriver stacktrace:\nCaused by: " + worker_text(last))
    assert isinstance(found, errors.StaleLength) and found.current_length == 42
    assert str(found) == "someone appended first"


def test_a_class_that_cannot_be_rebuilt_from_its_message_comes_back_as_its_kind() -> None:
    err = mark(MissingExtra("pyspark"))  # its constructor takes a module name, not the message
    found = find(worker_text(err))
    assert type(found) is errors.Unsupported and str(found) == str(err)


def test_marking_is_added_once_and_changes_neither_class_nor_message() -> None:
    err = errors.Conflict("lost a race")
    assert mark(mark(err)) is err
    assert str(err) == "lost a race" and len(err.__notes__) == 1


def test_without_a_marker_the_traceback_line_of_a_feedlog_error_is_used() -> None:
    text = worker_text(errors.Corruption("blocks 1..2 do not hash"))  # an unmarked worker's traceback
    found = find(text)
    assert type(found) is errors.Corruption and str(found) == "blocks 1..2 do not hash"


def test_anything_else_is_unavailable_with_the_exception_line_never_a_traceback() -> None:
    class Boom(Exception):
        pass

    err = root_error(Boom(worker_text(ValueError("bad thing"), "[PYTHON_DATA_SOURCE_ERROR] Failed to init: ")))
    assert type(err) is errors.Unavailable
    assert str(err) == "the Spark job failed: ValueError: bad thing"
    assert first_line("\n\n  Job aborted\nmore", "x") == "Job aborted"
    assert first_line("", "Py4JNetworkError") == "Py4JNetworkError"


def test_marked_wraps_methods_generators_and_functions() -> None:
    class Reader:
        def __init__(self, fail: bool) -> None:
            if fail:
                raise errors.NotFound("no such feed")

        def read(self, n: int) -> Iterator[int]:
            yield n
            raise errors.Corruption("bad block")

        def partitions(self) -> list[int]:
            return [1, 2]

    @marked(Reader)
    def job(x: int) -> int:
        raise errors.InvalidArgument(f"bad {x}")

    with pytest.raises(errors.NotFound) as e1:
        Reader(True)
    assert e1.value.__notes__[0].startswith(spark_errors.MARK)
    it = Reader(False).read(7)
    assert next(it) == 7
    with pytest.raises(errors.Corruption) as e2:
        next(it)
    assert e2.value.__notes__[0].startswith(spark_errors.MARK)
    assert Reader(False).partitions() == [1, 2]  # a list stays a list
    with pytest.raises(errors.InvalidArgument) as e3:
        job(3)
    assert type(find(worker_text(e3.value))) is errors.InvalidArgument


def test_spark_job_raises_the_plain_feedlog_error_and_leaves_our_own_bugs_alone() -> None:
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    with pytest.raises(errors.Conflict, match=r"^lost$"), spark_job():
        raise Py4JError(worker_text(mark(errors.Conflict("lost"))))
    with pytest.raises(KeyError), spark_job():
        raise KeyError("a bug of ours is not a Spark failure")


def test_a_pyspark_write_raises_an_error_that_is_both_kinds_and_starts_with_our_line(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.errors import AnalysisException

    make_feed(tmp_path / "feed", 3, batch=3).close()
    other = tmp_path / "other"
    DeltaTable.create(other, pa.schema([("seq", pa.int64()), ("key", pa.string())]))
    df = spark.read.format("feedlog").option("feed", str(tmp_path / "feed")).load()
    with pytest.raises(SchemaMismatch) as caught:
        df.write.format("feedlog-delta").mode("append").save(str(other))
    e = caught.value
    assert isinstance(e, AnalysisException)  # what PySpark code already catches still catches it
    assert str(e).startswith("columns not in the table schema: ['block', 'cleared', 'deleted'")
    assert str(e.feedlog_error) == str(e).split("\n")[0]  # type: ignore[attr-defined]
    assert "PYTHON_DATA_SOURCE_ERROR" in str(e)  # Spark's own report follows
    assert root_error(e) is e.feedlog_error  # type: ignore[attr-defined]


def test_errors_stay_ours_after_a_foreachbatch_query_rebuilt_pysparks_handler(spark: Any, tmp_path: Path) -> None:
    """PySpark re-installs its Py4J error handler each time it wraps a session, as it does for every
    foreachBatch micro-batch: with our hook beside its handler, the next failed job raised a bare
    AnalysisException (seen in a full test run)."""
    make_feed(tmp_path / "feed", 3, batch=3).close()
    seen: list[int] = []
    query = (
        spark.readStream.format("feedlog")
        .option("feed", str(tmp_path / "feed"))
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(lambda df, _: seen.append(df.count()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    assert sum(seen) == 3
    with pytest.raises(errors.NotFound, match="not a feed directory"):
        spark.read.format("feedlog").option("feed", str(tmp_path / "nothing")).load().count()


def test_a_pyspark_read_of_a_missing_feed_raises_not_found(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="not a feed directory"):
        spark.read.format("feedlog").option("feed", str(tmp_path / "nothing")).load().count()
