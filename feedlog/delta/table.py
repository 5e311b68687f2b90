"""`DeltaTable`: create, append exactly once, time travel, history, checkpoint, cleanup.

Components (storage, committer, clock, id source) are passed in; everything
else is read from the log. Nothing here is cached across calls except what a
`Snapshot` holds, so two tables objects (or processes) on one location are safe.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..clock import Clock, SystemClock
from ..errors import AlreadyExists, Conflict, Corruption, InvalidArgument, NotFound, Unavailable
from .actions import (
    ENABLE_ICT,
    ICT,
    MANAGED_COMMITS,
    OWNER_CONF,
    OWNER_NAME,
    Action,
    Add,
    Metadata,
    Protocol,
    decode_commit,
    encode_commit,
)
from .committer import CommitResponse, Committed, Committer, FilesystemCommitter, commit_path
from .log import (
    Listing,
    TableNotFound,
    commits_after,
    list_log,
    load_protocol_metadata,
    load_state,
    read_commit,
)
from .managed.committer import ManagedCommitter, resolve_owner
from .managed.protocol import (
    OWNER_ENV,
    Auth,
    Binding,
    OwnerNotConsulted,
    OwnerNotTrusted,
    TableRef,
    TableStatus,
    default_token,
    is_embedded,
    is_trusted,
    new_token,
    trusted_owners,
)
from .managed.staged import COMMITS_DIR, staged_version
from .parquet import read_parquet
from .replay import IctEnablement, TableState, check_writable, ict_enabled, ict_enablement
from .schema import from_schema_string, to_schema_string
from .storage import FileInfo, LocalStorage, Storage
from .timeline import HistoryEntry, Timeline, last_at_or_before, missing_ict
from .transaction import CommitResult, Transaction, protocol_for_new_table
from .writer import WriteOptions, write_files

_FILESYSTEM = FilesystemCommitter()


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

    def domain_metadata(self) -> dict[str, str]:
        """Each live metadata domain's configuration (feedlog keeps them; it interprets none)."""
        return {d: m.configuration for d, m in sorted(self.state.domains.items())}

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
        owner_token: str | None = None,
        owner_tls: Any = None,
        owner: Binding | str | Sequence[Binding | str] | None = None,
        clock: Clock | None = None,
        new_id: Callable[[], str] | None = None,
        max_commit_attempts: int = 100,
    ) -> None:
        self.storage: Storage = LocalStorage(storage) if isinstance(storage, (str, os.PathLike)) else storage
        #: a committer that decides every commit (tests); by default the table's metadata decides:
        #: put-if-absent for filesystem tables, the commit owner it names for managed ones
        self.fixed_committer = committer
        #: the managed table's token (default $FEEDLOG_OWNER_TOKEN); creating or converting a table
        #: without one makes a new one here, which writers then need
        self.owner_token = owner_token if owner_token is not None else default_token()
        self.owner_tls = owner_tls
        #: the commit owners this object may talk to (default $FEEDLOG_OWNER); see managed.py "Trust"
        self.trusted_owners: list[Binding] = list(trusted_owners(owner))
        self._warned: set[tuple[Binding, str]] = set()
        self._managed_committers: dict[tuple[Binding, str], ManagedCommitter] = {}
        self.clock: Clock = clock or SystemClock()
        self.new_id: Callable[[], str] = new_id or (lambda: str(uuid.uuid4()))
        self.max_commit_attempts = max_commit_attempts
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
        owner: Binding | str | None = None,
        **components: Any,
    ) -> DeltaTable:
        """A new table at `location`; in-commit timestamps are on unless turned off.

        With `owner` (a `Binding`, 'grpc://HOST:PORT' or a SQLite file for the
        in-process owner) the table is managed: the owner writes commit 0
        put-if-absent and ratifies every later commit.
        """
        table = cls(location, **components)
        try:
            list_log(table.storage)
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
        if owner is not None:
            if not in_commit_timestamps:
                raise InvalidArgument("a managed table needs in-commit timestamps")
            binding = Binding.parse(owner) if isinstance(owner, str) else owner
            props.update(binding.properties())
            table.trusted_owners.append(binding)  # the owner it is created with is the one it trusts
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
        check_writable(txn.new_protocol)
        actions, _ = txn.plan(TableState(), now)
        response = table._commit(TableState(), 0, actions)
        if not isinstance(response, Committed):
            raise AlreadyExists(f"a Delta table was created concurrently at {table.storage.location}")
        return table

    @classmethod
    def open(cls, location: Storage | str | os.PathLike[str], **components: Any) -> DeltaTable:
        """An existing table; TableNotFound (a NotFound) if there is none.

        `owner=` names the commit owner(s) to trust (a `Binding`, 'grpc://HOST:PORT' or a database
        file, or several; default $FEEDLOG_OWNER): a managed table whose owner is not among them is
        read from its backfilled log, with an `OwnerNotConsulted` warning, and cannot be written.
        """
        table = cls(location, **components)
        # the log alone: opening asks no owner (a writer's first read does; a reader's asks a trusted one)
        load_protocol_metadata(table.storage, list_log(table.storage))
        return table

    # reading

    # which committer

    def committer_for(self, protocol: Protocol | None, metadata: Metadata | None) -> Committer:
        """Who decides commits after a version with this protocol and metadata (a writer's question:
        OwnerNotTrusted if it is an owner this object may not talk to)."""
        if self.fixed_committer is not None:
            return self.fixed_committer
        binding = Binding.of(protocol, metadata)
        if binding is None or metadata is None:
            return _FILESYSTEM
        return self._managed(binding, metadata.id)

    def trusts(self, binding: Binding, write: bool) -> bool:
        """May this object talk to `binding`? Writers also trust the table's own embedded owner."""
        if is_trusted(binding, self.trusted_owners):
            return True
        return write and is_embedded(binding, self.storage.location)

    def _ratified(
        self, protocol: Protocol | None, metadata: Metadata | None, start: int, write: bool
    ) -> list[tuple[int, FileInfo]]:
        """Commits >= start the owner ratified and has not backfilled.

        A reader asks only an owner it trusts and reads without one when it is untrusted or
        unreachable (a warning says so); a writer needs the owner (OwnerNotTrusted, Unavailable).
        """
        if self.fixed_committer is not None:
            return self.fixed_committer.ratified_commits(self.storage, start)
        binding = Binding.of(protocol, metadata)
        if binding is None or metadata is None:
            return []
        if not write and not self.trusts(binding, write=False):
            if self._staged_from(start):
                self._warn(binding, "untrusted")
            return []
        committer = self._managed(binding, metadata.id)
        if write:
            return committer.ratified_commits(self.storage, start)
        try:
            return committer.ratified_commits(self.storage, start)
        except Unavailable as e:
            if self._staged_from(start):
                self._warn(binding, f"unreachable ({e})")
            return []

    def _staged_from(self, start: int) -> bool:
        """Whether a staged commit of version >= start exists. Without one the owner cannot hold a
        ratified, unbackfilled commit (a writer stages before the owner ratifies), so a reader that
        skips the owner misses nothing and need not be warned."""
        names = (f.path.rpartition("/")[2] for f in self.storage.list(COMMITS_DIR, stat=False))
        return any(v is not None and v >= start for v in map(staged_version, names))

    def _warn(self, binding: Binding, why: str) -> None:
        key = (binding, why.split(" ", 1)[0])
        if key in self._warned:
            return
        self._warned.add(key)
        if why == "untrusted":
            reason = (
                f"it is not one this process trusts (pass owner=, --owner or ${OWNER_ENV} to ask it); "
                "nothing a table names is opened without that"
            )
        else:
            reason = f"it is {why}"
        warnings.warn(
            f"{self.storage.location}: reading the backfilled log only, without commit owner "
            f"{binding.describe()}: {reason}; commits it ratified but has not backfilled are not seen",
            OwnerNotConsulted,
            stacklevel=4,
        )

    def _managed(self, binding: Binding, table_id: str) -> ManagedCommitter:
        if not self.trusts(binding, write=True):
            raise OwnerNotTrusted(
                f"{self.storage.location} is managed by commit owner {binding.describe()}, which is not one "
                f"this process trusts: writing needs it; pass owner={binding.describe()!r} "
                f"(CLI: --owner, or ${OWNER_ENV}) if it is the table's owner"
            )
        key = (binding, table_id)
        committer = self._managed_committers.get(key)
        if committer is None:
            ref = TableRef(table_id, self.storage.location)
            committer = ManagedCommitter(resolve_owner(binding, self.owner_tls), ref, Auth(self.owner_token))
            self._managed_committers[key] = committer
        return committer

    def _commit(self, base: TableState, version: int, actions: Sequence[Action]) -> CommitResponse:
        """Hand version `version` to whoever decides it; ownership changes go to the owner's
        register (create, filesystem -> managed) or release (managed -> filesystem)."""
        data = encode_commit(actions)
        if self.fixed_committer is not None:
            return self.fixed_committer.commit(self.storage, version, data, actions)
        protocol = next((a for a in actions if isinstance(a, Protocol)), base.protocol)
        metadata = next((a for a in actions if isinstance(a, Metadata)), base.metadata)
        before = Binding.of(base.protocol, base.metadata)
        try:
            after = Binding.of(protocol, metadata)
        except Corruption as e:
            raise InvalidArgument(f"this commit would make the table invalid ({e}); use convert_to_managed") from None
        if before is None and after is None:
            return _FILESYSTEM.commit(self.storage, version, data, actions)
        assert metadata is not None
        if before is None:
            assert after is not None
            if self.owner_token is None:
                self.owner_token = new_token()
            committer = self._managed(after, metadata.id)
            committer.auth = Auth(self.owner_token)
            return committer.register(self.storage, version, data, actions, after.batch_size)
        assert base.metadata is not None
        if after is None:
            return self._managed(before, base.metadata.id).release(self.storage, version, data, actions)
        if after != before or metadata.id != base.metadata.id:
            raise InvalidArgument(
                "a managed table's commit owner is changed in two steps: convert it to a filesystem table, "
                "then to the new owner"
            )
        return self._managed(before, base.metadata.id).commit(self.storage, version, data, actions)

    # reading

    def _listing(self, stat: bool = False, write: bool = False) -> Listing:
        """The backfilled log plus, for a managed table, the ratified commits its owner still holds
        (a reader's: only from a trusted, reachable owner; see `_ratified`)."""
        for _ in range(10):
            fs = list_log(self.storage, stat=stat)
            protocol, metadata = load_protocol_metadata(self.storage, fs)
            ratified = self._ratified(protocol, metadata, fs.latest + 1, write)
            if not ratified or ratified[0][0] == fs.latest + 1:
                return Listing({**fs.commits, **dict(ratified)}, fs.checkpoints)
            # the owner backfilled and forgot commits between the listing and its answer: list again
        raise Unavailable(f"the log of {self.storage.location} kept changing while it was being listed")

    def _latest(self, write: bool = False) -> TableState:
        """The latest state, read incrementally: only the commits after the last state seen here."""
        cached = self._cache
        state = self._catch_up(cached, write=write) if cached is not None else None
        if state is None:
            state = load_state(self.storage, self._listing(write=write))
        self._cache = state
        return state

    def _catch_up(
        self, cached: TableState, check: Callable[[int, list[Action]], None] | None = None, write: bool = False
    ) -> TableState | None:
        """`cached` plus the commits after it (backfilled, then the owner's); None if that cannot be done.

        `check` sees each newer commit before it is applied (a rebasing transaction's conflict check).
        """
        state = cached
        for step in ("backfilled", "ratified"):
            if step == "backfilled":
                newer = commits_after(self.storage, state.version)
            else:
                newer = dict(self._ratified(state.protocol, state.metadata, state.version + 1, write))
            versions = sorted(newer)
            if versions != list(range(state.version + 1, state.version + 1 + len(versions))):
                return None  # a gap: cleaned up or backfilled meanwhile; read afresh
            if versions:
                state = state.copy() if state is cached else state
                partial = Listing(newer, {})
                for v in versions:
                    actions = read_commit(self.storage, partial, v)
                    if check is not None:
                        check(v, actions)
                    state.apply(v, actions)
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
        return Timeline(self.storage, listing, ict_enablement(protocol, metadata), lambda: self._listing(stat=True))

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        return self._timeline(self._listing()).history(limit)

    def version_at(self, timestamp_ms: int) -> int:
        """The newest version committed at or before `timestamp_ms` (ICT reader rules)."""
        state = self._latest()
        e = ict_enablement(state.protocol, state.metadata)
        in_ict_range = e is not None and (e.timestamp is None or timestamp_ms >= e.timestamp)
        filesystem = self.fixed_committer is None and Binding.of(state.protocol, state.metadata) is None
        if in_ict_range and (filesystem or isinstance(self.fixed_committer, FilesystemCommitter)):
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
        """A write on the latest state; Unsupported at once, before any data file is written,
        if the table has a feature feedlog cannot honour when writing (TTL compaction, the sink)."""
        base = self._latest(write=True)
        assert base.protocol is not None
        check_writable(base.protocol)
        return Transaction(self, base, operation)

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
        check_writable(snapshot.protocol)
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

    # managed commits

    def owner(self) -> Binding | None:
        """The commit owner the table names, None for a filesystem table."""
        s = self._latest()
        return Binding.of(s.protocol, s.metadata)

    def convert_to_managed(self, owner: Binding | str) -> CommitResult:
        """Hand the table to a commit owner (turning on in-commit timestamps if they are off).

        The owner ratifies the ownership commit and writes it put-if-absent; if a
        filesystem writer takes that version first the transaction rebases and retries.
        """
        binding = Binding.parse(owner) if isinstance(owner, str) else owner
        tx = self.transaction("SET TBLPROPERTIES")
        self.trusted_owners.append(binding)  # the owner it is handed to is the one it trusts
        current = Binding.of(tx.base.protocol, tx.base.metadata)
        if current is not None:
            raise InvalidArgument(f"the table is already managed by commit owner {current.describe()}")
        props = binding.properties()
        if not ict_enabled(tx.base.protocol, tx.base.metadata):
            tx.protocol_features.append(ICT)
            props[ENABLE_ICT] = "true"
        tx.protocol_features.append(MANAGED_COMMITS)
        tx.operation_parameters = {"properties": props}
        tx.set_properties(props)
        return tx.commit()

    def convert_to_filesystem(self) -> CommitResult:
        """Take the table back from its owner: it backfills everything, then the owner-removing commit."""
        tx = self.transaction("SET TBLPROPERTIES")
        if Binding.of(tx.base.protocol, tx.base.metadata) is None:
            raise InvalidArgument("the table is not managed by a commit owner")
        tx.removed_features.append(MANAGED_COMMITS)
        tx.operation_parameters = {"properties": {}, "removed": [OWNER_NAME, OWNER_CONF]}
        tx.set_properties({OWNER_NAME: None, OWNER_CONF: None})
        return tx.commit()

    def backfill(self, version: int | None = None) -> int:
        """Have the owner copy ratified commits (all, or through `version`) to `_delta_log/<v>.json`."""
        state = self._latest(write=True)
        committer = self.committer_for(state.protocol, state.metadata)
        if not isinstance(committer, ManagedCommitter):
            return max(list_log(self.storage).commits)  # a filesystem table is always fully backfilled
        return committer.backfill(version)

    def owner_status(self) -> TableStatus | None:
        state = self._latest(write=True)  # asks the owner: only one this object trusts
        committer = self.committer_for(state.protocol, state.metadata)
        if not isinstance(committer, ManagedCommitter):
            return None
        return committer.owner.status(committer.table.table_id, committer.auth)

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
            "backfilled_version": max(list_log(self.storage).commits),
            "commit_owner": None if (b := Binding.of(s.protocol, s.metadata)) is None else b.config,
        }


__all__ = ["CommitResult", "DeltaTable", "Snapshot", "TableNotFound"]
