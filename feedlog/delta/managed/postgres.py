"""The commit owner's state on PostgreSQL (psycopg 3), shared by several owner processes.

`feedlog owner serve --db postgresql://user@host:5432/dbname` keeps the same
two tables as the SQLite engine (created if absent; a URL's
`options=-csearch_path=NAME` picks the schema). Owners on different hosts may
share one database and serve the same tables.

How two owners never ratify the same version: every write transaction first
takes PostgreSQL transaction-level advisory locks (`pg_advisory_xact_lock`) on
the keys it names, the table's id (and, for a registration, its path too),
always in sorted order so that two transactions cannot deadlock. Everything the
transaction then reads and decides (`rules.decide`) is under that lock, and the
lock is released only by COMMIT or ROLLBACK, so the read-decide-write of one
table is serial across every process, like SQLite's single writer, while writes
to different tables run in parallel. This was chosen over SERIALIZABLE with
retry because a retry would re-run the decision, which the owner's code runs
once inside `with transaction(...)`, and over `SELECT ... FOR UPDATE` because a
registration must exclude a row that does not exist yet. Reads outside a
transaction (listing commits, status) are single autocommit statements.

Backfill stays idempotent when two owners race: each copies a ratified commit
to `_delta_log/<v>.json` put-if-absent, and a copy that exists with the same
bytes is fine (sqlite.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from decimal import Decimal
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import errors, pq

from ...errors import Unavailable
from .database import Connection, Database, Tx, is_postgres, one_line, redact

__all__ = ["PostgresDatabase", "is_postgres"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    principal TEXT,
    latest BIGINT NOT NULL,
    latest_ict BIGINT NOT NULL,
    backfilled BIGINT NOT NULL,
    batch_size BIGINT NOT NULL,
    proposal_version BIGINT,
    proposal_file TEXT,
    proposal_ict BIGINT,
    updated_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS tables_path ON tables (path);
CREATE TABLE IF NOT EXISTS commits (
    table_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    file TEXT NOT NULL,
    ict BIGINT NOT NULL,
    ratified_ms BIGINT NOT NULL,
    PRIMARY KEY (table_id, version)
);
"""

#: the advisory lock the schema's creation takes (CREATE ... IF NOT EXISTS races between processes)
_SETUP_KEY = "feedlog owner schema"
_CONNECT_TIMEOUT = 10

# ---- one connection, driven through libpq ---------------------------------------------------------
#
# The owner's statements are few, small and run over and over, and one owner process serves every
# writer from one interpreter: psycopg's cursors cost about 30 us of CPU (under the GIL) per
# statement, libpq's own calls about 12 us. So a connection prepares each statement on the server
# at its first use and then runs it with one Bind/Execute (`PQexecPrepared`, which releases the
# GIL while it waits); the few rows come back as text and are decoded here by column type. A
# statement without arguments (BEGIN, COMMIT, the schema) goes as a simple query.

_INTS = frozenset({20, 21, 23, 26})  # int8, int2, int4, oid
_BOOL, _BYTEA, _NUMERIC = 16, 17, 1700


def _decoder(oid: int) -> Callable[[bytes], object]:
    """How a column's text value becomes Python (as psycopg would give it); anything else is text."""
    if oid in _INTS:
        return int
    if oid == _NUMERIC:  # SUM() of BIGINTs is numeric
        return lambda v: Decimal(v.decode()) if b"." in v or b"N" in v else int(v)
    if oid == _BOOL:
        return lambda v: v == b"t"
    if oid == _BYTEA:
        return lambda v: bytes.fromhex(v[2:].decode())  # \x... (bytea_output = hex, the default)
    return lambda v: v.decode()


def _encode(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, bytes):
        return b"\\x" + value.hex().encode()  # bytea's text form (a raw NUL would end a text parameter)
    return str(value).encode()


@lru_cache(maxsize=256)
def _numbered(sql: str) -> bytes:
    """`?` placeholders (outside quoted text) as PostgreSQL's $1, $2, ..."""
    n = 0

    def number(m: re.Match[str]) -> str:
        nonlocal n
        if m.group(0) != "?":
            return m.group(0)  # a quoted literal or identifier, unchanged
        n += 1
        return f"${n}"

    return re.sub(r"'[^']*'|\"[^\"]*\"|\?", number, sql).encode()


