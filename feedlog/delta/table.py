"""`DeltaTable`: create, append exactly once, time travel, history, checkpoint, cleanup.

Components (storage, committer, clock, id source) are passed in; everything
else is read from the log. Nothing here is cached across calls except what a
`Snapshot` holds, so two tables objects (or processes) on one location are safe.
(`log.load_latest` keeps each local table's latest state read in this process, and
reads the commits after it; it checks the log before each use: see `log._STATES`.)
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import pyarrow as pa

from ..clock import Clock, SystemClock
from ..errors import AlreadyExists, Conflict, FeedlogError, InvalidArgument, NotFound, Unsupported
from ..rpc import Tls
from .actions import ENABLE_ICT, ICT, MANAGED_COMMITS, OWNER_CONF, OWNER_NAME, Add, Metadata, Protocol
from .committer import Committer, FilesystemCommitter, commit_path
from .log import (
    Listing,
    Ratified,
    TableNotFound,
    catch_up,
    commit_bytes,
    list_log,
    list_log_tail,
    list_table,
    load_latest,
    load_protocol_metadata,
    load_state,
)
from .maintenance import cleanup_log, log_retention, write_checkpoint
from .managed.committer import ManagedCommitter, Router
from .managed.owners import Owners
from .managed.protocol import Binding, TableStatus
from .objectstore import open_storage
from .optimize import OptimizeResult, auto_compact_rule, needs_compaction, optimize
from .replay import IctEnablement, TableState, check_writable, ict_enabled, ict_enablement
from .snapshot import Snapshot
from .storage import Storage
from .timeline import HistoryEntry, Timeline, ict_version_at
from .transaction import DEFAULT_MAX_ATTEMPTS, CommitResult, Transaction
from .vacuum import VacuumCutoffs, VacuumResult, check_horizon, files_of, table_retention, vacuum
from .writer import write_files

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.12+; annotations only

_FILESYSTEM = FilesystemCommitter()


class Components(TypedDict, total=False):
    """What `DeltaTable` is built from besides its location (see `DeltaTable.__init__`)."""

    committer: Committer | None
    owner_token: str | None
    owner_tls: Tls | None
    clock: Clock | None
    new_id: Callable[[], str] | None
    max_commit_attempts: int
    storage_options: Mapping[str, str] | None


class DeltaTable:
    """A Delta table at one location: a façade over snapshots, transactions and maintenance.

    Components (storage, committer, clock, id source, the commit owners to trust) are passed in;
    everything else is read from the log. The only state kept across calls is the newest
    `TableState` seen, which each read catches up from, so two handles (or processes) on one
    location are safe.
    """

    def __init__(
        self,
        storage: Storage | str | os.PathLike[str],
        *,
        committer: Committer | None = None,
        owner_token: str | None = None,
        owner_tls: Tls | None = None,
        owner: Binding | str | Sequence[Binding | str] | None = None,
        clock: Clock | None = None,
        new_id: Callable[[], str] | None = None,
        max_commit_attempts: int = DEFAULT_MAX_ATTEMPTS,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        #: a path is a local directory; an object-store URL (s3://, gs://, az://, file://, memory://)
        #: is opened with `storage_options` (delta-rs's keys) and the environment; see objectstore.py
        self.storage: Storage = open_storage(storage, storage_options)
        #: a committer that decides every commit (tests); by default the table's metadata decides:
        #: put-if-absent for filesystem tables, the commit owner it names for managed ones
        self.fixed_committer = committer
        #: the commit owners this handle may talk to (default $FEEDLOG_OWNER) and the table's token
        #: (default $FEEDLOG_OWNER_TOKEN); see managed/owners.py
        self.owners = Owners(owner, owner_token, owner_tls)
        self.clock: Clock = clock or SystemClock()
        self.new_id: Callable[[], str] = new_id or (lambda: str(uuid.uuid4()))
        self.max_commit_attempts = max_commit_attempts
        #: the newest state this object has seen; never mutated, only replaced
        self._cache: TableState | None = None
        self._vacuum_cutoffs = VacuumCutoffs()  # the time-travel horizon's forced vacuums, read once
        #: the latest version, protocol and metadata `open` read: a fresh handle's time lookup starts
        #: from them (while no commit after that version has appeared) instead of loading a snapshot
        self._head: tuple[int, Protocol, Metadata] | None = None

    @property
    def owner_token(self) -> str | None:
        """The managed table's token; creating or converting a table without one makes one."""
        return self.owners.token

    @owner_token.setter
    def owner_token(self, token: str | None) -> None:
        self.owners.token = token

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
        **components: Unpack[Components],
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
        props = dict(properties or {})
        if in_commit_timestamps:
            props[ENABLE_ICT] = "true"
        if owner is not None:
            if not in_commit_timestamps:
                raise InvalidArgument("a managed table needs in-commit timestamps")
            binding = Binding.parse(owner) if isinstance(owner, str) else owner
            props.update(binding.properties())
            table.owners.trust(binding)  # the owner it is created with is the one it trusts
        committer = table.fixed_committer or table.owners.router(table.storage, None, None)
        txn = Transaction.create_table(
            table.storage, committer, table.clock, table.new_id, schema, partition_by, props, name, description
        )
        try:
            result = txn.commit()
        except Conflict:
            raise AlreadyExists(f"a Delta table was created concurrently at {table.storage.location}") from None
        table._cache = result.state
        return table

    @classmethod
    def open(
        cls,
        location: Storage | str | os.PathLike[str],
        *,
        owner: Binding | str | Sequence[Binding | str] | None = None,
        **components: Unpack[Components],
    ) -> DeltaTable:
        """An existing table; TableNotFound (a NotFound) if there is none.

        `owner=` names the commit owner(s) to trust (a `Binding`, 'grpc://HOST:PORT' or a database
        file, or several; default $FEEDLOG_OWNER): a managed table whose owner is not among them is
        read from its backfilled log, with an `OwnerNotConsulted` warning, and cannot be written.
        """
        table = cls(location, owner=owner, **components)
        # the log alone: opening asks no owner (a writer's first read does; a reader's asks a trusted one)
        table._read_head()
        return table

    def _read_head(self) -> tuple[int, Protocol, Metadata]:
        """The backfilled log's latest version, protocol and metadata, from its newest checkpoint on."""
        tail = list_log_tail(self.storage)
        protocol, metadata = load_protocol_metadata(self.storage, tail)
        self._head = (tail.latest, protocol, metadata)
        return self._head

    # which committer

    def committer_for(self, protocol: Protocol | None, metadata: Metadata | None) -> Committer:
        """Who decides commits after a version with this protocol and metadata (a writer's question:
        OwnerNotTrusted if it is an owner this object may not talk to)."""
        if self.fixed_committer is not None:
            return self.fixed_committer
        binding = Binding.of(protocol, metadata)
        if binding is None or metadata is None:
            return _FILESYSTEM
        return self.owners.committer(binding, metadata.id, self.storage)

    def _ratified(self, write: bool) -> Ratified:
        """Where the commits beyond the backfilled log come from: the fixed committer, or the table's
        owner (a reader's only if trusted and reachable; see `Owners.ratified`)."""
        fixed = self.fixed_committer
        if fixed is not None:
            return lambda _p, _m, start: fixed.ratified_commits(self.storage, start)
        return lambda p, m, start: self.owners.ratified(self.storage, p, m, start, write)

    # reading

    def _listing(self, stat: bool = False, write: bool = False) -> Listing:
        """The backfilled log plus, for a managed table, the ratified commits its owner still holds."""
        return list_table(self.storage, self._ratified(write), stat)

    def _latest(self, write: bool = False) -> TableState:
        """The latest state, read incrementally: only the commits after the last state seen here."""
        cached = self._cache
        state = catch_up(self.storage, cached, self._ratified(write)) if cached is not None else None
        if state is None:
            state = load_latest(self.storage, self._ratified(write))
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
        state = load_state(self.storage, listing, version)
        self._check_horizon(state, listing)
        return Snapshot(self.storage, state)

    def _check_horizon(self, state: TableState, listing: Listing) -> None:
        """BeforeHorizon if vacuum may have deleted files `state` reads (vacuum.check_horizon)."""
        latest = self._latest()
        if state.version >= latest.version:
            return
        commit_ms: int | None
        try:
            commit_ms = self._timeline(listing).commit_time(state.version)
        except FeedlogError:
            commit_ms = None  # cannot be told: counts as old
        now, retention = self.clock.now_ms(), table_retention(latest.metadata)
        vacuumed = None
        if commit_ms is not None and commit_ms >= now - retention:
            # inside the table's window: whole by vacuum's rule, unless a forced vacuum since cut
            # deeper (read from the commits after the version: inside the window too, so bounded)
            vacuumed = self._vacuum_cutoffs.after(self.storage, listing, state.version, latest.version)
            if vacuumed is None or commit_ms >= vacuumed:
                return  # (the set of live files is not needed)
        live = set(files_of(latest.files.values()))
        check_horizon(
            state.version, latest.version, commit_ms, files_of(state.files.values()), live, now, retention, vacuumed
        )

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
        protocol: Protocol | None
        metadata: Metadata | None
        if self._cache is None:
            # a fresh handle loads no snapshot: the protocol, metadata and latest version decide,
            # those `open` read unless a newer commit has appeared since (it may change them)
            head = self._head
            if head is None or self._exists(commit_path(head[0] + 1)):
                head = self._read_head()
            latest, protocol, metadata = head
        else:
            state = self._latest()
            protocol, metadata, latest = state.protocol, state.metadata, state.version
        e = ict_enablement(protocol, metadata)
        in_ict_range = e is not None and (e.timestamp is None or timestamp_ms >= e.timestamp)
        filesystem = self.fixed_committer is None and Binding.of(protocol, metadata) is None
        if in_ict_range and (filesystem or isinstance(self.fixed_committer, FilesystemCommitter)):
            assert e is not None
            found = ict_version_at(self.storage, e.version, latest, timestamp_ms)
            if found is not None:
                return found
        # file times, or an answer near the retained log's start: the listing-based timeline
        return self._timeline(self._listing()).version_at(timestamp_ms)

    def _exists(self, path: str) -> bool:
        try:
            self.storage.stat(path)
        except NotFound:
            return False
        return True

    def ict_enablement(self) -> IctEnablement | None:
        s = self.snapshot()
        return ict_enablement(s.protocol, s.metadata)

    # writing

    def transaction(self, operation: str = "WRITE", *, refresh: bool = True) -> Transaction:
        """A write on the latest state; Unsupported at once, before any data file is written,
        if the table has a feature feedlog cannot honour when writing (TTL compaction, the sink).

        `refresh=False`: on the state this handle last read or committed (`commit(tx)`, not
        `tx.commit()`, tells the handle what it committed), without asking the
        table (a listing, and the commit owner's round trip) whether anything is newer. The commit
        rebases onto whatever is (optimistic concurrency: a blind append never conflicts, so it
        commits just the same), at the cost of one lost attempt when something was. For a writer
        that keeps its handle and appends, mostly alone, that is one call per commit instead of two.
        """
        state = self._cache if not refresh and self._cache is not None else self._latest(write=True)
        snapshot = Snapshot(self.storage, state)
        check_writable(snapshot.protocol, metadata=snapshot.metadata)
        committer = self.fixed_committer or self.owners.router(self.storage, snapshot.protocol, snapshot.metadata)
        return Transaction(
            snapshot, committer, self.clock, self.new_id, operation, max_attempts=self.max_commit_attempts
        )

    def commit(self, tx: Transaction) -> CommitResult:
        """Commit `tx`, and start this handle's next read from the state it committed."""
        result = tx.commit()
        if result.state is not None:
            self._cache = result.state
        return result

    def write_files(self, data: pa.Table | pa.RecordBatch, snapshot: Snapshot | None = None) -> list[Add]:
        """Write data files for `data` without committing them (what executors do)."""
        s = snapshot or self.snapshot()
        opts = s.write_options()
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
        if mode == "append" and self._cache is not None:
            # A blind append starts from what this handle holds (transaction(refresh=False)): a
            # commit made since is rebased over. Anything the state it started from may have
            # decided (a commit since changed the schema or protocol, carries the same txn appId,
            # installed or removed an owner, ...) and that was refused before anything was
            # committed is done again on the latest state, as if it had started there.
            try:
                return self._append(data, txn, mode, refresh=False)
            except _Stale as stale:  # nothing was committed and its files are gone
                # the same turn: the lost attempt may hold the table's next version for it (turns.py)
                return self._append(data, txn, mode, refresh=True, turn=stale.turn)
        return self._append(data, txn, mode, refresh=True)

    def _append(
        self,
        data: pa.Table | pa.RecordBatch,
        txn: tuple[str, int] | None,
        mode: str,
        *,
        refresh: bool,
        turn: bytes | None = None,
    ) -> CommitResult:
        try:
            tx = self.transaction("WRITE", refresh=refresh)
            if turn is not None and isinstance(tx.committer, Router):
                tx.committer.turn = turn
            if txn is not None:
                done = tx.base.txns.get(txn[0])
                if done is not None and done.version >= txn[1]:
                    return CommitResult(None, skipped=True)
                tx.set_txn(*txn)
            snapshot = Snapshot(self.storage, tx.base)  # (transaction() checked it is writable)
            tx.operation_parameters = {"mode": mode.capitalize(), "partitionBy": list(snapshot.partition_columns)}
            adds = self.write_files(data, snapshot)  # leaves none of its files when it fails
        except FeedlogError:
            if refresh:
                raise
            raise _Stale(None) from None  # refused for the schema or protocol of the state the handle held
        tx.add_files(adds)
        if mode == "overwrite":
            tx.reads_whole_table = True
            tx.remove_files(snapshot.files())
        try:
            return self.commit(tx)
        except (Conflict, Unsupported):
            # Definitely not committed (Unsupported: refused before any commit was tried, e.g. a
            # filesystem table on a store without conditional put), so the files are unreferenced:
            # remove them now rather than at vacuum. Any other failure (I/O, interrupt) may have
            # committed them; they stay.
            for a in adds:
                self.storage.delete(urllib.parse.unquote(a.path))
            if refresh:
                raise
            raise _Stale(tx.committer.turn if isinstance(tx.committer, Router) else None) from None

    def set_properties(self, updates: Mapping[str, str | None]) -> CommitResult:
        tx = self.transaction("SET TBLPROPERTIES")
        tx.operation_parameters = {"properties": {k: v for k, v in updates.items() if v is not None}}
        tx.set_properties(updates)
        return self.commit(tx)

    def enable_ict(self) -> CommitResult:
        """Turn on in-commit timestamps for an existing table (a no-op commit if already on)."""
        tx = self.transaction("SET TBLPROPERTIES")
        if ict_enabled(tx.base.protocol, tx.base.metadata):
            return CommitResult(None, tx.base.ict, skipped=True)
        tx.operation_parameters = {"properties": {ENABLE_ICT: "true"}}
        tx.protocol_features.append(ICT)
        tx.set_properties({ENABLE_ICT: "true"})
        return self.commit(tx)

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
        self.owners.trust(binding)  # the owner it is handed to is the one it trusts
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
        return self.commit(tx)

    def convert_to_filesystem(self) -> CommitResult:
        """Take the table back from its owner: it backfills everything, then the owner-removing commit."""
        tx = self.transaction("SET TBLPROPERTIES")
        if Binding.of(tx.base.protocol, tx.base.metadata) is None:
            raise InvalidArgument("the table is not managed by a commit owner")
        tx.removed_features.append(MANAGED_COMMITS)
        tx.operation_parameters = {"properties": {}, "removed": [OWNER_NAME, OWNER_CONF]}
        tx.set_properties({OWNER_NAME: None, OWNER_CONF: None})
        return self.commit(tx)

    def backfill(self, version: int | None = None) -> int:
        """Have the owner copy ratified commits (all, or through `version`) to `_delta_log/<v>.json`."""
        state = self._latest(write=True)
        committer = self.committer_for(state.protocol, state.metadata)
        if not isinstance(committer, ManagedCommitter):
            return state.version  # a filesystem table is always fully backfilled
        return committer.backfill(version)

    def owner_status(self) -> TableStatus | None:
        state = self._latest(write=True)  # asks the owner: only one this object trusts
        committer = self.committer_for(state.protocol, state.metadata)
        if not isinstance(committer, ManagedCommitter):
            return None
        return committer.owner.status(committer.table.table_id, committer.auth)

    # maintenance (see maintenance.py)

    def checkpoint(self, version: int | None = None, *, sidecars: bool | None = None) -> int:
        """A checkpoint: V2 (UUID-named, file actions in a sidecar unless `sidecars=False`) on a table
        with the v2Checkpoint feature, else V1 classic (see maintenance.write_checkpoint)."""
        # The newest checkpoint and the commits after it are all a checkpoint of a recent version
        # reads (`list_log_tail`): listing the whole log made the sink's step every 10 commits grow
        # with the table's age (tools/bench/bench_growth.py, docs/cost-growth.md). An older version
        # needs the whole log.
        listing = list_log_tail(self.storage)
        if version is not None and version < listing.earliest:
            listing = list_log(self.storage)
        return write_checkpoint(
            self.storage, listing, self.clock.now_ms(), version, new_id=self.new_id, sidecars=sidecars
        )

    def cleanup(self, retain_ms: int | None = None) -> list[str]:
        return cleanup_log(self.storage, list_log(self.storage), self.clock.now_ms(), retain_ms)

    def vacuum(
        self, retain_ms: int | None = None, *, dry_run: bool = False, enforce_retention: bool = True
    ) -> VacuumResult:
        """Delete the files no version inside the retention needs (see vacuum.py): data files, deletion
        vectors and `_change_data` files, unreferenced and older than `retain_ms` (default the table's
        `delta.deletedFileRetentionDuration`; a shorter one only with `enforce_retention=False`).
        Commits VACUUM START and END (a managed table's through its owner); `dry_run` only lists."""
        state = self._latest(write=not dry_run)
        listing = self._listing(write=not dry_run)

        def reread(after: int) -> list[tuple[int, bytes]]:
            now = self._listing(write=True)
            return [(v, commit_bytes(self.storage, now, v)) for v in sorted(now.commits) if v > after]

        return vacuum(
            self.storage,
            state,
            listing,
            self.clock.now_ms(),
            retain_ms,
            enforce_retention=enforce_retention,
            dry_run=dry_run,
            transaction=self.transaction,
            commit=self.commit,
            relist=lambda: self._listing(stat=True),
            reread=reread,
        )

    def optimize(self, target_size: int | None = None) -> OptimizeResult:
        """Bin-pack the table's small files into files of about `target_size` bytes (default: the table's
        `delta.targetFileSize`, else 100 MiB) in one OPTIMIZE commit with dataChange=false, through the
        table's owner; no commit if nothing needs it (see optimize.py). CompactionConflict if a
        concurrent rewrite took one of its files."""
        return optimize(self.storage, self.transaction, self.commit, self.clock, self.new_id, target=target_size)

    def auto_compact(self, *, min_num_files: int | None = None, refresh: bool = True) -> OptimizeResult | None:
        """Auto-compaction, the post-commit step: if the table's `delta.autoOptimize.autoCompact` is on and
        a partition holds at least `min_num_files` (default: the table's `feedlog.autoCompact.minNumFiles`,
        else 50) files under half the target, OPTIMIZE them (`auto: true`). None when it is off or
        nothing is due. `refresh=False` decides on the state this handle last read or committed (a
        writer's own commit just now) without asking the table again; the compaction itself, when
        due, starts from the latest state."""
        state = self._cache if not refresh and self._cache is not None else self._latest()
        assert state.metadata is not None
        rule = auto_compact_rule(state.metadata.configuration, min_num_files)
        if rule is None or not needs_compaction(state.files.values(), rule):
            return None
        return optimize(self.storage, self.transaction, self.commit, self.clock, self.new_id, auto=rule)

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
            "backfilled_version": (listing := list_log(self.storage)).latest,
            "commit_owner": None if (b := Binding.of(s.protocol, s.metadata)) is None else b.config,
            "retention": self._retention(s, listing),
        }

    def _retention(self, s: Snapshot, listing: Listing) -> dict[str, Any]:
        """When what the table drops is physically gone, as its properties set it (the deadlines of
        "What feedlog forgets, and when" in docs/retention.md): a row made a tombstone (TTL compaction, a
        forget rewrite) leaves the data files once vacuum runs past `delta.deletedFileRetentionDuration`,
        and the log's file stats (which hold keys) once cleanup runs past `delta.logRetentionDuration`
        after a checkpoint; versions older than the horizon are refused to time travel."""
        files_ms = table_retention(s.metadata)
        log_ms = log_retention(s.metadata.configuration)
        return {
            "deleted_file_retention_ms": files_ms,
            "log_retention_ms": log_ms,
            "time_travel_horizon_ms": self.clock.now_ms() - files_ms,
            "oldest_version": listing.earliest,
        }


__all__ = ["DeltaTable"]


class _Stale(Exception):
    """An append started from the state its handle held was refused before anything was committed,
    possibly for what that state said: `append` does it again on the latest state (with `turn`, the
    id its commits were made under, if any)."""

    def __init__(self, turn: bytes | None) -> None:
        super().__init__()
        self.turn = turn
