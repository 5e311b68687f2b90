"""The commit owner itself: ratification state in a database, backfill to the table's `_delta_log`.

`LocalOwner` is the in-process owner and also the engine of the gRPC service
(`feedlog owner serve`), so both behave identically by construction. Its state
lives in SQLite (a file path: `SqliteDatabase` below) or PostgreSQL (a
`postgresql://` URL: postgres.py, where owner processes on several hosts share
one database). Several processes may open one database: every decision is one
write transaction of the database (SQLite: BEGIN IMMEDIATE, WAL mode,
synchronous=FULL; PostgreSQL: advisory locks on the table), never only a Python lock.

State per table (keyed by the metaData id; the path it was registered at must
match on every call): `latest` ratified version and its ICT, `backfilled`
version, the un-backfilled commits (version -> staged file name), a token
hash and optionally a client-certificate principal that may commit, and a
lifecycle state:

    proposed --(its commit lands put-if-absent)--> active --release--> releasing --backfilled--> released
        \\--(a filesystem writer took that version)--> forgotten

A proposal is settled by looking at the filesystem, by whoever touches the
table next, so once the ownership commit is in `_delta_log` the owner cannot
refuse the table (the RFC's two-phase conversion).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import astuple, dataclass, replace
from typing import Any

from ... import failpoints
from ...clock import Clock, SystemClock
from ...errors import (
    Corruption,
    FeedlogError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    shorten,
)
from ..actions import MANAGED_COMMITS, OWNER_NAME
from ..committer import LOG_DIR, CommitConflict, CommitResponse, Committed, commit_path
from ..objectstore import scheme_of
from ..storage import LocalStorage, Storage
from .batching import Backfiller, Group
from .confined import read_staged
from .database import Connection, Database, Tx, is_postgres
from .places import Places
from .protocol import FEEDLOG_OWNER, Auth, Binding, Commits, RatifiedCommit, TableRef, TableStatus
from .rules import RatifyRequest, Refuse, Repeat, TableRow, backfill_due, decide, decide_register, make_proposal
from .staged import COMMITS_DIR, check_staged_name, clean_staged, staged_actions
from .turns import Pending, Turns, Watch

#: table ids are UUIDs in practice
_MAX_ID = 1024
_STAGED_NAME_LEN = 62  # <20 digits>.<36-character uuid>.json

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    principal TEXT,
    latest INTEGER NOT NULL,
    latest_ict INTEGER NOT NULL,
    backfilled INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    proposal_version INTEGER,
    proposal_file TEXT,
    proposal_ict INTEGER,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS commits (
    table_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    file TEXT NOT NULL,
    ict INTEGER NOT NULL,
    ratified_ms INTEGER NOT NULL,
    PRIMARY KEY (table_id, version)
) WITHOUT ROWID;
"""


class SqliteDatabase(Database):
    """One SQLite file (WAL, synchronous=FULL); every write is BEGIN IMMEDIATE, one at a time."""

    errors = (sqlite3.Error,)

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path
        # Writers in this process queue here rather than in SQLite's busy handler, whose sleeps
        # (up to 100 ms) would dominate latency; other processes are still kept out by SQLite.
        self._write_lock = threading.Lock()

    def _connect(self) -> Connection:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    @contextmanager
    def _exclusive(self, tx: Tx, keys: Sequence[str], durable: bool) -> Iterator[None]:
        with self._write_lock:  # SQLite has one writer: the keys need no lock of their own
            if not durable:
                # WAL with synchronous=NORMAL: this commit is not fsynced; the next FULL commit
                # fsyncs the log through it (a crash loses a suffix of the WAL, never a middle)
                tx.execute("PRAGMA synchronous=NORMAL")
            try:
                tx.execute("BEGIN IMMEDIATE")
                try:
                    yield
                except BaseException:
                    tx.conn.execute("ROLLBACK")
                    raise
                try:
                    tx.execute("COMMIT")
                except BaseException:
                    tx.conn.execute("ROLLBACK")
                    raise
            finally:
                if not durable:
                    self._restore_full(tx)

    def _restore_full(self, tx: Tx) -> None:
        """Put the connection back to synchronous=FULL, or drop it: a connection left at NORMAL would
        acknowledge ratifications that a power cut can still take back."""
        try:
            tx.execute("PRAGMA synchronous=FULL")
        except Unavailable:
            self._drop(tx.conn)
            raise

    def setup(self) -> None:
        with self.using() as tx:
            try:
                tx.conn.executescript(_SCHEMA)  # type: ignore[attr-defined]
            except sqlite3.Error as e:
                raise Unavailable(f"cannot set up the commit owner's database {self.name}: {e}") from None


