"""Reading feedlog's Delta tables from Spark: `spark.read.format("feedlog-delta")`, batch and streaming.

    spark.read.format("feedlog-delta").load("data/table")                      # the latest version
    spark.read.format("feedlog-delta").option("versionAsOf", 3).load(t)
    spark.read.format("feedlog-delta").option("timestampAsOf", "2026-11-21T10:00:00Z").load(t)
    spark.readStream.format("feedlog-delta").option("startingVersion", 5).load(t)
    spark.readStream.format("feedlog-delta").option("readChangeFeed", "true").load(t)

Options (delta-spark's names):

    versionAsOf / timestampAsOf   batch time travel; a timestamp (ISO 8601, a naive one is UTC, or ms
                                  since the epoch) resolves by the in-commit-timestamp reader rules,
                                  as `feedlog table version-at` does: at or after the ICT enablement
                                  by ICT, before it by the commit files' times
    startingVersion               streaming: read the commits from this version on (or `latest`: only
                                  commits made after the query starts); default: the table as of the
                                  start, then every later commit
    startingTimestamp             streaming: from the first commit at or after this time (ICT rules)
    maxFilesPerTrigger            streaming: data files per micro-batch (a commit may be split)
    maxBytesPerTrigger            streaming: about this many bytes per micro-batch (at least one file)
    skipChangeCommits             streaming: skip commits that remove data (an overwrite, TTL
                                  compaction) instead of failing the query, as delta-spark does
    readChangeFeed                rows gain `_change_type` (insert | delete), `_commit_version` (long)
                                  and `_commit_timestamp` (timestamp: the commit's ICT; before ICT
                                  was enabled, its file time). Streaming: from startingVersion /
                                  startingTimestamp, else the table as of the start (as inserts at
                                  that version) then every commit; a commit that removes files
                                  yields their rows as deletes. Batch: startingVersion /
                                  startingTimestamp (required) to endingVersion / endingTimestamp.
    maxPartitionBytes             batch: pack data files into tasks of about this many bytes (128 MiB;
                                  each file costs 4 MiB more, as Spark's file sources count it)
    owner, ownerToken, storage.KEY  as for the sink: a managed table's unbackfilled commits come from
                                  its owner only when it is trusted (option `owner`, a local table's
                                  embedded owner, $FEEDLOG_OWNER); otherwise the backfilled log is read

A Python data source cannot tell a stream from a batch read when Spark asks for its schema, so
the commit columns come with `readChangeFeed`, as they do in delta-spark.

Data skipping (option dataSkipping=true). Filters Spark pushes down (`seq > 100`, `timestamp >=
...`, `feed = ...`, IN, IS NULL, LIKE 'x%') are checked against each file's partition values and
its min/max/nullCount stats: a file that cannot hold a matching row is not read; Spark still
applies the filters to the rows read. Opt-in because PySpark 4.3.0 keeps the read planned with a
DataFrame's last pushed filters and reuses it for that DataFrame's later queries that push none
(see `SkippingDeltaBatchReader`). Pushdown needs `spark.sql.python.filterPushdown.enabled`
(`feedlog.lake.register` sets it). `minPartitions` (default: the planner's cores) spreads a small
table's files over at least that many tasks.

Each task reads its files on an executor, straight from the table's storage, with the table's
schema (partition columns restored, columns a file lacks as nulls).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..delta import DeltaTable, Snapshot
from ..delta.actions import Add, CommitInfo, Metadata, Protocol, Remove
from ..delta.log import Listing, read_commit
from ..delta.objectstore import open_storage
from ..delta.replay import ict_enablement
from ..delta.scan import ScanContext, check_type_changes, column_mapping_mode, partition_scalar, read_file
from ..delta.schema import from_schema_string
from ..delta.storage import Storage
from ..delta.timeline import Timeline
from ..errors import InvalidArgument, NotFound, Unsupported
from .spark_errors import marked

COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_TYPE = "_change_type"
INSERT, DELETE = "insert", "delete"
#: what `readChangeFeed` adds to each row
CHANGE_FIELDS = (
    pa.field(CHANGE_TYPE, pa.string()),
    pa.field(COMMIT_VERSION, pa.int64()),
    pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
)
#: Spark's file sources: spark.sql.files.maxPartitionBytes and openCostInBytes
DEFAULT_PARTITION_BYTES = 128 * 1024 * 1024
OPEN_COST_BYTES = 4 * 1024 * 1024
ROWS_PER_BATCH = 65_536
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


# ---- options ------------------------------------------------------------------------------------


def _flag(options: Mapping[str, str], name: str) -> bool:
    raw = (options.get(name) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise InvalidArgument(f"option {name} must be true or false, not {options.get(name)!r}")
    return raw == "true"


def _int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, not {raw!r}") from None
    if n < minimum:
        raise InvalidArgument(f"option {name} must be >= {minimum}, got {n}")
    return n


def parse_timestamp(text: str, name: str = "timestamp") -> int:
    """ISO 8601 (a naive time is UTC; a date alone is its midnight) or integer ms -> ms since the epoch."""
    t = text.strip()
    if t.lstrip("-").isdigit():
        return int(t)
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"option {name}: bad timestamp {text!r}: use ISO 8601 (2026-11-21T10:00:00Z) or ms since the epoch"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return _ms(when)


def _ms(when: dt.datetime) -> int:
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _one_of(options: Mapping[str, str], a: str, b: str) -> None:
    if options.get(a) not in (None, "") and options.get(b) not in (None, ""):
        raise InvalidArgument(f"give option {a} or {b}, not both")


@dataclass(frozen=True)
class Access:
    """How feedlog jobs locate and open a table: the sink's rules (sink.py hands them over, so
    this module does not import it). Module-level functions: pickled by name."""

    #: a path made absolute, a URL checked (`sink.table_location`)
    location: Callable[[str], str]
    #: the `storage.KEY` options (`sink.storage_options_in`)
    storage_options: Callable[[Mapping[str, str]], dict[str, str] | None]
    #: open with a token, the owners to trust and the store (`sink.open_table`)
    open: Callable[[str, str | None, str | None, Mapping[str, str] | None], DeltaTable]


@dataclass(frozen=True)
class TableRef:
    """Where the table is and how to open it; plain data (pickled to executors)."""

    path: str
    token: str | None = None
    owner: str | None = None
    storage_options: dict[str, str] | None = None
    access: Access | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str], access: Access) -> TableRef:
        path = options.get("path")
        if not path:
            raise InvalidArgument("the feedlog-delta reader needs a table path: .load(PATH) or option path")
        return cls(
            access.location(path),
            options.get("ownerToken"),
            options.get("owner"),
            access.storage_options(options),
            access,
        )

    def open(self) -> DeltaTable:
        assert self.access is not None, "a task's table reference opens data files only"
        return self.access.open(self.path, self.token, self.owner, self.storage_options)

    def storage(self) -> Storage:
        return open_storage(self.path, self.storage_options)

    def for_tasks(self) -> TableRef:
        """What executors get: they read data files, so the store, never the owner or its token."""
        return TableRef(self.path, storage_options=self.storage_options)


# ---- files and tasks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileTask:
    """One data file to read, with what its rows carry besides its own columns."""

    path: str
    partition_values: tuple[tuple[str, str | None], ...]
    size: int
    #: the commit that added (or, for a delete, removed) the file; the ICT in microseconds
    version: int = -1
    timestamp_us: int = 0
    change: str = INSERT
    #: the file's deletion vector descriptor (JSON), if it has one
    deletion_vector: str | None = None

    @classmethod
    def of(cls, action: Add | Remove, version: int = -1, timestamp_ms: int = 0, change: str = INSERT) -> FileTask:
        pv = action.partition_values or {}
        dv = action.extra.get("deletionVector")
        return cls(
            action.path,
            tuple(sorted(pv.items())),
            action.size or 0,
            version,
            timestamp_ms * 1000,
            change,
            json.dumps(dv, sort_keys=True) if dv else None,
        )

    def as_add(self) -> Add:
        """The file as the scan reads it (path, partition values, deletion vector)."""
        body: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": 0,
            "dataChange": True,
        }
        if self.deletion_vector:
            body["deletionVector"] = json.loads(self.deletion_vector)
        return Add.from_json(body)


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    files: tuple[FileTask, ...]


def pack(files: Sequence[FileTask], max_bytes: int, min_partitions: int) -> list[FilesPartition]:
    """Files into tasks as Spark packs a file source's splits: each costs its size plus 4 MiB, a task
    holds up to min(maxPartitionBytes, max(4 MiB, total / parallelism)), in the order given."""
    if not files:
        return []
    total = sum(f.size + OPEN_COST_BYTES for f in files)
    target = min(max_bytes, max(OPEN_COST_BYTES, -(-total // max(min_partitions, 1))))
    out: list[FilesPartition] = []
    current: list[FileTask] = []
    size = 0
    for f in files:
        cost = f.size + OPEN_COST_BYTES
        if current and size + cost > target:
            out.append(FilesPartition(tuple(current)))
            current, size = [], 0
        current.append(f)
        size += cost
    out.append(FilesPartition(tuple(current)))
    return out


@dataclass(frozen=True)
class ReadSpec:
    """What a task needs to turn files into rows: plain data (pickled to executors)."""

    table: TableRef
    schema: pa.Schema
    change_feed: bool = False
    #: the table's partition columns and column mapping mode (how its files name their columns)
    partition_columns: tuple[str, ...] = ()
    mapping: str = "none"

    @classmethod
    def of(cls, table: TableRef, snapshot: Snapshot, change_feed: bool) -> ReadSpec:
        check_type_changes(snapshot.schema)  # an undefined widening is refused now, not in a task
        mode = column_mapping_mode(snapshot.protocol, snapshot.metadata)
        return cls(table, snapshot.schema, change_feed, snapshot.partition_columns, mode)

    @property
    def output_schema(self) -> pa.Schema:
        return output_schema(self.schema, self.change_feed)

    def read(self, files: Iterable[FileTask]) -> Iterator[pa.RecordBatch]:
        """Each file's rows as the library reads them (feedlog/delta/scan.py): partition values,
        column mapping, type widening and deletion vectors applied."""
        ctx = ScanContext(self.table.storage(), self.schema, self.partition_columns, self.mapping)
        out = self.output_schema
        for f in files:
            data = read_file(ctx, f.as_add())
            n = data.num_rows
            cols: list[pa.Array | pa.ChunkedArray] = list(data.columns)
            if self.change_feed:
                cols.append(pa.repeat(pa.scalar(f.change, pa.string()), n))
                cols.append(pa.repeat(pa.scalar(f.version, pa.int64()), n))
                cols.append(pa.repeat(pa.scalar(f.timestamp_us, pa.timestamp("us", tz="UTC")), n))
            yield from pa.Table.from_arrays(cols, schema=out).to_batches(max_chunksize=ROWS_PER_BATCH)


def output_schema(schema: pa.Schema, change_feed: bool) -> pa.Schema:
    if not change_feed:
        return schema
    clash = {f.name.lower() for f in CHANGE_FIELDS} & {n.lower() for n in schema.names}
    if clash:
        raise InvalidArgument(f"readChangeFeed adds columns the table already has: {sorted(clash)}")
    return pa.schema([*schema, *CHANGE_FIELDS])


# ---- pruning ------------------------------------------------------------------------------------


def _lookup(doc: Any, path: Sequence[str]) -> Any:
    for p in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(p)
    return doc


def _field_type(schema: pa.Schema, path: Sequence[str]) -> pa.DataType | None:
    t: pa.DataType | None = None
    fields: Any = schema
    for p in path:
        if fields is None:
            return None
        names = [f.name for f in fields]
        if p not in names:
            return None
        t = fields[names.index(p)].type
        fields = list(t) if pa.types.is_struct(t) else None
    return t


#: string min/max stats this long may be a cut prefix of the real value
STRING_STAT_PREFIX = 32


def _stat_value(raw: Any, t: pa.DataType, upper: bool) -> Any:
    """A min/max from the stats JSON as a comparable Python value, None if it cannot be used. A
    timestamp bound is written truncated to the millisecond, so a max stands for up to 999 us more."""
    if raw is None:
        return None
    if pa.types.is_integer(t) and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if pa.types.is_floating(t) and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return None if raw != raw else float(raw)
    if (pa.types.is_string(t) or pa.types.is_large_string(t)) and isinstance(raw, str):
        # writers cut string stats to a prefix (delta-spark: 32 characters): a cut min is still a
        # lower bound, a cut max is not an upper bound
        return None if upper and len(raw) >= STRING_STAT_PREFIX else raw
    if pa.types.is_decimal(t) and isinstance(raw, (int, str)) and not isinstance(raw, bool):
        return decimal.Decimal(str(raw))  # (a float bound, as delta-rs writes, has lost digits: unusable)
    if pa.types.is_date(t) and isinstance(raw, str):
        return dt.date.fromisoformat(raw[:10])
    if pa.types.is_timestamp(t) and isinstance(raw, str):
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        when = when.astimezone(dt.UTC)
        if t.tz is None:
            when = when.replace(tzinfo=None)
        return when + dt.timedelta(microseconds=999) if upper else when
    return None


def _literal(value: Any, t: pa.DataType) -> Any:
    """A filter's literal made comparable with values of type `t`: Spark hands a timestamp literal
    over aware (UTC) and a timestamp_ntz one naive; values here are aware UTC and naive alike."""
    if isinstance(value, dt.datetime) and pa.types.is_timestamp(t):
        if t.tz is None:
            return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    if isinstance(value, float) and value != value:
        return None  # NaN: no ordering to prune by
    return value


def _compare_ok(lo: Any, hi: Any, op: type[Filter], v: Any) -> bool:
    """Whether a value in [lo, hi] (either bound may be unknown: None) can satisfy `col op v`."""
    if op is EqualTo:
        return not ((lo is not None and v < lo) or (hi is not None and v > hi))
    if op is GreaterThan:
        return hi is None or hi > v
    if op is GreaterThanOrEqual:
        return hi is None or hi >= v
    if op is LessThan:
        return lo is None or lo < v
    if op is LessThanOrEqual:
        return lo is None or lo <= v
    return True


_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def may_match(f: Filter, add: Add | FileTask, stats: Mapping[str, Any] | None, schema: pa.Schema) -> bool:
    """False only if no row of the file can satisfy `f` (by its partition values or stats)."""
    attr: tuple[str, ...] = getattr(f, "attribute", ())
    t = _field_type(schema, attr)
    if t is None:
        return True
    pvs = dict(add.partition_values) if isinstance(add, FileTask) else add.partition_values
    try:
        if len(attr) == 1 and attr[0] in pvs:  # a partition column: its one value decides exactly
            v = partition_scalar(pvs[attr[0]], t, attr[0])
            v = _literal(v, t)
            return _partition_ok(f, v, t)
        if stats is None:
            return True
        nulls = _lookup(stats.get("nullCount"), attr)
        rows = stats.get("numRecords")
        if isinstance(f, IsNull) or (isinstance(f, EqualNullSafe) and f.value is None):
            return not (isinstance(nulls, int) and nulls == 0)
        all_null = isinstance(nulls, int) and isinstance(rows, int) and nulls == rows
        if isinstance(f, IsNotNull):
            return not all_null
        if all_null and isinstance(f, (*_COMPARISONS, EqualNullSafe, In, StringStartsWith)):
            return False  # every row is null: no comparison holds
        lo = _stat_value(_lookup(stats.get("minValues"), attr), t, upper=False)
        hi = _stat_value(_lookup(stats.get("maxValues"), attr), t, upper=True)
        if isinstance(f, (*_COMPARISONS, EqualNullSafe)):
            v = _literal(f.value, t)
            if v is None:
                return True
            return _compare_ok(lo, hi, EqualTo if isinstance(f, EqualNullSafe) else type(f), v)
        if isinstance(f, In):
            vals = [_literal(v, t) for v in f.value]
            return any(v is None or _compare_ok(lo, hi, EqualTo, v) for v in vals)
        if isinstance(f, StringStartsWith) and isinstance(f.value, str):
            p = f.value
            if hi is not None and hi < p:
                return False  # every value is below the prefix
            # a min above the prefix that does not start with it is above every string that does
            return not (lo is not None and lo > p and not lo.startswith(p))
    except (TypeError, ValueError, ArithmeticError, InvalidArgument):
        return True  # a literal or bound we cannot compare: keep the file
    return True


def _partition_ok(f: Filter, v: Any, t: pa.DataType) -> bool:
    if isinstance(f, IsNull):
        return v is None
    if isinstance(f, IsNotNull):
        return v is not None
    if isinstance(f, EqualNullSafe):
        lit = _literal(f.value, t)
        return v is None if lit is None else (v is not None and v == lit)
    if v is None:
        return not isinstance(f, (*_COMPARISONS, In, StringStartsWith))
    if isinstance(f, _COMPARISONS):
        lit = _literal(f.value, t)
        return lit is None or _compare_ok(v, v, type(f), lit)
    if isinstance(f, In):
        return any(x is None or x == v for x in (_literal(x, t) for x in f.value))
    if isinstance(f, StringStartsWith) and isinstance(v, str):
        return v.startswith(f.value)
    return True


def prune(files: Sequence[Add], filters: Sequence[Filter], schema: pa.Schema) -> list[Add]:
    """The files that may hold a row matching every filter."""
    if not filters:
        return list(files)
    out = []
    for a in files:
        try:
            stats = json.loads(a.stats) if a.stats else None
        except ValueError:
            stats = None
        if not isinstance(stats, dict):
            stats = None
        if all(may_match(f, a, stats, schema) for f in filters):
            out.append(a)
    return out


# ---- batch --------------------------------------------------------------------------------------


def _listing(table: DeltaTable, stat: bool = False) -> Listing:
    # The backfilled log plus a trusted owner's ratified commits (DeltaTable keeps this private;
    # the streaming reader needs the commits one by one, not only snapshots).
    return table._listing(stat=stat)


def _timeline(table: DeltaTable, snapshot: Snapshot) -> Timeline:
    return Timeline(
        table.storage,
        _listing(table),
        ict_enablement(snapshot.protocol, snapshot.metadata),
        lambda: _listing(table, stat=True),
    )


def check_plain_protocol(p: Protocol, change_feed: bool = False) -> None:
    """Unsupported where this reader cannot give exact answers: a change feed (rows as inserted and
    deleted) over deletion vectors, whose commits replace a file's DV rather than its rows. Every
    other table the library reads is read (scan.py applies DVs, column mapping, widening)."""
    if change_feed and "deletionVectors" in (p.reader_features or ()):
        raise Unsupported(
            "reading refused: readChangeFeed over a table with the deletionVectors feature is not implemented "
            "(read it without readChangeFeed)"
        )


def check_plain(snapshot: Snapshot, change_feed: bool = False) -> None:
    check_plain_protocol(snapshot.protocol, change_feed)


def first_version_at_or_after(table: DeltaTable, timestamp_ms: int) -> int:
    """The first version committed at or after `timestamp_ms` (ICT rules); the latest + 1 if none."""
    try:
        return table.version_at(timestamp_ms - 1) + 1
    except NotFound:  # every retained commit is at or after it
        return _listing(table).earliest


def _parallelism(options: Mapping[str, str]) -> int:
    return _int(options, "minPartitions", 1) or os.cpu_count() or 1


class DeltaBatchReader(DataSourceReader):
    """A snapshot's files (or, with readChangeFeed, a version range's changes) as tasks."""

    def __init__(self, options: Mapping[str, str], access: Access) -> None:
        self.ref = TableRef.from_options(options, access)
        self.max_bytes = _int(options, "maxPartitionBytes", 1) or DEFAULT_PARTITION_BYTES
        self.min_partitions = _parallelism(options)
        self.change_feed = _flag(options, "readChangeFeed")
        self.filters: list[Filter] = []
        self.all_files: list[Add] = []
        #: the version read (versionAsOf, what timestampAsOf resolved to, or the latest); None for a change feed
        self.version: int | None = None
        table = self.ref.open()
        if self.change_feed:
            self.files, _schema = change_range(table, options)  # the latest schema, as `snap`'s
            snap = table.snapshot()
        else:
            snap = snapshot_as_of(table, options)
            check_plain(snap)
            self.version = snap.version
            self.all_files = snap.files()
            self.files = [FileTask.of(a) for a in self.all_files]
        self.spec = ReadSpec.of(self.ref.for_tasks(), snap, self.change_feed)

    def partitions(self) -> Sequence[InputPartition]:
        return pack(self.files, self.max_bytes, self.min_partitions)

    # Pickled with the read function sent to every task (before Spark asks for the partitions, in
    # the same process): the tasks get their files in their partition, not the table's file list.
    # (and no owner token: tasks read data files, never the log)
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "ref": self.ref.for_tasks(), "files": [], "all_files": [], "filters": []}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # no files to read (an empty table, or all pruned): Spark still runs one task, with no partition
        return self.spec.read(partition.files if isinstance(partition, FilesPartition) else ())


class SkippingDeltaBatchReader(DeltaBatchReader):
    """With option dataSkipping: files that cannot hold a row matching the pushed filters are not read.

    Opt-in because of PySpark 4.3.0: it keeps the read planned with a DataFrame's last pushed filters
    and reuses it for that DataFrame's later queries that push none (`df.filter("seq > 9").count()`
    then `df.count()` counts the first query's files). Spark upstream scopes that read to its scan
    (PythonScanBuilder); until then, load a skipping DataFrame for filtered queries only."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        # every filter stays Spark's to apply too: files are pruned here, rows are not filtered
        self.filters = list(filters)
        if not self.change_feed:
            kept = {a.path for a in prune(self.all_files, self.filters, self.spec.schema)}
            self.files = [f for f in self.files if f.path in kept]
        return filters


