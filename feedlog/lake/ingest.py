"""The job behind `feedlog ingest`: feeds into a managed Delta table, batch or streaming.

Before any Spark: `plan` asks every source for its signed length (a peer that
is down fails here, in about a second) and reads where the table's txn markers
say each feed stopped (the Delta log, read by this library); a table of another
schema is refused here too. A caller with nothing new to land need not start
Spark at all (`nothing_new`).

Batch: one Spark job over exactly the planned range, one commit, exactly once:
`land.land`, whose tasks read, verify and write their Parquet files in the Python
workers (the rows never cross into the JVM and back, which cost as much as Spark's
whole Parquet write), the `feedlog-delta` sink's checks, files and commit; or the
same tasks in this process without Spark (`land.land_here`).
Streaming: the same pair as a structured-streaming query with a checkpoint
(default `<table>/_feedlog/checkpoints/<sources hash>`), micro-batches until
stopped, or until caught up with `available_now`; or, without Spark, the
sources' live tails landed in this process (`stream_local`), progress kept by the
table's txn markers alone. Either may run `maintain` beside it (`stream_maintenance`).

The table is resolved once per job (`sink.TableRef`) and its handle passed from the
plan to the commit(s).

Failures inside Spark come back as the feedlog error that caused them
(`spark_errors.spark_job`), so the CLI can print one line and the right exit code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import errors
from ..delta import TableNotFound
from ..delta.schema import conform
from ..replication.witness import Agreed
from ..rpc import Address
from .feeds import FeedSource, parse_sources
from .land import land, land_here
from .maintain import MaintainReport
from .rows import SCHEMA
from .sink import FORMAT as SINK
from .sink import STATE_DIR, STORAGE_PREFIX, TableRef, app_id, is_url
from .source import FIRST_SEQ
from .source import FORMAT as SOURCE
from .spark_errors import root_error, spark_job
from .stream_local import DEFAULT_TRIGGER_MS, StreamSettings, StreamStats, stream_here
from .stream_maintenance import StreamMaintenance
from .stream_metrics import StreamMetrics, follow_local, observe_behind, observe_commits
from .witnesses import OPTION as WITNESS_OPTION
from .witnesses import cross_check, provenance

Progress = Callable[[str], None]
#: (Spark tasks done, tasks known) of the running job, reported while it runs
TaskProgress = Callable[[int, int], None]


@dataclass
class FeedPlan:
    source: FeedSource
    start: int
    end: int
    #: bytes of the feed's blocks up to `end` as the source says (0: not known); a peer's figure is
    #: not verified, and only decides where the work runs (`runs_here`)
    feed_bytes: int = 0
    #: issue 40: the witnesses whose signed state agreed with the source's at `end` (`plan(witnesses=)`)
    witnesses: tuple[Agreed, ...] = ()

    @property
    def entries(self) -> int:
        return max(self.end - self.start, 0)

    @property
    def bytes(self) -> int:
        """About how many bytes of blocks the range holds: the feed's average entry (the small header block
        counted in) times the range's entries."""
        return min(self.feed_bytes, self.feed_bytes * self.entries // max(self.end - 1, 1))


@dataclass
class IngestResult:
    version: int | None  # the commit made; None if nothing was new (or the batch had landed already)
    rows: int
    seconds: float
    in_commit_timestamp: int | None = None
    #: commits a stream made (a batch job makes one or none)
    commits: int = 0


def landed(
    table: str | TableRef,
    sources: Sequence[FeedSource],
    owner: str | None = None,
    storage: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Where each feed's rows in the table end (its txn marker), FIRST_SEQ for a new feed or table.

    A table whose schema cannot take the source's rows is refused here (SchemaMismatch), before a
    job would fail on it."""
    ref = TableRef.resolve(table, owner, None, storage)
    try:
        t = ref.open()
    except TableNotFound:
        return {s.key_hex: FIRST_SEQ for s in sources}
    try:
        # (from_batches: Schema.empty_table would import pandas, seconds of a no-op rerun on a busy machine)
        conform(pa.Table.from_batches([], schema=SCHEMA), t.snapshot().schema)
    except errors.InvalidArgument as e:
        raise type(e)(f"{ref.path} is not a table of feed rows (feedlog ingest makes those): {e}") from None
    return {s.key_hex: max(t.txn_version(app_id(s.key_hex)) or FIRST_SEQ, FIRST_SEQ) for s in sources}


def plan(
    sources: Sequence[FeedSource],
    table: str | TableRef,
    owner: str | None = None,
    storage: Mapping[str, str] | None = None,
    witnesses: Sequence[Address] = (),
) -> list[FeedPlan]:
    """Each feed's range to land: from its txn marker in the table to the length its source signed.
    No Spark: the table's log is read here and each source asked once (a down peer fails fast).
    `witnesses` (issue 40): the range ends at the signed state they agreed with; a fork fails here."""
    starts = landed(table, sources, owner, storage)
    out = []
    for s in sources:
        length, size = s.signed_size()
        agreed: tuple[Agreed, ...] = ()
        if witnesses:
            state, found = cross_check(s, witnesses)
            length, agreed = min(length, state.length), tuple(found)
        start = starts[s.key_hex]
        if start > length:
            raise errors.Conflict(
                f"the table holds feed {s.key_hex[:16]}... up to seq {start - 1}, past the {length} blocks "
                f"{s.spec} has: a different or truncated copy of the feed?"
            )
        out.append(FeedPlan(s, start, length, size, agreed))
    return out


def plan_lines(plans: Sequence[FeedPlan]) -> list[str]:
    """What a plan means to a user: a line per feed with entries to land, or the one `nothing_new` line."""
    quiet = nothing_new(plans)
    if quiet is not None:
        return [quiet]
    return [
        f"feed {p.source.key_hex[:16]}... ({p.source.spec}): seqs {p.start}..{p.end - 1}, {p.entries} new"
        for p in plans
        if p.entries
    ]


def nothing_new(plans: Sequence[FeedPlan]) -> str | None:
    """The one line to say when no feed has anything new (None if some has)."""
    if any(p.entries for p in plans):
        return None
    if len(plans) == 1:
        p = plans[0]
        return f"nothing new: feed {p.source.key_hex[:16]}... ({p.source.spec}) already landed up to seq {p.end - 1}"
    ends = ", ".join(str(p.end - 1) for p in plans[:5]) + (", ..." if len(plans) > 5 else "")
    return f"nothing new: {len(plans)} feeds already landed up to their signed lengths (seqs {ends})"


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


#: `feedlog ingest --engine auto` lands up to this many entries, and this many bytes of blocks, in its own
#: process rather than starting Spark: Spark's start (10-15 s here) is worth more than the work below these
LOCAL_MAX_ENTRIES = 1_000_000
LOCAL_MAX_BYTES = 1 << 30


def runs_here(
    plans: Sequence[FeedPlan], max_entries: int = LOCAL_MAX_ENTRIES, max_bytes: int = LOCAL_MAX_BYTES
) -> bool:
    """Whether `--engine auto` lands these ranges in this process: few entries and few bytes (a million
    small entries land in seconds here, a million of a megabyte each would take one core an hour)."""
    return sum(p.entries for p in plans) <= max_entries and sum(p.bytes for p in plans) <= max_bytes


def ingest_batch(
    spark: Any | None,
    specs: Sequence[str],
    table: str | TableRef,
    *,
    owner: str | None = None,
    token: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress = print,
    plans: Sequence[FeedPlan] | None = None,
    tasks: TaskProgress | None = None,
) -> IngestResult:
    """One Spark job landing every feed's new entries in `table` (a directory or an object-store URL
    with `storage_options`), exactly once; with `spark` None, the same job in this process without
    Spark (`land.land_here`: for ranges that take less time than Spark takes to start).
    `plans`: `plan`'s answer if the caller asked already; `tasks`: told (done, total) of the job's
    tasks about every second while it runs; `table` may be the job's `TableRef`, resolved by the caller
    (as `plan` was given it): the job then opens the table no more."""
    ref = TableRef.resolve(table, owner, token, storage_options)
    if plans is None:  # (a caller that planned has told its user the plan already)
        plans = plan(parse_sources(",".join(specs)), ref)
        for line in plan_lines(plans):
            progress(line)
    if nothing_new(plans) is not None:
        return IngestResult(None, 0, 0.0)
    plans = [p for p in plans if p.entries]
    total = sum(p.entries for p in plans)
    t0 = time.monotonic()
    job = uuid.uuid4().hex  # recorded in our commit: a concurrent job may commit after us
    before = ref.version()

    def offsets(attr: str) -> str:
        return json.dumps({p.source.key_hex: getattr(p, attr) for p in plans})

    read_options = {
        "feeds": ",".join(_where(p.source) for p in plans),
        "startingOffsets": offsets("start"),
        "endingOffsets": offsets("end"),
    }
    sink_options = _sink_options(owner, token, storage_options, job)
    if any(p.witnesses for p in plans):  # which witnesses agreed, into the commit's provenance (issue 40)
        sink_options[WITNESS_OPTION] = provenance({p.source.key_hex: p.witnesses for p in plans if p.witnesses})
    if spark is None:
        land_here(read_options, ref.path, sink_options, tasks, ref=ref)
    else:
        with spark_job(), watching(spark, tasks):
            land(spark, read_options, ref.path, sink_options, ref=ref)
    seconds = time.monotonic() - t0
    t = ref.open()
    done = all((t.txn_version(app_id(p.source.key_hex)) or 0) >= p.end for p in plans)
    if not done:
        raise errors.Conflict("the commit did not record every feed's progress; rerun to finish")
    # our commit: the newest, unless a concurrent job committed after it; none if another job
    # had already landed our entries
    # (the span from the history's own newest entry: it lists commits the owner ratified and has not
    # backfilled yet, which `version()` of a reader's state may not count, and another job's commit
    # after ours would then fill the span and hide ours)
    newest = t.history(1)
    span = newest[0].version - before if newest else 0
    mine = next((h for h in t.history(span) if _job_of(h.commit_info) == job), None) if span > 0 else None
    return IngestResult(mine.version if mine else None, total, seconds, mine.in_commit_timestamp if mine else None)


#: seconds between looks at a running job's tasks
WATCH_EVERY = 1.0


@contextlib.contextmanager
def watching(spark: Any, report: TaskProgress | None, every: float = WATCH_EVERY) -> Iterator[None]:
    """While the block runs, tell `report` (tasks done, tasks known) of the session's active jobs
    every `every` s, from a thread (the block itself waits in one Spark call)."""
    if report is None:
        yield
        return
    stop = threading.Event()

    def look() -> None:
        tracker = spark.sparkContext.statusTracker()
        while not stop.wait(every):
            try:
                done = total = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done, total = done + info.numCompletedTasks, total + info.numTasks
                if total:
                    report(done, total)
            except Exception:  # the session stopping under us: progress is best effort
                return

    thread = threading.Thread(target=look, name="feedlog-ingest-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every + 5)


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


class _StreamWatch:
    """After each micro-batch, what the table and the sources say, for the stream's metrics (none: nothing)."""

    def __init__(self, metrics: StreamMetrics | None, ref: TableRef, sources: Sequence[FeedSource]) -> None:
        self.metrics, self.ref, self.sources = metrics, ref, sources
        self.after = ref.version() if metrics is not None else -1
        if metrics is not None:
            self.look()

    def look(self) -> None:
        if self.metrics is None:
            return
        try:  # best effort: a metric is never worth failing the stream for (the next batch looks again)
            t = self.ref.open()
            self.after = observe_commits(self.metrics, t, self.after)
            observe_behind(self.metrics, t, self.sources)
        except errors.FeedlogError:
            pass


def ingest_stream(
    spark: Any | None,
    specs: Sequence[str],
    table: str | TableRef,
    *,
    owner: str | None = None,
    token: str | None = None,
    checkpoint_location: str | None = None,
    available_now: bool = False,
    trigger_seconds: float | None = None,
    max_entries_per_trigger: int | None = None,
    timeout: float | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress = print,
    maintain_every_ms: int | None = None,
    stats: StreamStats | None = None,
    stop: threading.Event | None = None,
    metrics: StreamMetrics | None = None,
) -> IngestResult:
    """Stream the feeds into `table` until stopped (Ctrl-C, `stop`), `timeout` s, or caught up
    (`available_now`), exactly once through the table's txn markers.

    With `spark` a structured-streaming query (checkpoint as `default_checkpoint`; trigger default
    1 s); without, the same in this process (`stream_local`: trigger default 100 ms, no checkpoint
    directory: the table's markers are the progress). `trigger_seconds` 0: micro-batches as fast as
    they go. `maintain_every_ms`: a `maintain` pass that often beside the stream
    (`stream_maintenance`); `stats` (local engine) is filled as it runs; `metrics`: told of every
    micro-batch's commits and each source's lag (stream_metrics.py), on either engine."""
    sources = parse_sources(",".join(specs))
    ref = TableRef.resolve(table, owner, token, storage_options)
    starts = landed(ref, sources)  # (the table's progress: no Spark needed)
    if trigger_seconds is not None and trigger_seconds < 0:
        raise errors.InvalidArgument("the trigger must be >= 0 seconds")
    maintenance = None
    if maintain_every_ms is not None:
        if maintain_every_ms <= 0:
            raise errors.InvalidArgument("the maintenance interval must be greater than zero")
        maintenance = StreamMaintenance(
            ref.path,
            maintain_every_ms,
            token=token,
            owner=owner,
            storage_options=storage_options,
            spark=spark,
            engine="auto" if spark is not None else "local",
            on_report=lambda r: progress(f"maintenance: {maintained(r)}"),
            on_error=lambda e: progress(f"maintenance pass failed, the next retries: {e}"),
        )

    def check() -> None:
        if maintenance is not None and maintenance.failed is not None:
            raise maintenance.failed

    t0 = time.monotonic()
    if spark is None:
        settings = StreamSettings(
            trigger_ms=DEFAULT_TRIGGER_MS if trigger_seconds is None else round(trigger_seconds * 1000),
            max_entries_per_trigger=max_entries_per_trigger,
            available_now=available_now,
            timeout_s=timeout,
        )
        settings.check()
        if checkpoint_location:
            raise errors.InvalidArgument("--checkpoint-location is for --engine spark (the local engine keeps none)")
        until = "stops once what the feeds hold now has landed" if available_now else "Ctrl-C stops"
        trigger = f"trigger {settings.trigger_ms} ms" if settings.trigger_ms else "no trigger interval"
        progress(f"streaming {len(sources)} feed(s) into {ref.path} in this process ({trigger}); {until}")
        if metrics is not None:
            stats = stats or StreamStats()
            follow_local(metrics, stats)
        with _beside(maintenance):
            st = stream_here(
                sources,
                ref,
                _sink_options(owner, token, storage_options),
                settings,
                starts=starts,
                stats=stats,
                progress=progress,
                stop=stop,
                check=check,
            )
        check()
        return IngestResult(st.version, st.entries, time.monotonic() - t0, commits=st.commits)
    with _beside(maintenance):
        rows = _spark_stream(
            spark,
            sources,
            ref,
            starts,
            owner=owner,
            token=token,
            checkpoint_location=checkpoint_location,
            available_now=available_now,
            trigger_seconds=1.0 if trigger_seconds is None else trigger_seconds,
            max_entries_per_trigger=max_entries_per_trigger,
            timeout=timeout,
            storage_options=storage_options,
            progress=progress,
            stop=stop,
            check=check,
            metrics=metrics,
        )
    check()
    return IngestResult(None, rows, time.monotonic() - t0)


@contextlib.contextmanager
def _beside(maintenance: StreamMaintenance | None) -> Iterator[None]:
    """The stream's maintenance thread runs while the block does (none: nothing)."""
    if maintenance is None:
        yield
        return
    maintenance.start()
    try:
        yield
    finally:
        maintenance.stop()


def maintained(r: MaintainReport) -> str:
    """A maintenance pass beside a stream, in a few words."""
    parts = [
        f"{r.rows_expired} expired and {r.rows_forgotten} forgotten rows cleared",
        f"checkpoint at {r.checkpoint}" if r.checkpoint is not None else "checkpoint current",
        f"{r.log_files_deleted} log files deleted",
        f"{r.vacuum['files_deleted']} data files vacuumed" if r.vacuum else "nothing to vacuum",
    ]
    if r.deferred:
        parts.append(f"deferred: {', '.join(r.deferred)}")
    return "; ".join(parts)


def _spark_stream(
    spark: Any,
    sources: Sequence[FeedSource],
    ref: TableRef,
    starts: Mapping[str, int],
    *,
    owner: str | None,
    token: str | None,
    checkpoint_location: str | None,
    available_now: bool,
    trigger_seconds: float,
    max_entries_per_trigger: int | None,
    timeout: float | None,
    storage_options: Mapping[str, str] | None,
    progress: Progress,
    stop: threading.Event | None,
    check: Callable[[], None],
    metrics: StreamMetrics | None = None,
) -> int:
    """The structured-streaming query; the rows it landed."""
    table = ref.path
    ckpt = checkpoint_location or default_checkpoint(table, [_where(s) for s in sources])
    # The JVM looks Python data sources up in the thread's active session: a query started from
    # another thread than the session's (a service running the stream in a thread) has none there
    with contextlib.suppress(AttributeError):  # (a Spark Connect session has no JVM here, and no such need)
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    reader = (
        spark.readStream.format(SOURCE)
        .option("feeds", ",".join(_where(s) for s in sources))
        .option("startingOffsets", json.dumps(starts))
    )
    if max_entries_per_trigger:
        reader = reader.option("maxEntriesPerTrigger", str(max_entries_per_trigger))
    rows = 0
    with spark_job():
        writer = reader.load().writeStream.format(SINK).options(**_sink_options(owner, token, storage_options))
        writer = writer.option("checkpointLocation", ckpt).outputMode("append")
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=f"{trigger_seconds} seconds")
        )
        query = writer.start(table)
        until = "stops once what the feeds hold now has landed" if available_now else "Ctrl-C stops"
        progress(f"streaming {len(sources)} feed(s) into {table} (checkpoint {ckpt}); {until}")
        seen = -1
        watch = _StreamWatch(metrics, ref, sources)

        def report() -> int:
            nonlocal seen
            n_new = 0
            batches = 0
            for p in query.recentProgress:
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    batches += 1
                    n = int(p["numInputRows"])
                    n_new += n
                    if n:
                        progress(f"batch {seen}: {n} entries ({p.get('processedRowsPerSecond') or 0:.0f}/s)")
            if batches:
                watch.look()
            return n_new

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while query.isActive and (deadline is None or time.monotonic() < deadline):
                if stop is not None and stop.is_set():
                    break
                check()
                query.awaitTermination(0.5)
                rows += report()
        except KeyboardInterrupt:
            progress("stopping the stream...")
        finally:
            if query.isActive:
                query.stop()
        rows += report()
        failed = query.exception()
        if failed is not None:
            raise root_error(failed)
    return rows