class Rows:
    """A statement's rows, all fetched already (the `Cursor` the owner's code reads)."""

    __slots__ = ("_at", "_rows")

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows, self._at = rows, 0

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._at = self._rows[self._at :], len(self._rows)
        return rows


class PgConnection:
    """One connection (autocommit: BEGIN and COMMIT are explicit) running `?` SQL through libpq."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self._escaping = pq.Escaping(self.pgconn)
        self._prepared: dict[str, bytes] = {}  # SQL -> the name of its server-side prepared statement

    @property
    def broken(self) -> bool:
        return self.conn.closed or self.pgconn.status != pq.ConnStatus.OK

    def close(self) -> None:
        self.conn.close()

    def literal(self, text: str) -> bytes:
        return bytes(self._escaping.escape_literal(text.encode()))

    def simple(self, query: bytes) -> Rows:
        """One or several statements without parameters, as one simple query (one round trip)."""
        return self._rows(self.pgconn.exec_(query))

    def execute(self, sql: str, args: Sequence[object] = (), /) -> Rows:
        if not args:
            return self.simple(sql.encode())
        name = self._prepared.get(sql)
        if name is None:
            name = b"feedlog_%d" % len(self._prepared)
            self._check(self.pgconn.prepare(name, _numbered(sql)))
            self._prepared[sql] = name
        values = [_encode(a) for a in args]  # None is SQL NULL (libpq takes it; the stub says Buffer)
        return self._rows(self.pgconn.exec_prepared(name, values))  # type: ignore[arg-type]

    def _check(self, result: pq.abc.PGresult) -> None:
        if result.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.BAD_RESPONSE, pq.ExecStatus.NONFATAL_ERROR):
            raise errors.error_from_result(result, encoding=self.conn.info.encoding)

    def _rows(self, result: pq.abc.PGresult) -> Rows:
        self._check(result)
        if result.status != pq.ExecStatus.TUPLES_OK:
            return Rows([])
        decode = [_decoder(result.ftype(j)) for j in range(result.nfields)]
        get = result.get_value
        return Rows(
            [
                tuple(None if (v := get(i, j)) is None else decode[j](v) for j in range(len(decode)))
                for i in range(result.ntuples)
            ]
        )


class PostgresDatabase(Database):
    errors = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(redact(url))
        self.url = url

    def _connect(self) -> Connection:
        return PgConnection(psycopg.connect(self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT))

    def _broken(self, conn: Connection) -> bool:
        return not isinstance(conn, PgConnection) or conn.broken

    @contextmanager
    def _exclusive(self, tx: Tx, keys: Sequence[str], durable: bool) -> Iterator[None]:
        conn = tx.conn
        assert isinstance(conn, PgConnection)
        # one round trip: BEGIN and the locks as one simple query, the keys quoted by libpq, in
        # one order everywhere so that two writers cannot deadlock
        locks = [b"SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))" % conn.literal(k) for k in sorted(set(keys))]
        if not durable:  # an asynchronous commit: WAL order makes the next synchronous one flush it
            locks.append(b"SET LOCAL synchronous_commit TO off")
        try:
            conn.simple(b"; ".join([b"BEGIN", *locks]))
        except psycopg.Error as e:
            self._rollback(conn)
            raise Unavailable(f"commit owner database {self.name}: {one_line(e)}") from None
        try:
            yield
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.simple(b"COMMIT")
        except psycopg.Error as e:
            self._rollback(conn)
            raise Unavailable(f"commit owner database {self.name}: {one_line(e)}") from None

    @staticmethod
    def _rollback(conn: PgConnection) -> None:
        with suppress(psycopg.Error):  # the connection is gone: so is the transaction
            conn.simple(b"ROLLBACK")

    def setup(self) -> None:
        with self.transaction([_SETUP_KEY]) as tx:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    tx.execute(statement)