def open_database(db: str | os.PathLike[str]) -> Database:
    """The owner's database: a `postgresql://` URL (PostgreSQL) or a file path (SQLite)."""
    text = os.fspath(db)
    if is_postgres(text):
        from .postgres import PostgresDatabase  # psycopg (~0.5 s to import) loads only for PostgreSQL

        database: Database = PostgresDatabase(text)
    else:
        if "://" in text:
            raise InvalidArgument(f"commit owner database {shorten(text)!r}: use a file path or postgresql://...")
        database = SqliteDatabase(os.path.abspath(text))
    try:
        database.setup()
    except Unavailable as e:
        raise Unavailable(f"cannot set up the commit owner's database {database.name}: {e}") from None
    return database


_COLUMNS = ", ".join(TableRow.__dataclass_fields__)


_LIMIT = 2**62  # versions and timestamps beyond this are nonsense (and beyond SQLite's integers)


def _check_numbers(version: int, ict: int) -> None:
    if not 0 <= version < _LIMIT:
        raise InvalidArgument(f"version {version} is out of range")
    if not 0 <= ict < _LIMIT:
        raise InvalidArgument(f"inCommitTimestamp {ict} is out of range")


def _check_id(table_id: str) -> None:
    if not table_id:
        raise InvalidArgument("table id is empty")
    if len(table_id) > _MAX_ID:
        raise InvalidArgument(f"table id {shorten(table_id)} is longer than {_MAX_ID} characters")


def _check_name(name: str, version: int) -> None:
    if len(name) != _STAGED_NAME_LEN:  # checked first so a huge name is never echoed whole
        raise InvalidArgument(
            f"staged commit file {shorten(name)!r} is not named <version>.<uuid>.json for version {version}"
        )
    check_staged_name(name, version)


def _land(storage: Storage, path: str, data: bytes) -> bool:
    """Write a commit the owner decided (`_delta_log/<v>.json`) unless the file exists: False if it did.

    put-if-absent where the store has it. On an object store without conditional put the owner
    checks, then writes: safe because, once a table is managed, nothing writes its log but its
    owner (feedlog's filesystem writers refuse such a store, and a managed table's writers go
    through the owner), and the owner writes a version only with the bytes its database ratified,
    so two owner processes racing on one version write the same object.
    """
    has = getattr(storage, "conditional_put", None)
    if has is None or has():
        return storage.put_if_absent(path, data)
    try:
        storage.stat(path)
        return False
    except NotFound:
        storage.write_atomic(path, data)
        return True


#: how far (in commits beyond the table's batch size) background backfill may fall behind before
#: committing writers wait for it: bounds what the owner tracks and what readers must ask it for
MAX_BACKFILL_LAG = 1000
#: threads copying different tables' commits to their logs in one background backfill pass
COPY_THREADS = 4
#: tables whose latest ratification (version, staged file) this process remembers, for writers that
#: rebased on it before it was ratified (`Turns.ahead`) once backfill has forgotten its row
REMEMBERED_TABLES = 4096