def snapshot_as_of(table: DeltaTable, options: Mapping[str, str]) -> Snapshot:
    _one_of(options, "versionAsOf", "timestampAsOf")
    version = _int(options, "versionAsOf", 0)
    raw_ts = options.get("timestampAsOf")
    if raw_ts not in (None, ""):
        assert raw_ts is not None
        return table.snapshot(table.version_at(parse_timestamp(raw_ts, "timestampAsOf")))
    return table.snapshot(version)


def change_range(table: DeltaTable, options: Mapping[str, str]) -> tuple[list[FileTask], pa.Schema]:
    """Batch readChangeFeed: every data change of the commits startingVersion..endingVersion."""
    _one_of(options, "startingVersion", "startingTimestamp")
    _one_of(options, "endingVersion", "endingTimestamp")
    latest = table.snapshot()
    check_plain(latest, change_feed=True)
    start = _int(options, "startingVersion", 0)
    if options.get("startingTimestamp"):
        start = first_version_at_or_after(table, parse_timestamp(options["startingTimestamp"], "startingTimestamp"))
    if start is None:
        raise InvalidArgument("readChangeFeed in a batch read needs option startingVersion or startingTimestamp")
    end = _int(options, "endingVersion", 0)
    if options.get("endingTimestamp"):
        end = table.version_at(parse_timestamp(options["endingTimestamp"], "endingTimestamp"))
    end = latest.version if end is None else min(end, latest.version)
    if start > end:
        raise InvalidArgument(f"the change range starts at version {start}, after its end {end}")
    changes = Changes(table, latest, skip_change_commits=False, change_feed=True)
    files = [f for v in range(start, end + 1) for f in changes.commit(v)]
    return files, latest.schema


