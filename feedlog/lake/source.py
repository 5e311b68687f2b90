"""The `feedlog` Spark data source: feeds as a DataFrame, batch and streaming.

    spark.read.format("feedlog").option("feed", "grpc://127.0.0.1:7000/<key>").load()
    spark.readStream.format("feedlog").option("feeds", "data/a,grpc://h:1/<key>")
         .option("maxEntriesPerTrigger", 100000).load()

Options, in the style of Spark's Kafka source (offsets are feed lengths: offset
n means "seqs before n"; entries start at seq 1, after the header):

    feed / feeds            one feed, or several comma-separated (grpc://HOST:PORT/KEY or a directory)
    startingOffsets         earliest | latest | N (every feed) | {"<key hex>": N, ...}
                            default: earliest for batch, latest for streaming (as Kafka)
    endingOffsets           batch only: latest (default) | N | {"<key hex>": N, ...}
    maxEntriesPerTrigger    streaming: entries per micro-batch over all feeds (rounded up to the
                            end of a signed batch, so every micro-batch ends on a signature)
    maxEntriesPerPartition  split a feed's range into tasks of at most this many entries (200000)
    witnesses               grpc://HOST:PORT,... peers whose signed state of each feed must agree with
                            its source's (issue 40), checked on the driver: a fork fails the read

Each task reads its seq range from the peer or directory and verifies every
block against the feed's signed tree with the key from the feed spec: a block
that does not verify fails the task (and the job) before any row is produced.
The schema is `feedlog.lake.rows.SCHEMA`; rows come out as Arrow batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ..errors import InvalidArgument
from ..log.entries import decode_header
from . import witnesses
from .feeds import FeedSource, parse_sources
from .rows import SCHEMA, RowBuilder
from .spark_errors import marked

FORMAT = "feedlog"
DEFAULT_ENTRIES_PER_PARTITION = 200_000
ROWS_PER_BATCH = 8192
#: block bytes per Arrow batch: its binary columns stay far below Arrow's 2 GiB offsets
BYTES_PER_BATCH = 64 << 20
#: entries start after the header block
FIRST_SEQ = 1


@dataclass(frozen=True)
class FeedPartition(InputPartition):
    index: int  # into the reader's feeds
    start: int
    end: int


@dataclass(frozen=True)
class SourceFeed:
    """A feed with what every task needs: its header (verified once, on the driver) and content type."""

    source: FeedSource
    header: bytes
    content_type: str


def _int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, not {raw!r}") from None
    if n < 1:
        raise InvalidArgument(f"option {name} must be >= 1, got {n}")
    return n


def load_feeds(options: Mapping[str, str]) -> list[SourceFeed]:
    spec = options.get("feeds") or options.get("feed") or options.get("path")
    if not spec:
        raise InvalidArgument('the feedlog source needs option "feed" (or "feeds")')
    out = []
    witnessed = witnesses.parse(options.get(witnesses.OPTION))
    for src in parse_sources(spec):
        if witnessed:
            witnesses.cross_check(src, witnessed)
        header = src.header()
        out.append(SourceFeed(src, header, decode_header(header)))
    return out


def signed_lengths(feeds: Sequence[SourceFeed]) -> dict[str, int]:
    """Each feed's signed length, asked once (one GetInfo per peer feed)."""
    return {f.source.key_hex: f.source.signed_length() for f in feeds}


