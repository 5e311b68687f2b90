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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

import psycopg
from psycopg import sql

from ...errors import Unavailable
from .database import Connection, Database, Tx, is_postgres, redact

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


class PostgresDatabase(Database):
    errors = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(redact(url))
        self.url = url

    def _connect(self) -> Connection:
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT)
        return conn

    def _broken(self, conn: Connection) -> bool:
        return bool(getattr(conn, "closed", False) or getattr(conn, "broken", False))

    def translate(self, sql: str) -> str:
        return sql.replace("?", "%s")

    @contextmanager
    def _exclusive(self, tx: Tx, keys: Sequence[str]) -> Iterator[None]:
        # one round trip: BEGIN and the locks as one simple query (the keys quoted as literals)
        locks = [
            sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(sql.Literal(key))
            for key in sorted(set(keys))
        ]
        begin = sql.SQL("; ").join([sql.SQL("BEGIN"), *locks])
        try:
            tx.conn.execute(begin)
        except psycopg.Error as e:
            self._rollback(tx)
            raise Unavailable(f"commit owner database {self.name}: {e}") from None
        try:
            yield
        except BaseException:
            self._rollback(tx)
            raise
        try:
            tx.execute("COMMIT")
        except BaseException:
            self._rollback(tx)
            raise

    @staticmethod
    def _rollback(tx: Tx) -> None:
        with suppress(psycopg.Error):  # the connection is gone: so is the transaction
            tx.conn.execute("ROLLBACK")

    def setup(self) -> None:
        with self.transaction([_SETUP_KEY]) as tx:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    tx.execute(statement)
