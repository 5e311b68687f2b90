"""The job behind `feedlog ingest`: feeds into a managed Delta table, batch or streaming.

Batch: the driver reads where the table's txn markers say each feed stopped,
asks each source for its signed length, and runs one Spark job over exactly
that range (`feedlog` source -> `feedlog-delta` sink): one commit, exactly once.
Streaming: the same pair as a structured-streaming query with a checkpoint
(default `<table>/_feedlog/checkpoints/<sources hash>`), micro-batches until
stopped, or until caught up with `available_now`.

Failures inside Spark come back as the feedlog error that caused them
(`spark_error`), so the CLI can print one line and the right exit code.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import errors
from ..delta import TableNotFound
from .feeds import FeedSource, parse_sources
from .sink import FORMAT as SINK
from .sink import STATE_DIR, STORAGE_PREFIX, app_id, is_url, open_table, table_location
from .source import FIRST_SEQ
from .source import FORMAT as SOURCE

Progress = Callable[[str], None]
_ERROR = re.compile(r"feedlog\.errors\.(\w+): ([^\n]*)")


def spark_error(exc: BaseException) -> errors.FeedlogError:
    """The feedlog error behind a failed Spark job (the last one raised in a worker), else Unavailable."""
    text = str(exc)
    found = _ERROR.findall(text)
    if found:
        name, message = found[-1]
        kind = getattr(errors, name, None)
        if isinstance(kind, type) and issubclass(kind, errors.FeedlogError):
            return kind(message.strip())
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return errors.Unavailable(f"the Spark job failed: {first[:500]}")


@dataclass
class FeedPlan:
    source: FeedSource
    start: int
    end: int

    @property
    def entries(self) -> int:
        return max(self.end - self.start, 0)


@dataclass
class IngestResult:
    version: int | None  # the commit made; None if nothing was new (or the batch had landed already)
    rows: int
    seconds: float
    in_commit_timestamp: int | None = None


def landed(
    table: str, sources: Sequence[FeedSource], owner: str | None = None, storage: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Where each feed's rows in the table end (its txn marker), FIRST_SEQ for a new feed or table."""
    try:
        t = open_table(table, None, owner, storage)
    except TableNotFound:
        return {s.key_hex: FIRST_SEQ for s in sources}
    return {s.key_hex: max(t.txn_version(app_id(s.key_hex)) or FIRST_SEQ, FIRST_SEQ) for s in sources}


def plan(
    sources: Sequence[FeedSource], table: str, owner: str | None = None, storage: Mapping[str, str] | None = None
) -> list[FeedPlan]:
    starts = landed(table, sources, owner, storage)
    out = []
    for s in sources:
        length = s.signed_length()
        start = starts[s.key_hex]
        if start > length:
            raise errors.Conflict(
                f"the table holds feed {s.key_hex[:16]}... up to seq {start - 1}, past the {length} blocks "
                f"{s.spec} has: a different or truncated copy of the feed?"
            )
        out.append(FeedPlan(s, start, length))
    return out


def _where(src: FeedSource) -> str:
    """The spec executors get: local directories absolute (their working directory may differ)."""
    return src.path or src.spec


def _sink_options(
    owner: str | None, token: str | None, storage: Mapping[str, str] | None, job: str | None = None
) -> dict[str, str]:
    out = {"jobId": job} if job else {}
    out.update({STORAGE_PREFIX + k: v for k, v in (storage or {}).items()})
    if owner:
        out["owner"] = owner
    if token:
        out["ownerToken"] = token
    return out