# ---- streaming ----------------------------------------------------------------------------------


class Changes:
    """The data files each commit adds (and, for a change feed, removes), read once each."""

    def __init__(self, table: DeltaTable, latest: Snapshot, skip_change_commits: bool, change_feed: bool) -> None:
        self.table = table
        self.schema = latest.schema
        self.skip_change_commits = skip_change_commits
        self.change_feed = change_feed
        self.timeline = _timeline(table, latest)
        self._cache: dict[int, list[FileTask]] = {}

    def refresh(self, latest: Snapshot) -> None:
        self.timeline = _timeline(self.table, latest)

    def commit_time(self, version: int, info: CommitInfo | None = None) -> int:
        """The commit's ICT from the enablement on (from its commitInfo when at hand), else its file time."""
        e = self.timeline.enablement
        if info is not None and info.in_commit_timestamp is not None and e is not None and version >= e.version:
            return info.in_commit_timestamp
        return self.timeline.commit_time(version)

    def commit(self, version: int) -> list[FileTask]:
        if version in self._cache:
            return self._cache[version]
        listing = self.timeline.listing
        if version not in listing.commits:
            earliest = min(listing.commits, default=listing.earliest)
            raise NotFound(
                f"commit {version} of {self.table.storage.location} is no longer in the log "
                f"(earliest retained: {earliest}): start the query afresh from a later version"
            )
        actions = read_commit(self.table.storage, listing, version)
        info = next((a for a in actions if isinstance(a, CommitInfo)), None)
        ts = self.commit_time(version, info)
        for a in actions:
            if isinstance(a, Protocol):
                check_plain_protocol(a, self.change_feed)
            if isinstance(a, Metadata) and from_schema_string(a.schema_string) != self.schema:
                raise Unsupported(
                    f"the table's schema changed at version {version}: a stream reads one schema; "
                    "restart the query (it resumes from its checkpoint with the new schema)"
                )
        adds = [FileTask.of(a, version, ts) for a in actions if isinstance(a, Add) and a.data_change]
        removes = [a for a in actions if isinstance(a, Remove) and a.data_change]
        if removes and not self.change_feed:
            if not self.skip_change_commits:
                op = info.operation if info is not None and info.operation else "a commit"
                mode = info.operation_parameters.get("mode") if info is not None else None
                op = f"{op}, mode {mode}" if isinstance(mode, str) else op
                raise Unsupported(
                    f"version {version} ({op}) removes data files from the table: a stream of its appends "
                    "cannot follow it; set option skipChangeCommits to skip such commits, or readChangeFeed "
                    "to read the removed rows as deletes"
                )
            adds = []
        files = adds + [FileTask.of(r, version, ts, DELETE) for r in removes] if self.change_feed else adds
        self._cache[version] = files
        return files


