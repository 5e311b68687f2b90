"""What the commit owner needs from a database, whichever engine holds its state.

`LocalOwner` (sqlite.py) writes its SQL once, with `?` placeholders and only
what SQLite and PostgreSQL both understand; a `Database` runs it on one engine:
`SqliteDatabase` (sqlite.py, one file, WAL) or `PostgresDatabase`
(postgres.py, shared by several owner processes). A `Database` holds one
connection per thread, counts the calls using them so that `close` never closes
one under a running statement, and turns the engine's errors into `Unavailable`.

A write is `transaction(keys)`: the engine makes it exclusive against every
other write naming one of the same keys (a table id, a table path), in this
process and in every other process sharing the database. It is durable when it
returns, unless asked with `durable=False`: then a crash may lose it (never
tear it), and the next durable write makes it durable too (both engines write
one log in order). Only bookkeeping that can be redone may ask for that.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Protocol

from ...errors import Unavailable


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    def execute(self, sql: Any, args: Any = ..., /) -> Any: ...

    def close(self) -> None: ...


def is_postgres(db: str) -> bool:
    """Whether an owner's database is a PostgreSQL URL (else it is a SQLite file path)."""
    return db.startswith(("postgresql://", "postgres://"))


def redact(url: str) -> str:
    """A database URL without its password (in its user part or a query parameter), to be named in
    messages and logs."""
    url = re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
    return re.sub(r"([?&](?:ssl)?password=)[^&]*", r"\1***", url)


def one_line(error: BaseException) -> str:
    """An engine's error message on one line (libpq's span several)."""
    return " ".join(str(error).split())


class Tx:
    """One connection inside a call or a transaction: `?` SQL, the engine's errors as Unavailable."""

    def __init__(self, database: Database, conn: Connection) -> None:
        self.database, self.conn = database, conn

    def execute(self, sql: str, args: Sequence[object] = ()) -> Cursor:
        try:
            cursor: Cursor = self.conn.execute(self.database.translate(sql), tuple(args))
            return cursor
        except self.database.errors as e:
            self.database.failures += 1
            raise Unavailable(f"commit owner database {self.database.name}: {one_line(e)}") from None

    def rows(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.execute(sql, args).fetchall()]

    def one(self, sql: str, args: Sequence[object] = ()) -> tuple[Any, ...] | None:
        row = self.execute(sql, args).fetchone()
        return None if row is None else tuple(row)


class Database:
    """One engine's connections (per thread) and transactions; subclasses connect and lock."""

    #: the engine's exception classes, reported as Unavailable
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str) -> None:
        #: what messages call the database (no password)
        self.name = name
        self._local = threading.local()
        self._conns: list[Connection] = []
        self._conns_lock = threading.Lock()
        self._busy = 0
        self._closing = False
        self._idle = threading.Condition()
        #: the engine's errors met so far (each raised as Unavailable): a served owner's metrics read it
        self.failures = 0

    # ---- what an engine provides ------------------------------------------------------------------

    def _connect(self) -> Connection:
        raise NotImplementedError

    def translate(self, sql: str) -> str:
        return sql

    @contextmanager
    def _exclusive(self, tx: Tx, keys: Sequence[str], durable: bool) -> Iterator[None]:
        """Begin a transaction that excludes every other one naming one of `keys` (durable: see above)."""
        raise NotImplementedError
        yield

    def _broken(self, conn: Connection) -> bool:
        """Whether a connection can no longer be used (it is then dropped and reopened)."""
        return False

    def setup(self) -> None:
        """Create the owner's tables if absent."""
        raise NotImplementedError

    # ---- shared -------------------------------------------------------------------------------------

    def _conn(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._broken(conn):
            self._drop(conn)
            conn = None
        if conn is None:
            try:
                conn = self._connect()
            except (*self.errors, OSError) as e:  # type: ignore[misc]
                self.failures += 1
                raise Unavailable(f"cannot open the commit owner's database {self.name}: {one_line(e)}") from None
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _drop(self, conn: Connection) -> None:
        self._local.conn = None
        with self._conns_lock:
            if conn in self._conns:
                self._conns.remove(conn)
        with suppress(Exception):  # it is broken already; closing is a courtesy
            conn.close()

    @contextmanager
    def using(self) -> Iterator[Tx]:
        """This thread's connection, for the duration of one call."""
        with self._idle:
            if self._closing:
                raise Unavailable(f"the commit owner on {self.name} is shutting down")
            self._busy += 1
        try:
            yield Tx(self, self._conn())
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    @contextmanager
    def transaction(self, keys: Sequence[str], *, durable: bool = True) -> Iterator[Tx]:
        """One write transaction, exclusive against every other one naming one of `keys`."""
        with self.using() as tx, self._exclusive(tx, keys, durable):
            yield tx

    def read(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self.using() as tx:
            return tx.rows(sql, args)

    def close(self, timeout: float = 30.0) -> None:
        """Close every connection once no call is using one (calls starting meanwhile are refused as
        Unavailable). If calls are still running after `timeout` seconds, their connections are
        left to be closed when collected: closing one under a running statement can crash the
        process (the sqlite3 module does). The database may be used again afterwards (it reconnects)."""
        with self._idle:
            self._closing = True
            idle = self._idle.wait_for(lambda: self._busy == 0, timeout)
            try:
                with self._conns_lock:
                    if idle:
                        for c in self._conns:
                            c.close()
                    self._conns.clear()
                self._local = threading.local()
            finally:
                self._closing = False
