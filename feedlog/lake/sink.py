"""The `feedlog-delta` Spark sink: a DataFrame into a Delta table, committed through its owner.

    df.write.format("feedlog-delta").mode("append").save("data/table")
    df.writeStream.format("feedlog-delta").option("checkpointLocation", "data/ckpt").start("data/table")

Executors write Parquet files with per-file stats from the Arrow batches they
get; the driver-side commit (which Spark runs in a Python worker of its own)
adds them in one Delta commit: through the commit owner the table names, with
`commitInfo` first and an in-commit timestamp. A missing table is created
managed, with in-commit timestamps, by the owner in option `owner`
(grpc://HOST:PORT, or a SQLite file for the in-process owner; default: the
in-process owner on `<table>/_feedlog/owner.db`; `filesystem` for none).

Object stores. The path may be a URL (`s3://bucket/table`, gs://, az://, abfss://) with the
table's storage options as `storage.KEY` options (delta-rs's keys:
`.option("storage.AWS_ENDPOINT_URL", ...)`); executors write the data files there themselves.
Such a table has no embedded owner and keeps no token: name the owner (`owner`) and give its
token (`ownerToken` or $FEEDLOG_OWNER_TOKEN).

Exactly once. Rows with `feed` and `seq` columns (what the `feedlog` source
produces) commit one `txn` action per feed: appId `feedlog:<key hex>`, version
= the seq after the last row landed. A batch the table already holds (a rerun
after a crash, a replayed micro-batch) commits nothing; one that overlaps a
range another job landed fails with Conflict, without touching the table.
Options `txnAppId` + `txnVersion` (batch) or `queryId` (streaming: version =
batch id) add Delta's usual idempotent-writer marker too.

Provenance. `commitInfo.feedlog.feeds` records, per feed: the seq range landed
and the newest signed state (length, fork, tree_hash, signature) found in the
rows' `signed` column, which `feedlog audit` checks.

Maintenance: after a commit whose version is a multiple of
`delta.checkpointInterval` (Delta's property, default 10) the sink backfills,
writes a checkpoint and cleans up expired log files. Then auto-compaction
(delta/optimize.py): a table created here has `delta.autoOptimize.autoCompact`
on, and any table with it on gets its small files compacted once a partition
holds 50 of them; one that fails or loses a race is a warning, left to a later
commit (the commit before it has landed).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from .. import failpoints
from ..clock import Clock, SystemClock
from ..delta import DeltaTable, Storage, TableNotFound
from ..delta.actions import Add
from ..delta.managed import TOKEN_ENV, Binding, new_token, staged_data_paths, trusted_owners
from ..delta.objectstore import OBJECT_SCHEMES, open_storage, scheme_of
from ..delta.optimize import AUTO_COMPACT
from ..delta.schema import conform
from ..delta.snapshot import Snapshot
from ..delta.transaction import CommitResult, ConcurrentModification
from ..delta.writer import WriteOptions, write_files
from ..errors import AlreadyExists, Conflict, FeedlogError, InvalidArgument, Unsupported
from .forget import Forget, after_commit, forget_rows
from .spark_errors import marked

FORMAT = "feedlog-delta"
APP_PREFIX = "feedlog:"
#: the in-process owner's database and the token file, inside the table directory (readers skip `_` dirs)
STATE_DIR = "_feedlog"
EMBEDDED_DB = "owner.db"
TOKEN_FILE = "owner-token"
#: Spark options `storage.KEY` are the table's object-store options (delta-rs's keys), e.g.
#: .option("storage.AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
STORAGE_PREFIX = "storage."
#: bytes of Arrow data a sink task holds before writing them out as Parquet files, so what a task
#: holds grows with this (plus one batch, the conformed copy and the encoded files), not with its
#: partition; a partition under it is written as before, once
FLUSH_BYTES = 256 << 20
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
DEFAULT_CHECKPOINT_INTERVAL = 10


def app_id(feed_hex: str) -> str:
    return APP_PREFIX + feed_hex


@dataclass
class FeedRange:
    """The rows of one feed in a write: seqs first..last, and the newest signed state among them."""

    first: int
    last: int
    rows: int
    signed: dict[str, Any] | None = None
    #: (key, seq) of the forget entries among the rows (issue 37: the commit's forget rewrite applies them)
    forgets: list[tuple[str, int]] = field(default_factory=list)

    def merge(self, other: FeedRange) -> FeedRange:
        signed = max((s for s in (self.signed, other.signed) if s), key=lambda s: s["length"], default=None)
        return FeedRange(
            min(self.first, other.first),
            max(self.last, other.last),
            self.rows + other.rows,
            signed,
            self.forgets + other.forgets,
        )


@dataclass
class FilesWritten(WriterCommitMessage):
    adds: list[dict[str, Any]]
    feeds: dict[str, FeedRange] = field(default_factory=dict)


def feed_ranges(data: pa.Table) -> dict[str, FeedRange]:
    if data.num_rows == 0 or "feed" not in data.column_names or "seq" not in data.column_names:
        return {}
    # the columns needed first: filtering the whole table would copy every column of every row
    agg = data.select(["feed", "seq"]).group_by("feed").aggregate([("seq", "min"), ("seq", "max"), ("seq", "count")])
    out = {r["feed"]: FeedRange(r["seq_min"], r["seq_max"], r["seq_count"]) for r in agg.to_pylist()}
    if "signed" in data.column_names:
        states = data.select(["feed", "signed"])
        signed = states.filter(pc.is_valid(states.column("signed"))).to_pylist()
        for row in signed:
            s = row["signed"]
            r = out[row["feed"]]
            if r.signed is None or s["length"] > r.signed["length"]:
                r.signed = {
                    "length": s["length"],
                    "fork": s["fork"],
                    "tree_hash": s["tree_hash"].hex(),
                    "signature": s["signature"].hex(),
                }
    if "block" in data.column_names and "deleted" in data.column_names:
        for f in forget_rows(data):
            out[f.feed].forgets.append((f.key, f.seq))
    return out


def is_url(table: str) -> bool:
    """Whether `table` names a table on an object store (`s3://...`) rather than a local directory."""
    return scheme_of(table) is not None


def table_location(table: str) -> str:
    """How executors and the owner name the table: a local directory made absolute (executors'
    working directories differ), a URL as given (a URL feedlog does not serve is InvalidArgument)."""
    if not is_url(table):
        return str(Path(table).resolve())
    scheme = scheme_of(table)
    if scheme not in OBJECT_SCHEMES or not table[len(scheme or "") + 1 :].startswith("//"):
        open_storage(table)  # raises the one-line InvalidArgument naming what is wrong
    return table.rstrip("/")


def _token_path(table: str) -> Path:
    return Path(table) / STATE_DIR / TOKEN_FILE


def table_token(path: str, given: str | None) -> str | None:
    """The owner token: given, $FEEDLOG_OWNER_TOKEN, or the one kept in a local table's `_feedlog/`
    (a table on an object store keeps none: a token in the bucket is readable by every reader)."""
    if given or os.environ.get(TOKEN_ENV):
        return given or os.environ.get(TOKEN_ENV)
    if is_url(path):
        return None
    try:
        return _token_path(path).read_text().strip() or None
    except FileNotFoundError:
        return None


def _keep_token(path: str) -> str:
    """A token for a table being created, agreed put-if-absent so concurrent creators share one."""
    if is_url(path):
        raise InvalidArgument(
            f"creating the managed table {path} needs its owner token (option ownerToken, CLI --token-file, or "
            f"${TOKEN_ENV}): a table on an object store has no directory of ours to keep a generated one in"
        )
    p = _token_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    token = new_token()
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return p.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token)
        f.flush()
        os.fsync(f.fileno())
    return token


def owner_binding(path: str, spec: str | None) -> Binding | None:
    """The owner a new table at `path` gets: the option `owner` (a spec), or by default the
    embedded owner in a local table's `_feedlog/`; a table on an object store has no default."""
    if spec is None or spec == "" or spec == "embedded":
        if is_url(path):
            raise InvalidArgument(
                f"{path} is on an object store, where a table has no embedded commit owner: give the owner "
                "(option owner / CLI --owner): grpc://HOST:PORT for a served owner, a database file or "
                "postgresql:// URL for one in this process, or 'filesystem' for commits by conditional put"
            )
        return Binding.feedlog(db=str(Path(path).resolve() / STATE_DIR / EMBEDDED_DB))
    if spec == "filesystem":
        return None
    return Binding.parse(spec)