@dataclass(frozen=True)
class _Ratification:
    """One ratification request, checked outside the transaction (`checked`: the staged file's verdict)."""

    table_id: str
    version: int
    staged: str
    ict: int
    release: bool
    checked: Binding | FeedlogError | None
    turn: bytes = b""  # the transaction's turn id (turns.py), if it sent one
    #: the staged file of version-1 the writer rebased on before it was ratified (`Pending`), if so
    base: str = ""


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LocalOwner:
    """A commit owner on a SQLite file or PostgreSQL; `roots` (if given: local directories and
    object-store URL prefixes) confine the tables it will own (places.py)."""

    def __init__(
        self,
        db: str | os.PathLike[str],
        roots: Sequence[str | os.PathLike[str]] | None = None,
        clock: Clock | None = None,
        storage_options: Mapping[str, str] | None = None,
        *,
        background_backfill: bool = False,
        max_waiters: int = 16,
    ) -> None:
        #: stamps rows and commits (`updated_ms`, `ratified_ms`): bookkeeping only, no decision reads it
        self.clock: Clock = clock or SystemClock()
        self.database = open_database(db)
        #: the database, as messages name it (a file's absolute path; a URL without its password)
        self.db = self.database.name
        #: where tables may live (local roots and object-store URL prefixes), and the owner's own
        #: credentials for the stores: never a writer's or a table's
        self.places = Places(roots, storage_options)
        #: ratifications arriving together share one database transaction (batching.py)
        self._group: Group[_Ratification, tuple[CommitResponse, TableRow | None]] = Group(self._ratify_group)
        #: writers racing for one table's next version take turns (turns.py; tests and benchmarks
        #: read its counters)
        self.turns = Turns(max_waiters)
        #: backfill off the commit path (the served owner); the in-process owner backfills before
        #: it answers, so a process that commits and exits leaves nothing behind un-backfilled
        self._background = background_backfill
        self._backfiller = Backfiller(self._backfill_many)
        #: background backfill copies several tables' files at once (COPY_THREADS, started on first use)
        self._copy_pool: ThreadPoolExecutor | None = None
        self._copy_lock = threading.Lock()
        #: table id -> (version, staged file) of the latest commit this process ratified: a commit
        #: rebased on it before it was ratified checks against this once backfill forgot its row
        self._ratified: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._ratified_lock = threading.Lock()
        #: commits this process ratified (recorded in the database): a served owner's metrics read it
        self.ratified = 0

    # ---- the database --------------------------------------------------------------------------

    def _write(self, *keys: str, durable: bool = True) -> AbstractContextManager[Tx]:
        return self.database.transaction(keys, durable=durable)

    def _read(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        return self.database.read(sql, args)

    def _row(self, table_id: str, tx: Tx | None = None) -> TableRow | None:
        sql, args = f"SELECT {_COLUMNS} FROM tables WHERE id = ?", (table_id,)
        rows = tx.rows(sql, args) if tx else self._read(sql, args)
        return TableRow(*rows[0]) if rows else None

    def close(self, timeout: float = 30.0) -> None:
        """Close every connection once no call is using one (calls starting meanwhile are refused as
        Unavailable). If calls are still running after `timeout` seconds, their connections are
        left to be closed when collected: closing one under a running statement crashes the process.
        The owner may be used again afterwards (it reconnects)."""
        self._backfiller.close(timeout)  # what is queued is backfilled first
        with self._copy_lock:
            pool, self._copy_pool = self._copy_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.database.close(timeout)

    def backfill_idle(self, timeout: float = 30.0) -> bool:
        """Whether background backfill has nothing queued or running (waiting up to `timeout` s)."""
        return self._backfiller.wait_idle(timeout)

    # ---- where tables may live -----------------------------------------------------------------

    def adopt(self, storage: Storage) -> None:
        """Reach the table in `storage` through that storage object: the in-process owner (no roots)
        uses its own process's store credentials, as the table handle was opened with them."""
        self.places.adopt(storage)

    def _confine(self, path: str) -> str:
        return self.places.confine(path)

    def _storage(self, path: str) -> Storage:
        return self.places.storage(path)

    def _table(self, ref: TableRef) -> TableRow:
        """The registered table `ref` names, its proposal settled; NotFound if it names none."""
        _check_id(ref.table_id)
        path = self._confine(ref.path)
        row = self._row(ref.table_id)
        if row is not None and row.state == "proposed":
            row = self._settle(row)
        if row is None:
            raise NotFound(f"table {shorten(ref.table_id)} is not managed by this commit owner")
        if row.path != path:
            raise NotFound(f"table {shorten(ref.table_id)} is registered elsewhere, not at {shorten(path)}")
        return row

    @staticmethod
    def _authorize(row: TableRow, auth: Auth) -> None:
        if row.principal is not None and auth.principal == row.principal:
            return
        if auth.token and hmac.compare_digest(_hash(auth.token), row.token_hash):
            return
        raise PermissionDenied(f"table {row.id}: wrong or missing token (give --token-file or set FEEDLOG_OWNER_TOKEN)")

    def _staged(
        self, storage: Storage, version: int, name: str, ict: int, table_id: str, install: bool = False
    ) -> Binding | None:
        """Check a staged commit: its name, its ICT, and the owner it leaves the table with (None: none)."""
        _check_name(name, version)
        try:
            data = read_staged(storage, COMMITS_DIR, name)
        except NotFound:
            raise InvalidArgument(f"staged commit {COMMITS_DIR}/{name} does not exist: stage it first") from None
        info, protocol, metadata = staged_actions(data)
        if info is None or info.in_commit_timestamp != ict:
            raise InvalidArgument(
                f"staged commit {name} must start with commitInfo whose inCommitTimestamp is {ict} "
                f"(found {None if info is None else info.in_commit_timestamp})"
            )
        if metadata is not None and metadata.id != table_id:
            raise InvalidArgument(f"staged commit {name} changes the table id to {metadata.id}")
        if install and (protocol is None or metadata is None):
            raise InvalidArgument(f"staged commit {name} must carry the protocol and metaData that install the owner")
        if protocol is None and metadata is None:
            return Binding(FEEDLOG_OWNER)  # no change to ownership
        if protocol is None or metadata is None:
            # only one half of the ownership pair changes: it must still agree with the other half
            has_feature = protocol is None or protocol.supports_writer_feature(MANAGED_COMMITS)
            named = OWNER_NAME in metadata.configuration if metadata is not None else True
            if has_feature and named:
                return Binding(FEEDLOG_OWNER) if metadata is None else Binding(metadata.configuration[OWNER_NAME])
            raise InvalidArgument(
                f"staged commit {name} would leave the table half-managed: the {MANAGED_COMMITS} feature "
                f"and {OWNER_NAME} are added or removed together"
            )
        try:
            return Binding.of(protocol, metadata)
        except Corruption as e:
            raise InvalidArgument(f"staged commit {name}: {e}") from None

    # ---- the owner API -------------------------------------------------------------------------

    def register(
        self, table: TableRef, version: int, staged: str, ict: int, auth: Auth, batch_size: int
    ) -> CommitResponse:
        _check_numbers(version, ict)
        if batch_size < 1:
            raise InvalidArgument(f"backfill batch size must be >= 1, got {batch_size}")
        if not auth.token and not auth.principal:
            raise InvalidArgument("registering a table needs the token (or certificate) that will guard it")
        _check_id(table.table_id)
        path = self._confine(table.path)
        storage = self._storage(path)
        binding = self._staged(storage, version, staged, ict, table.table_id, install=True)
        if binding is None or binding.name != FEEDLOG_OWNER:
            raise InvalidArgument(f"staged commit {staged} does not install {FEEDLOG_OWNER!r} as the commit owner")
        existing = self._row(table.table_id)
        if existing is not None and existing.state == "proposed":
            existing = self._settle(existing)
        with self._write(table.table_id, "path:" + path) as db:
            row = self._row(table.table_id, db)
            other = db.execute(
                "SELECT id FROM tables WHERE path = ? AND state != 'released' AND id != ?", (path, table.table_id)
            ).fetchone()
            if decide_register(row, other[0] if other else None, path, version, staged) is not None:
                return Committed(version)  # a repeated request whose first answer was lost
            proposal = make_proposal(
                table.table_id,
                path,
                _hash(auth.token) if auth.token else "",
                auth.principal,
                version,
                staged,
                ict,
                batch_size,
            )
            db.execute("DELETE FROM commits WHERE table_id = ?", (table.table_id,))
            db.execute("DELETE FROM tables WHERE id = ?", (table.table_id,))
            db.execute(
                f"INSERT INTO tables ({_COLUMNS}, updated_ms) VALUES ({', '.join('?' * 13)})",
                (*astuple(proposal), self.clock.now_ms()),
            )
        failpoints.point("owner.proposed")
        settled = self._settle(self._row(table.table_id))  # type: ignore[arg-type]
        if settled is not None and settled.state == "active":
            return Committed(version)
        return CommitConflict(version, True, f"version {version} was committed by a filesystem writer first")

    def _settle(self, row: TableRow) -> TableRow | None:
        """Decide a proposal by the filesystem: its commit landed (active) or another did (forgotten)."""
        assert row.proposal_version is not None and row.proposal_file is not None
        storage = self._storage(row.path)
        target = commit_path(row.proposal_version)
        try:
            mine: bytes | None = read_staged(storage, COMMITS_DIR, row.proposal_file)
        except (NotFound, InvalidArgument):  # gone, or swapped for something we will not read
            mine = None
        if mine is not None and _land(storage, target, mine):
            won = True
        else:
            try:
                won = mine is not None and read_staged(storage, LOG_DIR, target.rsplit("/", 1)[1]) == mine
            except NotFound:
                won = False  # neither the staged file nor the commit: nothing to install
        with self._write(row.id) as db:
            current = self._row(row.id, db)
            if current is None or current.state != "proposed" or current.proposal_file != row.proposal_file:
                return current  # someone settled it meanwhile
            if won:
                db.execute(
                    "UPDATE tables SET state = 'active', latest = ?, latest_ict = ?, backfilled = ?, updated_ms = ? "
                    "WHERE id = ?",
                    (row.proposal_version, row.proposal_ict, row.proposal_version, self.clock.now_ms(), row.id),
                )
            else:
                db.execute("DELETE FROM tables WHERE id = ?", (row.id,))
            settled = self._row(row.id, db)
        if won:
            self._clean_staged(storage, row.proposal_version)
        return settled

    def commit(
        self,
        table: TableRef,
        version: int,
        staged: str,
        ict: int,
        auth: Auth,
        turn: bytes | None = None,
        *,
        watch: Watch | None = None,
        pending_ok: bool = False,
        base: str | None = None,
    ) -> CommitResponse:
        """`CommitOwner.commit`; `watch`: how a served owner learns that the call ended (`Turns.admit`)."""
        if base:
            _check_name(base, version - 1)
        if not turn:
            return self._ratify(table, version, staged, ict, auth, release=False, base=base or "")
        Turns.check(turn)
        try:
            response = self._ratify(
                table,
                version,
                staged,
                ict,
                auth,
                release=False,
                turn=turn,
                watch=watch,
                pending_ok=pending_ok,
                base=base or "",
            )
        except BaseException:
            self.turns.done(table.table_id, turn)
            raise
        if isinstance(response, CommitConflict) and response.retryable:
            if self.turns.lost(table.table_id, turn, slow=scheme_of(table.path) is not None):
                response = replace(response, turn=True)
        else:
            self.turns.done(table.table_id, turn)
        return response

    def release(self, table: TableRef, version: int, staged: str, ict: int, auth: Auth) -> CommitResponse:
        return self._ratify(table, version, staged, ict, auth, release=True)

    def end_turn(self, table: TableRef, turn: bytes, auth: Auth) -> bool:
        """`CommitOwner.end_turn`: the transaction `turn` will not commit; if it holds the table's
        turn, the first in line gets it now. Whether it held the turn."""
        Turns.check(turn)
        row = self._table(table)
        self._authorize(row, auth)
        return bool(turn) and self.turns.done(row.id, turn)

    def _ratify(
        self,
        table: TableRef,
        version: int,
        staged: str,
        ict: int,
        auth: Auth,
        *,
        release: bool,
        turn: bytes = b"",
        watch: Watch | None = None,
        pending_ok: bool = False,
        base: str = "",
    ) -> CommitResponse:
        _check_numbers(version, ict)
        row = self._table(table)
        self._authorize(row, auth)
        storage = self._storage(row.path)
        slow = scheme_of(row.path) is not None
        holds = turn  # whose turn the version must not be held against, where it is decided
        # a turn told to go next names the version after the one being ratified: it waits for it
        told = bool(turn and base) and version == row.latest + 2 and self.turns.is_next(row.id, turn)
        if turn and base and version == row.latest + 2 and not told:
            row = self._table(table)  # the commit it rebased on may have been ratified just now
        if turn and (version <= row.latest + 1 or told):
            admitted = self.turns.admit(row.id, turn, slow=slow, watch=watch, pending_ok=pending_ok)
            if isinstance(admitted, Pending):
                row = self._table(table)
                if version <= row.latest:  # a repeat of a request whose answer was lost is answered
                    taken = self._answer_taken(row, RatifyRequest(version, staged, ict, release, None, None))
                    if isinstance(taken, Committed):  # as ever: committed (its file is a commit)
                        return taken
                return self._answer_pending(row.id, version, admitted)
            if admitted == "waited":
                row = self._table(table)  # the versions it waited for are taken now
            elif admitted == "over":
                holds = b""  # beyond the waiting limit it races, held version or not (turns.admit)
        if base and version > row.latest + 1:
            # rebased on a commit named before it was ratified, which was not (its writer failed, or
            # lost the version after all): the gap is no fault of this writer's, who rebases again
            return CommitConflict(
                version, True, f"version {version - 1}, which this commit was rebased on, was not ratified"
            )
        # The staged file is read and checked here, before the lock and the SQLite transaction:
        # reading is the writer's I/O (a slow disk, a huge or hostile file) and must not hold up
        # other tables' commits. Its verdict is used only where the decision below needs it.
        if version <= row.latest and row.state != "proposed":
            # Taken already (latest only grows): the answer, Repeat or Conflict with the winners,
            # needs neither the staged file nor the write lock. On a contended table most requests
            # are such losers: one read answers them, not a place in the next group, behind its fsync.
            return self._answer_taken(row, RatifyRequest(version, staged, ict, release, None, None))
        checked: Binding | FeedlogError | None
        try:
            checked = self._staged(storage, version, staged, ict, row.id)
        except FeedlogError as e:
            checked = e
        if turn and not release and version == row.latest + 1 and not isinstance(checked, FeedlogError):
            # the first in line learns this commit now and rebases on it while it is ratified
            self.turns.ahead(row.id, turn, Pending(version, staged), slow=slow)
        failpoints.point("owner.admitted")
        response, before = self._group.submit(
            _Ratification(row.id, version, staged, ict, release, checked, holds, base)
        )
        if before is None:
            return response  # refused, or a repeated request whose first answer was lost
        failpoints.point("owner.ratified")
        queued = self._backfiller.requested(row.id, version)  # a batch on its way or done counts as backfilled
        if backfill_due(before, version, release) and (release or version - queued >= before.batch_size):
            lag = version - before.backfilled
            if release or not self._background or lag >= before.batch_size + MAX_BACKFILL_LAG:
                # a release must be whole in _delta_log before the caller learns it; an owner whose
                # background backfill fell this far behind makes its writers wait for it
                try:
                    self._backfill(row.id, version)
                except FeedlogError:
                    if release:
                        raise  # the caller must learn that the table is not yet usable
                    # the commit is ratified all the same; the next backfill copies it
            else:
                self._backfiller.due(row.id, version)
        return response

    def _answer_taken(self, row: TableRow, request: RatifyRequest) -> CommitResponse:
        """`decide` for a version at or below the table's latest, from committed state alone."""
        winners = [
            (int(v), str(f))
            for v, f in self._read(
                "SELECT version, file FROM commits WHERE table_id = ? AND version >= ? ORDER BY version",
                (row.id, request.version),
            )
        ]
        recorded = winners[0][1] if winners and winners[0][0] == request.version else None
        outcome = decide(row, replace(request, recorded=recorded))
        if isinstance(outcome, Repeat):
            return Committed(request.version)  # a repeated request whose first answer was lost
        if not isinstance(outcome, Refuse):  # `decide` ratifies no version at or below latest
            raise AssertionError(f"version {request.version} <= latest {row.latest} was not refused")
        c = outcome.conflict
        return CommitConflict(c.version, c.retryable, c.reason, tuple(winners) if outcome.winners else ())

    def _answer_pending(self, table_id: str, version: int, pending: Pending) -> CommitResponse:
        """The answer to a request told, while it waited, of the holder's commit being ratified
        (`Turns.ahead`): the winners from its version up to that commit, which is named `pending`."""
        winners = [
            (int(v), str(f))
            for v, f in self._read(
                "SELECT version, file FROM commits WHERE table_id = ? AND version >= ? AND version < ? "
                "ORDER BY version",
                (table_id, version, pending.version),
            )
        ]
        reason = f"version {pending.version} is being ratified for the writer ahead of this one"
        winners.append((pending.version, pending.file))
        return CommitConflict(version, True, reason, tuple(winners), pending=pending.version)

    def _ratified_as(self, db: Tx, table_id: str, version: int, file: str) -> bool:
        """Whether `version` of the table was ratified with staged file `file`, as far as this process
        can tell: the database's record, else (backfill forgot it) the latest it ratified itself."""
        recorded = db.execute(
            "SELECT file FROM commits WHERE table_id = ? AND version = ?", (table_id, version)
        ).fetchone()
        if recorded is not None:
            return bool(recorded[0] == file)
        with self._ratified_lock:
            return self._ratified.get(table_id) == (version, file)

    def _remember(self, table_id: str, version: int, file: str) -> None:
        with self._ratified_lock:
            self._ratified[table_id] = (version, file)
            self._ratified.move_to_end(table_id)
            while len(self._ratified) > REMEMBERED_TABLES:
                self._ratified.popitem(last=False)

    def _ratify_group(
        self, items: Sequence[_Ratification]
    ) -> list[tuple[CommitResponse, TableRow | None] | BaseException]:
        """Decide and record several ratifications (any tables, any order) in ONE write transaction:
        each sees the ones before it (two writers racing for a version: the first wins, the second
        is answered Conflict with the winner). Per item: (answer, the table's row before it if it was
        ratified now), or the error that item alone gets."""
        out: list[tuple[CommitResponse, TableRow | None] | BaseException] = []
        with self._write(*sorted({i.table_id for i in items})) as db:
            for item in items:
                out.append(self._ratify_one(db, item))
        for item, outcome in zip(items, out, strict=True):  # committed: remembered for `_ratified_as`
            if isinstance(outcome, tuple) and outcome[1] is not None:
                self._remember(item.table_id, item.version, item.staged)
                self.ratified += 1
        return out

    def _ratify_one(self, db: Tx, item: _Ratification) -> tuple[CommitResponse, TableRow | None] | BaseException:
        row = self._row(item.table_id, db)
        if row is None:
            return NotFound(f"table {shorten(item.table_id)} is not managed by this commit owner")
        version = item.version
        if (
            item.base
            and row.latest < version
            and not (row.latest == version - 1 and self._ratified_as(db, row.id, version - 1, item.base))
        ):
            # rebased on a commit named before it was ratified (Turns.ahead), which is not what
            # version-1 became: the writer rebases again (a taken version is decided as usual below)
            reason = f"version {version - 1} is not the commit this one was rebased on"
            return CommitConflict(version, True, reason), None
        recorded = db.execute(
            "SELECT file FROM commits WHERE table_id = ? AND version = ?", (row.id, version)
        ).fetchone()
        request = RatifyRequest(
            version, item.staged, item.ict, item.release, recorded[0] if recorded else None, item.checked
        )
        try:
            outcome = decide(row, request)
        except FeedlogError as e:  # this request can never succeed; the others in the group go on
            return e
        if isinstance(outcome, Repeat):
            return Committed(version), None  # a repeated request whose first answer was lost
        if isinstance(outcome, Refuse):
            if not outcome.winners:
                return outcome.conflict, None
            winners = db.execute(
                "SELECT version, file FROM commits WHERE table_id = ? AND version >= ? ORDER BY version",
                (row.id, version),
            ).fetchall()
            c = outcome.conflict
            return CommitConflict(c.version, c.retryable, c.reason, tuple((int(v), str(f)) for v, f in winners)), None
        if item.turn and self.turns.held_for_another(row.id, item.turn):
            # a request that passed the line before the table's turn was given: the version it
            # would take is held for the writer that lost the race for the one before
            reason = f"version {version} is held for a writer that lost a race for this table before this one"
            return CommitConflict(version, True, reason), None
        now = self.clock.now_ms()
        db.execute(
            "INSERT INTO commits (table_id, version, file, ict, ratified_ms) VALUES (?, ?, ?, ?, ?)",
            (row.id, version, item.staged, item.ict, now),
        )
        db.execute(
            "UPDATE tables SET latest = ?, latest_ict = ?, state = ?, updated_ms = ? WHERE id = ?",
            (outcome.version, outcome.ict, outcome.state, now, row.id),
        )
        return Committed(version), row

    def get_commits(self, table: TableRef, start_version: int) -> Commits:
        row = self._table(table)
        # latest first, then the commits: every version up to that latest which the commits no longer
        # hold was backfilled before they were read (clients rely on this: ManagedCommitter)
        latest = self._read("SELECT latest FROM tables WHERE id = ?", (row.id,))
        rows = self._read(
            "SELECT version, file, ict FROM commits WHERE table_id = ? AND version >= ? ORDER BY version",
            (row.id, min(max(start_version, 0), _LIMIT)),
        )
        return Commits([RatifiedCommit(*r) for r in rows], int(latest[0][0]) if latest else row.latest)

    def backfill(self, table: TableRef, version: int, auth: Auth) -> int:
        row = self._table(table)
        self._authorize(row, auth)
        return self._backfill(row.id, row.latest if version < 0 else min(version, row.latest))

    def _backfill(self, table_id: str, upto: int) -> int:
        """Copy ratified commits <= upto to `_delta_log/<v>.json`, strictly in version order, then forget them."""
        copied = self._copy(table_id, upto)
        self._forget([copied])
        return copied[2]

    def _backfill_many(self, tables: Sequence[tuple[str, int]]) -> None:
        """`_backfill` for several tables (background backfill): each table's files copied in order,
        then ONE write transaction forgets what all of them copied. Raises the first table's error
        after recording the others."""
        copied, errors = [], []
        if len(tables) == 1:
            outcomes: list[tuple[TableRow, Storage, int] | FeedlogError] = [self._try_copy(*tables[0])]
        else:
            # tables apart (each table's own commits still strictly in order): their fsyncs overlap
            # and the filesystem's journal commits them together
            with self._copy_lock:
                if self._copy_pool is None:
                    self._copy_pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="owner-backfill-copy")
                pool = self._copy_pool
            outcomes = list(pool.map(lambda t: self._try_copy(*t), tables))
        for outcome in outcomes:
            if isinstance(outcome, FeedlogError):
                errors.append(outcome)
            else:
                copied.append(outcome)
        self._forget(copied)
        if errors:
            raise errors[0]

    def _try_copy(self, table_id: str, upto: int) -> tuple[TableRow, Storage, int] | FeedlogError:
        try:
            return self._copy(table_id, upto)
        except FeedlogError as e:
            return e

    def _copy(self, table_id: str, upto: int) -> tuple[TableRow, Storage, int]:
        """Copy a table's ratified commits <= upto to `_delta_log`, in order: (its row, its storage,
        the version copied through)."""
        row = self._row(table_id)
        if row is None:
            raise NotFound(f"table {table_id} is not managed by this commit owner")
        storage = self._storage(row.path)
        pending = self._read(
            "SELECT version, file FROM commits WHERE table_id = ? AND version > ? AND version <= ? ORDER BY version",
            (table_id, row.backfilled, upto),
        )
        done = row.backfilled
        for version, name in pending:
            if version != done + 1:
                # another backfill (the background one, another owner process) may have copied and
                # forgotten versions between our reading the row and the commits: the row says so
                now = self._row(table_id)
                if now is None or now.backfilled < version - 1:
                    raise Corruption(f"table {table_id}: ratified commits jump from {done} to {version}")
                done = version - 1
            target = commit_path(version)
            try:
                data = read_staged(storage, COMMITS_DIR, name)
            except InvalidArgument as e:  # replaced after ratification by a link, a FIFO, a huge file
                raise Corruption(f"ratified commit {version} of {row.path} cannot be backfilled: {e}") from None
            except NotFound:
                try:
                    storage.stat(target)  # a concurrent backfill copied it and cleaned up: fine
                except NotFound:
                    raise Corruption(
                        f"ratified commit {version} of {row.path} ({COMMITS_DIR}/{name}) has disappeared"
                    ) from None
            else:
                if not _land(storage, target, data) and self._read_log(storage, target) != data:
                    raise Corruption(f"{row.path}/{target} exists but is not the ratified commit {version}")
            done = version
            failpoints.point("owner.backfilled_one")
        return row, storage, done

    def _forget(self, copied: Sequence[tuple[TableRow, Storage, int]]) -> None:
        """Record what `_copy` copied (one write transaction for all the tables), then delete the
        staged files of the copied versions."""
        todo = [
            (row, storage, done) for row, storage, done in copied if done > row.backfilled or row.state == "releasing"
        ]
        if not todo:
            return
        # Not fsynced (unless it releases a table): a crash that loses it leaves commits tracked
        # whose `_delta_log/<v>.json` exists, which the next backfill finds and forgets again
        # (`_copy` accepts a staged file cleaned up after its copy landed); readers fall back to
        # the log for a cleaned-up staged file. That saves the owner's only fsync per backfill
        # pass while ratifications wait behind its write lock.
        durable = any(row.state == "releasing" for row, _, _ in todo)
        with self._write(*sorted({row.id for row, _, _ in todo}), durable=durable) as db:
            for row, _, done in todo:
                db.execute("DELETE FROM commits WHERE table_id = ? AND version <= ?", (row.id, done))
                db.execute(
                    "UPDATE tables SET updated_ms = ?, "
                    "backfilled = CASE WHEN backfilled > ? THEN backfilled ELSE ? END, "
                    "state = CASE WHEN state = 'releasing' AND latest <= ? THEN 'released' ELSE state END "
                    "WHERE id = ?",
                    (self.clock.now_ms(), done, done, done, row.id),
                )
        for _, storage, done in todo:
            self._clean_staged(storage, done)

    @staticmethod
    def _read_log(storage: Storage, path: str) -> bytes:
        try:
            return read_staged(storage, LOG_DIR, path.rsplit("/", 1)[1])
        except InvalidArgument as e:
            raise Corruption(f"{e} (where a backfilled commit should be)") from None

    @staticmethod
    def _clean_staged(storage: Storage, through: int) -> None:
        if isinstance(storage, LocalStorage) and os.path.islink(os.path.join(storage.root, COMMITS_DIR)):
            return  # not this table's directory: deleting there would delete another table's files
        clean_staged(storage, through)

    def backfill_all(self) -> dict[str, int]:
        """Settle proposals and backfill every table with un-backfilled commits (an owner's restart)."""
        out = {}
        for (table_id,) in self._read("SELECT id FROM tables WHERE state = 'proposed'", ()):
            row = self._row(str(table_id))
            if row is not None and row.state == "proposed":
                self._settle(row)
        for table_id, latest in self._read(
            "SELECT id, latest FROM tables WHERE backfilled < latest OR state = 'releasing'", ()
        ):
            out[str(table_id)] = self._backfill(str(table_id), int(latest))
        return out

    def status(self, table_id: str, auth: Auth) -> TableStatus:
        """The owner's state of a table; it names where the table lives, so it needs the token."""
        _check_id(table_id)
        row = self._row(table_id)
        if row is not None and row.state == "proposed":
            row = self._settle(row)
        if row is None:
            raise NotFound(f"table {shorten(table_id)} is not managed by this commit owner")
        self._authorize(row, auth)
        tracked = self._read("SELECT COUNT(*) FROM commits WHERE table_id = ?", (table_id,))[0][0]
        return TableStatus(row.id, row.path, row.state, row.latest, row.backfilled, row.batch_size, int(tracked))
