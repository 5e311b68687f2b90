"""`DeltaTable`: create, append exactly once, time travel, history, checkpoint, cleanup.

Components (storage, committer, clock, id source) are passed in; everything
else is read from the log. Nothing here is cached across calls except what a
`Snapshot` holds, so two tables objects (or processes) on one location are safe.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..clock import Clock, SystemClock
from ..errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from .actions import ENABLE_ICT, ICT, Add, Metadata, Protocol, decode_commit, encode_commit
from .committer import Committed, Committer, FilesystemCommitter, commit_path
from .log import (
    Listing,
    TableNotFound,
    commits_after,
    list_log,
    load_protocol_metadata,
    load_state,
    read_commit,
)
from .parquet import read_parquet
from .replay import IctEnablement, TableState, check_writable, ict_enabled, ict_enablement
from .schema import from_schema_string, to_schema_string
from .storage import LocalStorage, Storage
from .timeline import HistoryEntry, Timeline, last_at_or_before, missing_ict
from .transaction import CommitResult, Transaction, protocol_for_new_table
from .writer import WriteOptions, write_files


class Snapshot:
    """The table at one version: read-only, self-contained."""

    def __init__(self, storage: Storage, state: TableState) -> None:
        assert state.protocol is not None and state.metadata is not None
        self.storage = storage
        self.state = state
        self.protocol: Protocol = state.protocol
        self.metadata: Metadata = state.metadata
        self.schema: pa.Schema = from_schema_string(state.metadata.schema_string)

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.metadata.configuration)

    @property
    def in_commit_timestamp(self) -> int | None:
        return self.state.ict

    @property
    def ict_enabled(self) -> bool:
        return ict_enabled(self.protocol, self.metadata)

    def files(self) -> list[Add]:
        return sorted(self.state.files.values(), key=lambda a: a.path)

    def num_records(self) -> int | None:
        """Total rows from file stats; None if a file has no numRecords."""
        total = 0
        for a in self.state.files.values():
            n = a.num_records()
            if n is None:
                return None
            total += n
        return total

    def txn_version(self, app_id: str) -> int | None:
        """The last committed `txn` version of `app_id` (exactly-once bookkeeping), None if never."""
        t = self.state.txns.get(app_id)
        return None if t is None else t.version

    def to_arrow(self) -> pa.Table:
        """All rows of this version, partition columns restored, in schema order."""
        tables = []
        for add in self.files():
            data = self.storage.read(urllib.parse.unquote(add.path))
            t = read_parquet(data)
            cols = []
            for f in self.schema:
                if f.name in add.partition_values:
                    raw = add.partition_values[f.name]
                    text = pa.array([None if raw == "" else raw] * t.num_rows, pa.string())
                    cols.append(text.cast(f.type))
                elif f.name in t.column_names:
                    c = t.column(f.name)
                    cols.append(c if c.type == f.type else c.cast(f.type))
                else:
                    cols.append(pa.nulls(t.num_rows, f.type))
            tables.append(pa.Table.from_arrays(cols, schema=self.schema))
        return pa.concat_tables(tables) if tables else self.schema.empty_table()


class DeltaTable:
    def __init__(
        self,
        storage: Storage | str | os.PathLike[str],
        *,
        committer: Committer | None = None,
        clock: Clock | None = None,
        new_id: Callable[[], str] | None = None,
        max_commit_attempts: int = 100,
        extra_writer_features: Iterable[str] = (),
    ) -> None:
        self.storage: Storage = LocalStorage(storage) if isinstance(storage, (str, os.PathLike)) else storage
        self.committer: Committer = committer or FilesystemCommitter()
        self.clock: Clock = clock or SystemClock()
        self.new_id: Callable[[], str] = new_id or (lambda: str(uuid.uuid4()))
        self.max_commit_attempts = max_commit_attempts
        #: writer features a wrapping layer implements (e.g. managed commits)
        self.extra_writer_features = tuple(extra_writer_features)
        #: the newest state this object has seen; never mutated, only replaced
        self._cache: TableState | None = None

    # lifecycle

    @classmethod
    def create(
        cls,
        location: Storage | str | os.PathLike[str],
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        name: str | None = None,
        description: str | None = None,
        in_commit_timestamps: bool = True,
        **components: Any,
    ) -> DeltaTable:
        """A new table at `location`; in-commit timestamps are on unless turned off."""
        table = cls(location, **components)
        try:
            list_log(table.storage, table.committer)
            raise AlreadyExists(f"a Delta table already exists at {table.storage.location}")
        except TableNotFound:
            pass
        missing = [c for c in partition_by if c not in schema.names]
        if missing:
            raise InvalidArgument(f"partition columns not in the schema: {missing}")
        if len(partition_by) == len(schema.names):
            raise InvalidArgument("a table needs at least one column that is not a partition column")
        props = dict(properties or {})
        if in_commit_timestamps:
            props[ENABLE_ICT] = "true"
        now = table.clock.now_ms()
        txn = Transaction(table, TableState(), "CREATE TABLE")
        txn.operation_parameters = {"partitionBy": list(partition_by), "properties": props}
        txn.new_protocol = protocol_for_new_table(props)
        txn.new_metadata = Metadata(
            id=table.new_id(),
            schema_string=to_schema_string(schema),
            partition_columns=tuple(partition_by),
            configuration=props,
            created_time=now,
            name=name,
            description=description,
        )
        check_writable(txn.new_protocol, table.extra_writer_features)
        actions, _ = txn.plan(TableState(), now)
        response = table.committer.commit(table.storage, 0, encode_commit(actions), actions)
        if not isinstance(response, Committed):
            raise AlreadyExists(f"a Delta table was created concurrently at {table.storage.location}")
        return table

    @classmethod
    def open(cls, location: Storage | str | os.PathLike[str], **components: Any) -> DeltaTable:
        """An existing table; TableNotFound (a NotFound) if there is none."""
        table = cls(location, **components)
        table._listing()
        return table

    # reading

    def _listing(self) -> Listing:
        return list_log(self.storage, self.committer)

    def _latest(self) -> TableState:
        """The latest state, read incrementally: only the commits after the last state seen here."""
        cached = self._cache
        if cached is not None:
            newer = commits_after(self.storage, self.committer, cached.version)
            versions = sorted(newer)
            if versions == list(range(cached.version + 1, cached.version + 1 + len(versions))):
                if not versions:
                    return cached
                state = cached.copy()
                partial = Listing(newer, {})
                for v in versions:
                    state.apply(v, read_commit(self.storage, partial, v))
                self._cache = state
                return state
        state = load_state(self.storage, self._listing())
        self._cache = state
        return state

    def snapshot(self, version: int | None = None, *, timestamp_ms: int | None = None) -> Snapshot:
        """The latest snapshot, or the one `as of version` / `as of timestamp` (ms since the epoch)."""
        if version is not None and timestamp_ms is not None:
            raise InvalidArgument("give a version or a timestamp, not both")
        if version is None and timestamp_ms is None:
            return Snapshot(self.storage, self._latest())
        listing = self._listing()
        if timestamp_ms is not None:
            version = self._timeline(listing).version_at(timestamp_ms)
        return Snapshot(self.storage, load_state(self.storage, listing, version))

    def version(self) -> int:
        return self._latest().version

    def to_arrow(self, version: int | None = None, *, timestamp_ms: int | None = None) -> pa.Table:
        return self.snapshot(version, timestamp_ms=timestamp_ms).to_arrow()

    def txn_version(self, app_id: str) -> int | None:
        return self.snapshot().txn_version(app_id)

    def _timeline(self, listing: Listing) -> Timeline:
        protocol, metadata = load_protocol_metadata(self.storage, listing)
        return Timeline(self.storage, self.committer, listing, ict_enablement(protocol, metadata))

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        return self._timeline(self._listing()).history(limit)

    def version_at(self, timestamp_ms: int) -> int:
        """The newest version committed at or before `timestamp_ms` (ICT reader rules)."""
        state = self._latest()
        e = ict_enablement(state.protocol, state.metadata)
        in_ict_range = e is not None and (e.timestamp is None or timestamp_ms >= e.timestamp)
        if in_ict_range and isinstance(self.committer, FilesystemCommitter):
            assert e is not None
            found = self._ict_version_at(e.version, state.version, timestamp_ms)
            if found is not None:
                return found
        # file times, or an answer near the retained log's start: the listing-based timeline
        return self._timeline(self._listing()).version_at(timestamp_ms)

    def _ict_version_at(self, lo: int, hi: int, timestamp_ms: int) -> int | None:
        """Binary search of ICTs without listing the log: O(log n) commit reads.

        Cleanup removes a prefix of the log, so a missing commit file counts as
        "earlier than everything retained"; None if the answer is not retained.
        """
        missing = -(2**63)

        def ict_of(v: int) -> int:
            try:
                actions = decode_commit(self.storage.read(commit_path(v)), v)
            except NotFound:
                return missing
            info = TableState.commit_info_of(actions)
            if info is None or info.in_commit_timestamp is None:
                missing_ict(v, lo)
            return info.in_commit_timestamp

        try:
            v = last_at_or_before(lo, hi, ict_of, timestamp_ms)
        except NotFound:
            return None
        return None if ict_of(v) == missing else v

    def ict_enablement(self) -> IctEnablement | None:
        s = self.snapshot()
        return ict_enablement(s.protocol, s.metadata)

    # writing

    def transaction(self, operation: str = "WRITE") -> Transaction:
        return Transaction(self, self._latest(), operation)

    def write_files(self, data: pa.Table | pa.RecordBatch, snapshot: Snapshot | None = None) -> list[Add]:
        """Write data files for `data` without committing them (what executors do)."""
        s = snapshot or self.snapshot()
        opts = WriteOptions.from_properties(s.metadata.configuration)
        return write_files(self.storage, s.schema, s.partition_columns, data, self.clock.now_ms(), self.new_id, opts)

    def append(
        self,
        data: pa.Table | pa.RecordBatch,
        *,
        txn: tuple[str, int] | None = None,
        mode: str = "append",
    ) -> CommitResult:
        """Commit `data` as one version; with `txn=(appId, version)` exactly once.

        If the table already holds a txn version >= `version` for appId, nothing is
        written and the result says `skipped`. `mode="overwrite"` replaces all rows.
        """
        if mode not in ("append", "overwrite"):
            raise InvalidArgument(f"mode must be 'append' or 'overwrite', not {mode!r}")
        tx = self.transaction("WRITE")
        if txn is not None:
            done = tx.base.txns.get(txn[0])
            if done is not None and done.version >= txn[1]:
                return CommitResult(None, skipped=True)
            tx.set_txn(*txn)
        snapshot = Snapshot(self.storage, tx.base)
        check_writable(snapshot.protocol, self.extra_writer_features)
        tx.operation_parameters = {"mode": mode.capitalize(), "partitionBy": list(snapshot.partition_columns)}
        adds = self.write_files(data, snapshot)
        tx.add_files(adds)
        if mode == "overwrite":
            tx.reads_whole_table = True
            tx.remove_files(snapshot.files())
        try:
            return tx.commit()
        except Conflict:
            # Definitely not committed, so the files are unreferenced: remove them now rather than at
            # vacuum. Any other failure (I/O, interrupt) may have committed them; they stay.
            for a in adds:
                self.storage.delete(urllib.parse.unquote(a.path))
            raise

    def set_properties(self, updates: Mapping[str, str | None]) -> CommitResult:
        tx = self.transaction("SET TBLPROPERTIES")
        tx.operation_parameters = {"properties": {k: v for k, v in updates.items() if v is not None}}
        tx.set_properties(updates)
        return tx.commit()

    def enable_ict(self) -> CommitResult:
        """Turn on in-commit timestamps for an existing table (a no-op commit if already on)."""
        tx = self.transaction("SET TBLPROPERTIES")
        if ict_enabled(tx.base.protocol, tx.base.metadata):
            return CommitResult(None, tx.base.ict, skipped=True)
        tx.operation_parameters = {"properties": {ENABLE_ICT: "true"}}
        tx.protocol_features.append(ICT)
        tx.set_properties({ENABLE_ICT: "true"})
        return tx.commit()

    # maintenance (see maintenance.py)

    def checkpoint(self, version: int | None = None) -> int:
        from .maintenance import write_checkpoint

        return write_checkpoint(self, version)

    def cleanup(self, retain_ms: int | None = None) -> list[str]:
        from .maintenance import cleanup_log

        return cleanup_log(self, retain_ms)

    def info(self) -> dict[str, Any]:
        s = self.snapshot()
        return {
            "location": self.storage.location,
            "version": s.version,
            "protocol": s.protocol.to_json(),
            "features": sorted(set(s.protocol.reader_features or ()) | set(s.protocol.writer_features or ())),
            "properties": s.properties,
            "partition_columns": list(s.partition_columns),
            "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in s.schema],
            "files": len(s.state.files),
            "rows": s.num_records(),
            "in_commit_timestamp": s.in_commit_timestamp,
        }


__all__ = ["CommitResult", "DeltaTable", "Snapshot", "TableNotFound"]