def trusted(path: str, spec: str | None) -> list[Binding]:
    """The owners a feedlog job on `path` talks to: the one its `owner` option names (default: a local
    table's embedded owner) and $FEEDLOG_OWNER's; a table naming another one is not written."""
    named = None if is_url(path) and spec in (None, "", "embedded") else owner_binding(path, spec)
    return ([named] if named is not None else []) + list(trusted_owners(None))


def storage_options_in(options: Mapping[str, str]) -> dict[str, str] | None:
    """The object-store options among a Spark data source's options: `storage.KEY` -> KEY."""
    found = {k[len(STORAGE_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(STORAGE_PREFIX)}
    return found or None


def open_table(
    path: str, token: str | None, owner: str | None, storage_options: Mapping[str, str] | None
) -> DeltaTable:
    """The table at `path` as a feedlog job opens it: its owner token, the owners it trusts, its store."""
    return DeltaTable.open(
        path, owner_token=table_token(path, token), owner=trusted(path, owner), storage_options=storage_options
    )


@dataclass
class TableRef:
    """A job's table, resolved once at its entrance: where it is (`table_location`), its owner spec,
    token and store options, and the open handle (None while the table does not exist yet).

    Batch and streaming ingest pass this from their planning to their commit, so a job reads the
    table's log and talks to its owner through one `DeltaTable` (whose state each read catches up
    from) instead of re-resolving the path in each step, and a stream does not redo it every trigger.
    Not pickled to executors: `SinkConfig` carries the plain fields and drops the handle."""

    path: str
    owner: str | None = None
    token: str | None = None
    storage_options: dict[str, str] | None = None
    table: DeltaTable | None = None

    @classmethod
    def resolve(
        cls,
        table: str | TableRef,
        owner: str | None = None,
        token: str | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> TableRef:
        """`table` as given if it is a ref already; else its location resolved and the table opened if it exists."""
        if isinstance(table, TableRef):
            return table
        ref = cls(table_location(table), owner, token, dict(storage_options) if storage_options else None)
        with contextlib.suppress(TableNotFound):
            ref.table = open_table(ref.path, token, owner, ref.storage_options)
        return ref

    def open(self) -> DeltaTable:
        """The table's handle: the one resolved, or (for a table created since) opened now and kept."""
        if self.table is None:
            self.table = open_table(self.path, self.token, self.owner, self.storage_options)
        return self.table

    def version(self) -> int:
        """The table's version now, -1 while there is no table."""
        try:
            return self.open().version()
        except TableNotFound:
            return -1


def open_or_create(path: str, schema: pa.Schema, options: Mapping[str, str]) -> DeltaTable:
    token = table_token(path, options.get("ownerToken"))
    owners = trusted(path, options.get("owner"))
    store = storage_options_in(options)
    try:
        return DeltaTable.open(path, owner_token=token, owner=owners, storage_options=store)
    except TableNotFound:
        pass
    binding = owner_binding(path, options.get("owner"))
    if binding is not None and token is None:
        token = _keep_token(path)
    try:
        # auto-compaction on (delta/optimize.py): a stream's one small file per commit stays bounded
        props = {AUTO_COMPACT: "true"}
        return DeltaTable.create(
            path, schema, owner=binding, owner_token=token, storage_options=store, properties=props
        )
    except AlreadyExists:
        return DeltaTable.open(path, owner_token=token, owner=owners, storage_options=store)


@dataclass(frozen=True)
class SinkConfig:
    """What executors and the committing worker need; plain data (it is pickled to them)."""

    path: str
    token: str | None
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    write_options: WriteOptions
    overwrite: bool
    app_id: str | None
    app_version: int | None
    #: the sink's `owner` option: which commit owner the committing worker may talk to
    owner: str | None = None
    #: the sink's `jobId` option, recorded in the commit so the job can find its own commit later
    job_id: str | None = None
    #: stamps data files and commits (picklable: the system clock, or a test's manual clock)
    clock: Clock = field(default_factory=SystemClock)
    #: the table's object-store options (`storage.KEY` options), for executors and the committing worker
    storage_options: dict[str, str] | None = None
    #: a task writes out what it holds once it holds this many bytes of Arrow data (`write`)
    flush_bytes: int = FLUSH_BYTES
    #: the `witnesses` option (issue 40): which witnesses agreed with each feed's source, as JSON
    witnesses: str | None = None
    #: the job's open table (`TableRef`), for commits made in the process that prepared this config:
    #: not pickled (an executor or a committing worker elsewhere opens the table from the fields above)
    handle: DeltaTable | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["handle"] = None  # a handle holds connections and caches: it stays in its process
        return state

    def storage(self) -> Storage:
        return open_storage(self.path, self.storage_options)

    def open(self, clock: Clock | None = None) -> DeltaTable:
        if self.handle is not None:
            if clock is not None:
                self.handle.clock = clock  # (the config's clock stamps the commits, as a fresh handle's would)
            return self.handle
        return DeltaTable.open(
            self.path,
            owner_token=self.token,
            owner=trusted(self.path, self.owner),
            clock=clock,
            storage_options=self.storage_options,
        )

    @classmethod
    def prepare(
        cls,
        options: Mapping[str, str],
        spark_schema: StructType,
        overwrite: bool,
        streaming: bool,
        ref: TableRef | None = None,
    ) -> SinkConfig:
        """The sink's checked configuration; the table created if missing. With `ref` (the job's table,
        resolved at its entrance) its handle is used, or set to the table created here, and the config's
        commits go through it."""
        from pyspark.sql.pandas.types import to_arrow_schema

        path = options.get("path")
        if not path:
            raise InvalidArgument("the feedlog-delta sink needs a table path: .save(PATH) or option path")
        incoming = to_arrow_schema(spark_schema, timezone="UTC")
        table = ref.table if ref is not None and ref.table is not None else open_or_create(path, incoming, options)
        if ref is not None:
            ref.table = table
        snap = table.snapshot()
        conform(pa.Table.from_batches([], schema=incoming), snap.schema)  # a clear SchemaMismatch now, not per task
        if streaming:
            app, version = options.get("queryId"), None
        else:
            app, raw = options.get("txnAppId"), options.get("txnVersion")
            if (app is None) != (raw is None):
                raise InvalidArgument("txnAppId and txnVersion go together")
            try:
                version = int(raw) if raw is not None else None
            except ValueError:
                raise InvalidArgument(f"txnVersion must be an integer, not {raw!r}") from None
        return cls(
            path=table_location(path),
            token=table.owner_token,
            schema=snap.schema,
            partition_columns=snap.partition_columns,
            write_options=snap.write_options(),
            overwrite=overwrite,
            app_id=app,
            app_version=version,
            owner=options.get("owner"),
            job_id=options.get("jobId"),
            storage_options=storage_options_in(options),
            handle=table if ref is not None else None,
            witnesses=options.get("witnesses"),
        )

    # executors

    def write(self, batches: Iterator[pa.RecordBatch]) -> FilesWritten:
        """A task's rows as Parquet files, written as they come: whenever `flush_bytes` of Arrow data
        are held, they go out as files and are let go, so a task holds that much whatever the size
        of its partition (as Spark's own writers stream theirs)."""
        adds: list[Add] = []
        ranges: dict[str, FeedRange] = {}
        held: list[pa.RecordBatch] = []
        size = 0
        try:
            for batch in batches:
                held.append(batch)
                size += batch.nbytes
                if size >= self.flush_bytes:
                    self._write_held(held, adds, ranges)
                    held, size = [], 0
            if held:
                self._write_held(held, adds, ranges)
            failpoints.point("sink.written")
        except BaseException:
            self._discard(adds)  # the task fails: its files are nobody's
            raise
        return FilesWritten([a.to_json() for a in adds], ranges)

    def _write_held(self, held: list[pa.RecordBatch], adds: list[Add], ranges: dict[str, FeedRange]) -> None:
        data = conform(pa.Table.from_batches(held), self.schema)
        adds.extend(
            write_files(
                self.storage(),
                self.schema,
                self.partition_columns,
                data,
                self.clock.now_ms(),
                lambda: str(uuid.uuid4()),
                self.write_options,
            )
        )
        for k, r in feed_ranges(data).items():
            ranges[k] = ranges[k].merge(r) if k in ranges else r

    # the committing worker

    def commit(self, messages: Sequence[FilesWritten | None], batch_id: int | None = None) -> CommitResult | None:
        adds = [Add.from_json(d) for m in messages if m is not None for d in m.adds]
        ranges: dict[str, FeedRange] = {}
        for m in messages:
            for k, r in (m.feeds if m is not None else {}).items():
                ranges[k] = ranges[k].merge(r) if k in ranges else r
        app_version = batch_id if batch_id is not None else self.app_version
        if not adds and not self.overwrite:
            return None
        table = self.open(self.clock)
        stale = self.handle is not None  # a job's handle starts from what it last read or committed
        try:
            try:
                result = self._commit_on(table, adds, ranges, app_version, batch_id, refresh=not stale)
            except (ConcurrentModification, Unsupported) as e:
                if not stale:
                    raise
                # What the handle held was decided on a state the table has left (a property, the
                # protocol, ICT or the owner changed since this job's last commit: hours, for a
                # quiet stream): nothing was committed, so the commit is made again on the latest
                # state, as DeltaTable.append does, if its files still fit the table's schema.
                result = self._commit_on(table, adds, ranges, app_version, batch_id, refresh=True, after=e)
        except Conflict:
            self._discard(adds)  # definitely not committed: the files are nobody's
            raise
        if result.skipped:
            self._discard(adds)
            _forget(table, ranges, self.clock)  # a rerun after a crash between the two commits finishes it
            return result
        failpoints.point("sink.committed")
        # The commit has landed. Its checkpoint, log cleanup and compaction are upkeep: a failure is
        # a warning (the next commit or `maintain` does it). A forget's rewrite is not: the job
        # fails with its error so that it is rerun, and the rerun (its commit found landed) finishes
        # the rewrite; a caller that retries keeps this commit's files (`abort`: the claims landed).
        _after_landing(_maintain, table, result)
        _forget(table, ranges, self.clock)
        _compact(table)
        return result

    def _commit_on(
        self,
        table: DeltaTable,
        adds: list[Add],
        ranges: Mapping[str, FeedRange],
        app_version: int | None,
        batch_id: int | None,
        *,
        refresh: bool,
        after: FeedlogError | None = None,
    ) -> CommitResult:
        """One commit of `adds` claiming `ranges`, on the handle's state (`refresh` False: anything
        newer is rebased over and the claims re-checked there) or the latest. `after`: the error of an
        attempt on a stale state, raised again if the latest state's schema no longer takes the files."""
        op = "STREAMING UPDATE" if batch_id is not None else "WRITE"
        tx = table.transaction(op, refresh=refresh)
        if after is not None and not Snapshot(table.storage, tx.base).schema.equals(self.schema):
            raise after  # the files were written for the schema the table had: they no longer fit
        if self.app_id is not None and app_version is not None:
            done = tx.base.txns.get(self.app_id)
            if done is not None and done.version >= app_version:
                return CommitResult(None, skipped=True)  # Delta's idempotent writer: the marker says it is done
            tx.set_txn(self.app_id, app_version, since=app_version - 1)
        # Each feed's rows are a claim on its seqs (see transaction.py): the commit is skipped if
        # the table already holds them all, refused if it holds part, checked again on every rebase.
        for k, r in ranges.items():
            tx.set_txn(app_id(k), r.last + 1, since=r.first)
        tx.add_files(adds)
        if self.overwrite:
            tx.reads_whole_table = True
            tx.remove_files(tx.base.files.values())
            tx.operation_parameters = {"mode": "Overwrite"}
        elif batch_id is not None:
            tx.operation_parameters = {"outputMode": "Append", "epochId": str(batch_id)}
        else:
            tx.operation_parameters = {"mode": "Append"}
        if ranges:
            tx.info_extra["feedlog"] = {"feeds": [_provenance(k, r) for k, r in sorted(ranges.items())]}
            if self.job_id:
                tx.info_extra["feedlog"]["job"] = self.job_id
            if self.witnesses:  # issue 40: {feed key: [{witness, length, tree_hash}]} that agreed
                tx.info_extra["feedlog"]["witnesses"] = json.loads(self.witnesses)
        failpoints.point("sink.before_commit")
        return table.commit(tx)

    def _discard(self, adds: Sequence[Add]) -> None:
        storage = self.storage()
        for a in adds:
            with contextlib.suppress(OSError, FeedlogError):
                storage.delete(urllib.parse.unquote(a.path))

    def abort(self, messages: Sequence[FilesWritten | None]) -> None:
        """Remove the job's files, except any a commit may hold: Spark aborts after a committing
        worker died too, and that worker may have committed (or staged a commit the owner will
        still ratify) before dying. Those files are kept; unreferenced ones are vacuum's."""
        adds = [Add.from_json(d) for m in messages if m is not None for d in m.adds]
        if not adds:
            return
        ranges = {k: r for m in messages if m is not None for k, r in m.feeds.items()}
        try:
            t = self.open()
            snap = t.snapshot()
            if ranges and all((snap.txn_version(app_id(k)) or 0) > r.last for k, r in ranges.items()):
                # The table holds these seqs: this batch's commit may be the one that landed them (a
                # commit whose answer was lost), and its files may be compacted away from the live
                # set already while a version inside the retention still reads them: keep them all
                # (any that are nobody's are vacuum's).
                return
            held = {a.path for a in snap.files()}
        except TableNotFound:
            held = set()
        staged = staged_data_paths(self.storage())
        if staged is not None:  # None: a staged commit could not be read, so it may hold any of them
            held |= staged
            self._discard([a for a in adds if a.path not in held])


def _provenance(key: str, r: FeedRange) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "from": r.first, "to": r.last + 1, "rows": r.rows}
    if r.signed is not None:
        out["signed"] = r.signed
    return out


def settle(table: DeltaTable, version: int) -> bool:
    """Have the table's owner backfill through `version` before the job reports it landed.

    A served owner acknowledges a commit once it is ratified and backfills it in the background
    (managed commits allow it: readers that know the owner ask it for the rest). Readers that do
    not (delta-rs, DuckDB, an engine without managed commits) read `_delta_log/` alone, so a job
    ends with its own commit there: what it reports as landed, every reader sees. The commit is
    already durable, so an owner that cannot be reached now is a warning, not a failed job.
    Returns whether `version` is in `_delta_log/`.
    """
    try:
        table.backfill(version)
    except FeedlogError as e:
        warnings.warn(f"committed version {version}, but its backfill to _delta_log is pending: {e}", stacklevel=2)
        return False
    return True


def _forget(table: DeltaTable, ranges: Mapping[str, FeedRange], clock: Clock) -> None:
    """Tombstones for the rows the forget entries among `ranges` withdraw (lake/forget.py), in the
    commit after the one that landed them."""
    forgets = [Forget(feed, key, seq) for feed, r in ranges.items() for key, seq in r.forgets]
    if forgets:
        after_commit(table, forgets, clock)


#: the table property that turns off the log cleanup after each checkpoint (delta-spark's; default on)
EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"


def _maintain(table: DeltaTable, result: CommitResult) -> None:
    if result.version is None:
        return
    if not settle(table, result.version):
        return  # a checkpoint needs its version in _delta_log: this one is skipped (readers replay commits)
    # the committed state's properties: no read of the table after each commit
    state = result.state
    conf = state.metadata.configuration if state is not None and state.metadata else table.snapshot().properties
    try:
        every = int(conf.get(CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL))
    except ValueError:
        every = DEFAULT_CHECKPOINT_INTERVAL
    if every > 0 and result.version % every == 0:
        table.checkpoint(result.version)
        # metadata cleanup after each checkpoint, unless the table turns it off (delta-spark's rule)
        if conf.get(EXPIRED_LOG_CLEANUP, "true").strip().lower() != "false":
            table.cleanup()


def _after_landing(step: Callable[..., Any], *args: Any) -> None:
    """A post-commit upkeep step (checkpoint and log cleanup) run after a commit landed: its failure
    is a warning, never the commit's (`maintain` and the next commit do it)."""
    try:
        step(*args)
    except FeedlogError as e:
        warnings.warn(f"committed; {step.__name__.lstrip('_')} deferred: {e}", stacklevel=3)


def _compact(table: DeltaTable) -> None:
    """Auto-compaction after the commit (delta-spark's post-commit hook; `DeltaTable.auto_compact`),
    after the forget rewrite so it compacts the rewritten files. The commit has landed: a compaction
    that fails or loses a race is a warning, and the next commit tries again."""
    try:
        r = table.auto_compact(refresh=False)  # decided on the state just committed: no extra read
        if r is not None and r.version is not None:
            settle(table, r.version)
    except Exception as e:  # never fail a commit that landed
        warnings.warn(f"auto-compaction deferred to a later commit: {type(e).__name__}: {e}", stacklevel=2)


def _ours(messages: Sequence[WriterCommitMessage | None]) -> list[FilesWritten | None]:
    return [m if isinstance(m, FilesWritten) else None for m in messages]


class DeltaBatchWriter(DataSourceArrowWriter):
    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return self.config.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.config.commit(_ours(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.config.abort(_ours(messages))


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return self.config.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.config.commit(_ours(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.config.abort(_ours(messages))


@marked(DeltaBatchWriter, DeltaStreamWriter)  # a feedlog error reaches the driver as itself
class DeltaSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DeltaBatchWriter:
        return DeltaBatchWriter(SinkConfig.prepare(self.options, schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DeltaStreamWriter:
        if overwrite:
            raise InvalidArgument("the feedlog-delta sink appends: use outputMode append")
        return DeltaStreamWriter(SinkConfig.prepare(self.options, schema, overwrite, streaming=True))

    # reading: spark.read / spark.readStream.format("feedlog-delta"), see delta_source.py

    def _access(self) -> Any:
        from .delta_source import Access

        return Access(table_location, storage_options_in, open_table)  # this module's rules, by name

    def schema(self) -> StructType:
        from .delta_source import table_schema

        return table_schema(self.options, self._access())

    def reader(self, schema: StructType) -> DataSourceReader:
        from .delta_source import batch_reader

        return batch_reader(self.options, self._access())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .delta_source import stream_reader

        return stream_reader(self.options, self._access())


__all__ = ["FORMAT", "DeltaSink", "FeedRange", "FilesWritten", "SinkConfig", "TableRef", "app_id"]