@dataclass(frozen=True)
class Position:
    """A place in the stream: before file `index` of commit `version`, or of the table as of
    `version` when `snapshot` (the initial snapshot a query without a starting point reads first)."""

    version: int
    index: int = 0
    snapshot: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "index": self.index, "snapshot": self.snapshot}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Position:
        return cls(int(d["version"]), int(d.get("index", 0)), bool(d.get("snapshot", False)))


def _key(p: Position) -> tuple[int, bool, int]:
    return (p.version, not p.snapshot, p.index)


@marked(DeltaBatchReader, SkippingDeltaBatchReader)  # a feedlog error reaches the driver as itself
class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are positions in the table's commits; a micro-batch reads the files in between."""

    def __init__(self, options: Mapping[str, str], access: Access) -> None:
        o = self.options = options  # Spark's case-insensitive options (a plain dict of them is not)
        _one_of(o, "startingVersion", "startingTimestamp")
        for name in ("versionAsOf", "timestampAsOf", "endingVersion", "endingTimestamp"):
            if o.get(name) not in (None, ""):
                raise InvalidArgument(f"option {name} is for batch reads; a stream reads on as the table grows")
        self.ref = TableRef.from_options(o, access)
        self.max_files = _int(o, "maxFilesPerTrigger", 1)
        self.max_bytes = _int(o, "maxBytesPerTrigger", 1)
        self.min_partitions = _parallelism(o)
        self.change_feed = _flag(o, "readChangeFeed")
        self.skip_change_commits = _flag(o, "skipChangeCommits")
        latest = self.ref.open().snapshot()
        check_plain(latest, self.change_feed)
        self.spec = ReadSpec.of(self.ref.for_tasks(), latest, self.change_feed)
        self.spec.output_schema  # noqa: B018 (a clashing column name is an error now, not in a task)
        #: trigger availableNow: the latest version when the query started, never read past
        self.target: int | None = None
        self._state: tuple[DeltaTable, Changes] | None = None
        self._snapshots: dict[int, list[FileTask]] = {}

    # pickled to the tasks: the reader's plain data, not its open table, the owner or its token
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "options": {}, "ref": self.ref.for_tasks(), "_state": None, "_snapshots": {}}

    def _open(self) -> tuple[DeltaTable, Changes, Snapshot]:
        if self._state is None:
            table = self.ref.open()
            latest = table.snapshot()
            self._state = (table, Changes(table, latest, self.skip_change_commits, self.change_feed))
            return table, self._state[1], latest
        table, changes = self._state
        latest = table.snapshot()
        changes.refresh(latest)
        return table, changes, latest

    def initialOffset(self) -> dict[str, Any]:
        table, _, latest = self._open()
        o = self.options
        raw_v, raw_ts = o.get("startingVersion"), o.get("startingTimestamp")
        if raw_v not in (None, ""):
            assert raw_v is not None
            if raw_v.strip().lower() == "latest":
                return Position(latest.version + 1).to_json()
            start = _int(o, "startingVersion", 0)
            assert start is not None
            listed = _listing(table)
            earliest = min(listed.commits, default=listed.earliest)  # a checkpoint-only log has no commit files
            if start < earliest:
                raise InvalidArgument(
                    f"startingVersion {start} is no longer in the log of {self.ref.path} (earliest: {earliest})"
                )
            return Position(start).to_json()
        if raw_ts not in (None, ""):
            assert raw_ts is not None
            return Position(first_version_at_or_after(table, parse_timestamp(raw_ts, "startingTimestamp"))).to_json()
        return Position(latest.version, 0, snapshot=True).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        _, _, latest = self._open()
        self.target = latest.version

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def _files_at(self, table: DeltaTable, changes: Changes, pos: Position) -> list[FileTask]:
        if not pos.snapshot:
            return changes.commit(pos.version)
        if pos.version not in self._snapshots:
            ts = changes.commit_time(pos.version)
            files = table.snapshot(pos.version).files()
            self._snapshots[pos.version] = [FileTask.of(a, pos.version, ts) for a in files]
        return self._snapshots[pos.version]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """As far as the table (or, under availableNow, its version when the query started) and
        the limit allow: whole commits, or part of one when a file limit falls inside it."""
        table, changes, latest = self._open()
        last = latest.version if self.target is None else min(latest.version, self.target)
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        pos = Position.from_json(start)
        count = size = 0
        while pos.snapshot or pos.version <= last:  # one step per commit, up to the last version
            rest = self._files_at(table, changes, pos)[pos.index :]
            take = 0
            for f in rest:
                full = (max_files is not None and count >= max_files) or (
                    max_bytes is not None and count > 0 and size + f.size > max_bytes
                )
                if full:
                    break
                take, count, size = take + 1, count + 1, size + f.size
            if take < len(rest):
                return Position(pos.version, pos.index + take, pos.snapshot).to_json()
            pos = Position(pos.version + 1)
        return pos.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        table, changes, _ = self._open()
        pos, stop = Position.from_json(start), Position.from_json(end)
        files: list[FileTask] = []
        while _key(pos) < _key(stop):  # one step per commit, up to the end's
            at = self._files_at(table, changes, pos)
            if (pos.version, pos.snapshot) == (stop.version, stop.snapshot):
                files.extend(at[pos.index : stop.index])
                break
            files.extend(at[pos.index :])
            pos = Position(pos.version + 1)
        return pack(files, DEFAULT_PARTITION_BYTES, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # no files to read (an empty table, or all pruned): Spark still runs one task, with no partition
        return self.spec.read(partition.files if isinstance(partition, FilesPartition) else ())

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to acknowledge: the table keeps its commits; progress lives in Spark's checkpoint."""


# ---- the data source's reading side (DeltaSink in sink.py delegates here) ----------------------


def table_schema(options: Mapping[str, str], access: Access) -> StructType:
    """The schema of the version a read would see (versionAsOf/timestampAsOf), plus the change
    feed's columns with readChangeFeed."""
    table = TableRef.from_options(options, access).open()
    if options.get("versionAsOf") or options.get("timestampAsOf"):
        schema = snapshot_as_of(table, options).schema
    else:
        schema = table.snapshot().schema
    return from_arrow_schema(output_schema(schema, _flag(options, "readChangeFeed")))


def batch_reader(options: Mapping[str, str], access: Access) -> DeltaBatchReader:
    if _flag(options, "dataSkipping"):
        return SkippingDeltaBatchReader(options, access)
    return DeltaBatchReader(options, access)


def stream_reader(options: Mapping[str, str], access: Access) -> DeltaStreamReader:
    return DeltaStreamReader(options, access)


__all__ = [
    "COMMIT_TIMESTAMP",
    "COMMIT_VERSION",
    "Access",
    "DeltaBatchReader",
    "DeltaStreamReader",
    "FileTask",
    "FilesPartition",
    "SkippingDeltaBatchReader",
    "batch_reader",
    "may_match",
    "parse_timestamp",
    "prune",
    "stream_reader",
    "table_schema",
]
