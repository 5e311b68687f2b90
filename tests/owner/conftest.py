"""Both commit owners, on both state engines, behind one fixture, so one behaviour suite runs against each.

`local`: the in-process owner (SQLite file) a table names by its database path.
`grpc`: `OwnerServer` on 127.0.0.1 (a free port), the same engine behind gRPC.
`grpc-pg`: `OwnerServer` with its state on PostgreSQL, in a schema of its own.

PostgreSQL is `$FEEDLOG_TEST_POSTGRES` (a DSN), else the local server
(`postgresql://postgres@127.0.0.1:5432/test`) if it answers; tests that need it
are skipped, saying why, when neither is reachable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import psycopg
import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.managed import OWNER_ENV, Binding, CommitOwner, resolve_owner
from feedlog.delta.managed.client import GrpcOwner
from feedlog_server.owner import OwnerServer

POSTGRES_ENV = "FEEDLOG_TEST_POSTGRES"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
_postgres: list[str | None] = []  # probed once per session


def postgres_dsn() -> str:
    """The PostgreSQL server the tests use; skips the test, saying why, when there is none."""
    if not _postgres:
        dsn = os.environ.get(POSTGRES_ENV) or DEFAULT_POSTGRES
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            _postgres.append(dsn)
        except psycopg.Error as e:
            _postgres.append(None)
            _postgres.append(f"no PostgreSQL at {dsn} (set {POSTGRES_ENV} to a DSN): {str(e).strip()}")
    if _postgres[0] is None:
        pytest.skip(str(_postgres[1]))
    return _postgres[0]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A DSN whose tables live in a fresh schema, dropped afterwards (runs never see each other)."""
    dsn = postgres_dsn()
    schema = f"feedlog_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string())])


def batch(ids: range | list[int], who: str = "w") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "who": [who] * len(ids)})


@dataclass
class Owner:
    kind: str
    root: Path
    db: Path | str  # a SQLite file or a PostgreSQL URL
    endpoint: str | None
    api: CommitOwner

    def binding(self, batch_size: int | None = None) -> Binding:
        if self.endpoint is not None:
            return Binding.feedlog(endpoint=self.endpoint, batch_size=batch_size)
        return Binding.feedlog(db=str(self.db), batch_size=batch_size)

    def create(self, name: str = "t", batch_size: int | None = None, **kw: Any) -> DeltaTable:
        return DeltaTable.create(self.root / name, SCHEMA, owner=self.binding(batch_size), **kw)


@pytest.fixture(params=["local", "grpc", "grpc-pg"])
def owner(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Owner]:
    root, db = tmp_path / "tables", tmp_path / "owner.db"
    root.mkdir()
    if request.param == "grpc-pg":
        url = request.getfixturevalue("postgres_url")
        server = OwnerServer(url, "127.0.0.1:0", roots=[root]).start()
        monkeypatch.setenv(OWNER_ENV, server.endpoint)
        try:
            yield Owner("grpc-pg", root, url, server.endpoint, GrpcOwner(server.endpoint, timeout=10))
        finally:
            server.stop(grace=1)
        return
    if request.param == "local":
        # tables and processes in these tests trust this owner (readers ask only a trusted owner)
        monkeypatch.setenv(OWNER_ENV, str(db))
        o = Owner("local", root, db, None, resolve_owner(Binding.feedlog(db=str(db))))
        yield o
        o.api.close()
        return
    server = OwnerServer(db, "127.0.0.1:0", roots=[root]).start()
    monkeypatch.setenv(OWNER_ENV, server.endpoint)
    try:
        yield Owner("grpc", root, db, server.endpoint, GrpcOwner(server.endpoint, timeout=10))
    finally:
        server.stop(grace=1)


def owner_process(db: str, root: Path, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real `feedlog owner serve` process on 127.0.0.1:`port`, returned once it answers."""
    cmd = [sys.executable, "-m", "feedlog", "owner", "serve", "--db", db]
    cmd += ["--listen", f"127.0.0.1:{port}", "--root", str(root)]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        while time.monotonic() < deadline:
            try:
                grpc.channel_ready_future(ch).result(timeout=0.5)
                return proc
            except grpc.FutureTimeoutError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.kill()
    raise AssertionError("the owner did not start")