def resolve_offsets(
    spec: str | None, feeds: Sequence[SourceFeed], default: str, what: str, latest: Mapping[str, int]
) -> dict[str, int]:
    """`earliest` / `latest` / N / {"key": N} as {key hex: length}; `latest` holds the signed lengths."""
    text = (spec or default).strip()
    keys = [f.source.key_hex for f in feeds]
    if text == "earliest":
        return dict.fromkeys(keys, FIRST_SEQ)
    if text == "latest":
        return dict(latest)
    given: dict[str, Any]
    if text.lstrip("-").isdigit():
        given = dict.fromkeys(keys, int(text))
    else:
        try:
            given = json.loads(text)
        except json.JSONDecodeError:
            given = None  # type: ignore[assignment]
        if not isinstance(given, dict):
            raise InvalidArgument(f'{what} must be earliest, latest, a number or {{"<feed key hex>": N}}, not {text!r}')
    unknown = set(given) - set(keys)
    if unknown:
        raise InvalidArgument(f"{what} names feeds that are not read: {', '.join(sorted(unknown))}")
    out = {}
    for f in feeds:
        k = f.source.key_hex
        v = given.get(k, FIRST_SEQ if default == "earliest" else None)
        if v is None:
            v = latest[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidArgument(f"{what} for feed {k[:16]}... must be a length >= 0, not {v!r}")
        out[k] = max(v, FIRST_SEQ)
    return out


def plan_partitions(
    feeds: Sequence[SourceFeed], start: Mapping[str, int], end: Mapping[str, int], per_partition: int
) -> list[FeedPartition]:
    parts = []
    for i, f in enumerate(feeds):
        k = f.source.key_hex
        lo, hi = start.get(k, FIRST_SEQ), end.get(k, FIRST_SEQ)
        for a in range(lo, hi, per_partition):
            parts.append(FeedPartition(i, a, min(a + per_partition, hi)))
    return parts


def read_partition(feeds: Sequence[SourceFeed], part: FeedPartition) -> Iterator[pa.RecordBatch]:
    f = feeds[part.index]
    rows = RowBuilder(f.source.key_hex, f.content_type, f.header)
    for batch in f.source.read(part.start, part.end):
        rows.add(batch)
        if len(rows) >= ROWS_PER_BATCH or rows.nbytes >= BYTES_PER_BATCH:
            yield rows.flush()
    if len(rows):
        yield rows.flush()


class FeedBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.feeds = load_feeds(options)
        self.per_partition = _int_option(options, "maxEntriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION)
        lengths = signed_lengths(self.feeds)
        self.start = resolve_offsets(options.get("startingOffsets"), self.feeds, "earliest", "startingOffsets", lengths)
        self.end = resolve_offsets(options.get("endingOffsets"), self.feeds, "latest", "endingOffsets", lengths)
        if (options.get("endingOffsets") or "").strip() == "earliest":
            raise InvalidArgument("endingOffsets cannot be earliest")
        for f in self.feeds:
            k = f.source.key_hex
            length = lengths[k]
            if self.end[k] > length:
                raise InvalidArgument(f"endingOffsets {self.end[k]} is past feed {k[:16]}...'s length {length}")
            if self.start[k] > self.end[k]:
                raise InvalidArgument(f"startingOffsets {self.start[k]} is after endingOffsets {self.end[k]}")

    def partitions(self) -> Sequence[FeedPartition]:
        assert self.per_partition is not None
        return plan_partitions(self.feeds, self.start, self.end, self.per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FeedPartition)
        return read_partition(self.feeds, partition)


class FeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.feeds = load_feeds(options)
        # (Spark's options are case-insensitive; a plain dict of them is not)
        self.starting = options.get("startingOffsets")
        self.per_partition = _int_option(options, "maxEntriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION)
        self.max_per_trigger = _int_option(options, "maxEntriesPerTrigger", None)
        if "endingOffsets" in options:
            raise InvalidArgument("endingOffsets is for batch reads; a stream reads on as the feeds grow")
        #: each feed's signed length when an availableNow query started: it reads up to there and stops,
        #: however fast a writer appends meanwhile (None: read on as the feeds grow)
        self.target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = signed_lengths(self.feeds)

    def initialOffset(self) -> dict[str, int]:
        return resolve_offsets(self.starting, self.feeds, "latest", "startingOffsets", signed_lengths(self.feeds))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        initial: dict[str, int] | None = None
        out = {}
        for f in self.feeds:
            k = f.source.key_hex
            if k in start:
                lo = start[k]
            else:  # a feed added to the query since its last run starts at startingOffsets
                initial = initial or self.initialOffset()
                lo = initial[k]
            length = f.source.signed_length() if self.target is None else self.target[k]
            hi = length
            if budget is not None:
                hi = min(length, lo + budget)
                if FIRST_SEQ <= hi < length:
                    hi = f.source.batch_end(hi - 1) if hi > lo else lo
                budget = max(budget - (hi - lo), 0)
            out[k] = max(hi, lo)
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[FeedPartition]:
        assert self.per_partition is not None
        return plan_partitions(self.feeds, start, end, self.per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FeedPartition)
        return read_partition(self.feeds, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to acknowledge: a feed keeps its blocks; progress lives in Spark's checkpoint."""


@marked(FeedBatchReader, FeedStreamReader)  # a feedlog error reaches the driver as itself
class FeedDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return from_arrow_schema(SCHEMA)

    def reader(self, schema: StructType) -> FeedBatchReader:
        return FeedBatchReader(self.options)

    def streamReader(self, schema: StructType) -> FeedStreamReader:
        return FeedStreamReader(self.options)
