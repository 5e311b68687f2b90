"""What a streaming ingest (`feedlog ingest --stream --metrics-listen HOST:PORT`) exports to Prometheus.

One observer, whichever engine runs the stream; the engine calls it as it lands data:

    m = StreamMetrics(registry, sources=[key_hex, ...])   # the feeds the stream reads (their labels)
    m.landed(entries, nbytes)           # rows committed, and the bytes of the data files that hold them
    m.committed(version, ict_ms, freshness_ms)   # a commit made: its version, its in-commit timestamp,
                                        # and freshness samples (ms: the commit's ICT minus writer timestamps)
    m.behind(source, entries)           # entries a source has signed that the table does not hold yet

Each method is cheap (a few counter updates) and thread-safe. `behind` for a feed not named at
construction is ignored: a label value only ever names a source the operator configured.

The Spark engine commits in a worker process (SinkConfig.commit in sink.py), so `ingest_stream`
reads what each micro-batch committed from the table itself (`observe_commits`): the new commits'
provenance (`commitInfo.feedlog.feeds`: rows per feed), their data files' sizes, and, per file, the
age of its oldest entry when the commit made it visible (the ICT minus the file's smallest writer
timestamp, from its statistics: every entry in the file was visible at most that long after it was
written). An engine that commits in this process can pass exact per-entry samples instead.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..delta.actions import Add, CommitInfo
from ..delta.log import read_commit
from ..delta.table import DeltaTable
from .feeds import FeedSource
from .sink import app_id
from .source import FIRST_SEQ

if TYPE_CHECKING:
    from .stream_local import Landed, StreamStats

#: freshness buckets, seconds: Spark micro-batches land in ~1 s here (FIELD-NOTES), a stalled stream in minutes
FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class StreamMetrics:
    """The streaming ingest's families in `registry` (a `feedlog.metrics.new_registry()`)."""

    def __init__(self, registry: Any, sources: Iterable[str]) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.entries = Counter("feedlog_ingest_entries_total", "Entries (rows) landed in the table.", registry=registry)
        self.bytes = Counter(
            "feedlog_ingest_bytes_total", "Bytes of data files committed to the table.", registry=registry
        )
        self.commits = Counter("feedlog_ingest_commits_total", "Commits the stream made.", registry=registry)
        self.version = Gauge(
            "feedlog_ingest_last_commit_version", "The table version of the stream's latest commit.", registry=registry
        )
        self.ict = Gauge(
            "feedlog_ingest_last_commit_timestamp_seconds",
            "The in-commit timestamp of the stream's latest commit (seconds since the epoch).",
            registry=registry,
        )
        self.freshness = Histogram(
            "feedlog_ingest_freshness_seconds",
            "How long after it was written an entry became visible in the table (commit ICT minus writer timestamp).",
            buckets=FRESHNESS_BUCKETS,
            registry=registry,
        )
        family = Gauge(
            "feedlog_ingest_entries_behind",
            "Entries a source has signed that the table does not hold yet.",
            ["feed"],
            registry=registry,
        )
        self._behind = {s: family.labels(s) for s in sources}

    def landed(self, entries: int, nbytes: int) -> None:
        self.entries.inc(entries)
        self.bytes.inc(nbytes)

    def committed(self, version: int, ict_ms: int | None, freshness_ms: Sequence[int] = ()) -> None:
        self.commits.inc()
        self.version.set(version)
        if ict_ms is not None:
            self.ict.set(ict_ms / 1000)
        for ms in freshness_ms:
            self.freshness.observe(max(0, ms) / 1000)

    def behind(self, source: str, entries: int) -> None:
        gauge = self._behind.get(source)
        if gauge is not None:
            gauge.set(max(0, entries))


def _ms(stamp: Any) -> int | None:
    """A timestamp column's statistic (`2026-11-28T10:00:00.123Z`) in ms since the epoch; None if absent."""
    if not isinstance(stamp, str):
        return None
    try:
        when = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def commit_facts(actions: Sequence[Any]) -> tuple[int, int, int | None, list[int]]:
    """A commit's (rows landed, data bytes added, ICT, freshness samples in ms), from its actions alone
    (pure): rows from feedlog's provenance, bytes and the oldest writer timestamp per file from its adds."""
    info = next((a for a in actions if isinstance(a, CommitInfo)), None)
    ict = info.in_commit_timestamp if info is not None else None
    block = (info.extra.get("feedlog") if info is not None else None) or {}
    rows = sum(int(f.get("rows", 0)) for f in block.get("feeds", ()) if isinstance(f, dict))
    adds = [a for a in actions if isinstance(a, Add) and a.data_change]
    samples = []
    for a in adds:
        try:
            stats = json.loads(a.stats) if a.stats else {}
        except ValueError:
            continue
        oldest = _ms((stats.get("minValues") or {}).get("timestamp"))
        if ict is not None and oldest is not None:
            samples.append(ict - oldest)
    return rows, sum(a.size for a in adds), ict, samples


def observe_commits(metrics: StreamMetrics, table: DeltaTable, after: int) -> int:
    """Tell `metrics` of the table's commits after version `after` that landed feed rows (those with
    feedlog provenance); returns the newest version seen. (The commits one by one: the table's listing,
    kept private by DeltaTable, as the Delta streaming source reads it: delta_source._listing.)"""
    listing = table._listing()
    newest = max(listing.commits, default=after)
    for version in range(after + 1, newest + 1):
        if version not in listing.commits:
            continue
        actions = read_commit(table.storage, listing, version)
        rows, nbytes, ict, samples = commit_facts(actions)
        if rows:
            metrics.landed(rows, nbytes)
            metrics.committed(version, ict, samples)
    return max(newest, after)


def observe_behind(metrics: StreamMetrics, table: DeltaTable, sources: Sequence[FeedSource]) -> None:
    """Each source's signed length minus where the table's txn marker says its rows end."""
    snapshot = table.snapshot()
    for s in sources:
        length, _ = s.signed_size()
        landed = max(snapshot.txn_version(app_id(s.key_hex)) or FIRST_SEQ, FIRST_SEQ)  # seq 0: the header
        metrics.behind(s.key_hex, length - landed)


def follow_local(metrics: StreamMetrics, stats: StreamStats) -> None:
    """Feed `metrics` from the local engine's own account of each micro-batch (`StreamStats.listen`):
    it commits in this process, so nothing needs reading back from the table. Its freshness samples
    are the commit's time minus each entry's writer timestamp, one per entry."""

    def landed(batch: Landed) -> None:
        if batch.version is None:  # found landed already (a rerun): nothing new
            return
        metrics.landed(batch.entries, batch.file_bytes)  # data-file bytes, as the Spark path counts
        metrics.committed(batch.version, batch.committed_ms, [int(ms) for ms in batch.freshness_ms])
        for key, n in stats.behind_by_key().items():
            metrics.behind(key, n)

    stats.listen(landed)