def ingest_batch(
    spark: Any,
    specs: Sequence[str],
    table: str,
    *,
    owner: str | None = None,
    token: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress = print,
) -> IngestResult:
    """One Spark job landing every feed's new entries in `table` (a directory or an object-store URL
    with `storage_options`), exactly once."""
    sources = parse_sources(",".join(specs))
    table = table_location(table)
    plans = plan(sources, table, owner, storage_options)
    for p in plans:
        progress(f"feed {p.source.key_hex[:16]}... ({p.source.spec}): seqs {p.start}..{p.end - 1}, {p.entries} new")
    total = sum(p.entries for p in plans)
    if total == 0:
        progress("nothing new to ingest")
        return IngestResult(None, 0, 0.0)
    t0 = time.monotonic()
    job = uuid.uuid4().hex  # recorded in our commit: a concurrent job may commit after us
    before = _version(table, owner, storage_options)

    def offsets(attr: str) -> str:
        return json.dumps({p.source.key_hex: getattr(p, attr) for p in plans})

    try:
        df = (
            spark.read.format(SOURCE)
            .option("feeds", ",".join(_where(p.source) for p in plans))
            .option("startingOffsets", offsets("start"))
            .option("endingOffsets", offsets("end"))
            .load()
        )
        sink_options = _sink_options(owner, token, storage_options, job)
        df.write.format(SINK).options(**sink_options).mode("append").save(table)
    except errors.FeedlogError:
        raise
    except Exception as e:  # Py4J / PySpark errors: find ours inside
        raise spark_error(e) from None
    seconds = time.monotonic() - t0
    t = open_table(table, token, owner, storage_options)
    done = all((t.txn_version(app_id(p.source.key_hex)) or 0) >= p.end for p in plans if p.entries)
    if not done:
        raise errors.Conflict("the commit did not record every feed's progress; rerun to finish")
    # our commit: the newest, unless a concurrent job committed after it; none if another job
    # had already landed our entries
    mine = next((h for h in t.history(t.version() - before) if _job_of(h.commit_info) == job), None)
    return IngestResult(mine.version if mine else None, total, seconds, mine.in_commit_timestamp if mine else None)


def _version(table: str, owner: str | None, storage: Mapping[str, str] | None) -> int:
    """The table's version now, -1 if there is no table yet."""
    try:
        return open_table(table, None, owner, storage).version()
    except TableNotFound:
        return -1


def _job_of(info: Mapping[str, Any]) -> str | None:
    block = info.get("feedlog")
    job = block.get("job") if isinstance(block, dict) else None
    return job if isinstance(job, str) else None


def default_checkpoint(table: str, specs: Sequence[str]) -> str:
    """`<table>/_feedlog/checkpoints/<hash of the sources>`, for a table in a local directory."""
    if is_url(table):
        raise errors.InvalidArgument(
            f"streaming into {table} needs a checkpoint location (CLI --checkpoint-location): Spark keeps "
            "its checkpoints on a Hadoop filesystem, which an object-store table does not give it here"
        )
    digest = hashlib.sha256("\n".join(sorted(specs)).encode()).hexdigest()[:16]
    return str(Path(table).resolve() / STATE_DIR / "checkpoints" / digest)


def ingest_stream(
    spark: Any,
    specs: Sequence[str],
    table: str,
    *,
    owner: str | None = None,
    token: str | None = None,
    checkpoint_location: str | None = None,
    available_now: bool = False,
    trigger_seconds: float = 1.0,
    max_entries_per_trigger: int | None = None,
    timeout: float | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress = print,
) -> IngestResult:
    sources = parse_sources(",".join(specs))
    table = table_location(table)
    starts = landed(table, sources, owner, storage_options)
    ckpt = checkpoint_location or default_checkpoint(table, [_where(s) for s in sources])
    reader = (
        spark.readStream.format(SOURCE)
        .option("feeds", ",".join(_where(s) for s in sources))
        .option("startingOffsets", json.dumps(starts))
    )
    if max_entries_per_trigger:
        reader = reader.option("maxEntriesPerTrigger", str(max_entries_per_trigger))
    t0 = time.monotonic()
    rows = 0
    try:
        writer = reader.load().writeStream.format(SINK).options(**_sink_options(owner, token, storage_options))
        writer = writer.option("checkpointLocation", ckpt).outputMode("append")
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=f"{trigger_seconds} seconds")
        )
        query = writer.start(table)
        progress(f"streaming {len(sources)} feed(s) into {table} (checkpoint {ckpt}); Ctrl-C stops")
        seen = -1

        def report() -> int:
            nonlocal seen
            n_new = 0
            for p in query.recentProgress:
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    n = int(p["numInputRows"])
                    n_new += n
                    if n:
                        progress(f"batch {seen}: {n} entries ({p.get('processedRowsPerSecond') or 0:.0f}/s)")
            return n_new

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while query.isActive and (deadline is None or time.monotonic() < deadline):
                query.awaitTermination(0.5)
                rows += report()
        except KeyboardInterrupt:
            progress("stopping the stream...")
        finally:
            if query.isActive:
                query.stop()
        rows += report()
        if query.exception() is not None:
            raise spark_error(query.exception())
    except errors.FeedlogError:
        raise
    except Exception as e:
        raise spark_error(e) from None
    return IngestResult(None, rows, time.monotonic() - t0)
