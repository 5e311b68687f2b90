"""Both commit owners, on both state engines, behind one fixture, so one behaviour suite runs against each.

`local`: the in-process owner (SQLite file) a table names by its database path.
`local-pg`: the in-process owner on PostgreSQL, a table naming it by `db=postgresql://...`.
`grpc`: `OwnerServer` on 127.0.0.1 (a free port), the same engine behind gRPC.
`grpc-pg`: `OwnerServer` with its state on PostgreSQL, in a schema of its own.

PostgreSQL comes from tests/conftest.py (`postgres_url`: a fresh schema on
`$FEEDLOG_TEST_POSTGRES` or the local server; skipped, saying why, when neither answers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.managed import OWNER_ENV, Binding, CommitOwner, resolve_owner
from feedlog.delta.managed.client import GrpcOwner
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.managed.turns import Turns
from feedlog_server.owner import OwnerServer

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
    #: the served owner, if any: it backfills in the background
    server: OwnerServer | None = None

    def settle(self) -> None:
        """Wait until the served owner's background backfill is done (the in-process owner backfills
        before it answers): what a test then sees in `_delta_log` is what the batch size says."""
        if self.server is not None:
            assert self.server.owner.backfill_idle(20), "background backfill did not finish"

    @property
    def turns(self) -> Turns:
        """The owner's line of writers that lost races (turns.py), in process or behind the server."""
        api = self.server.owner if self.server is not None else self.api
        assert isinstance(api, LocalOwner)
        return api.turns

    def binding(self, batch_size: int | None = None) -> Binding:
        if self.endpoint is not None:
            return Binding.feedlog(endpoint=self.endpoint, batch_size=batch_size)
        return Binding.feedlog(db=str(self.db), batch_size=batch_size)

    def create(self, name: str = "t", batch_size: int | None = None, **kw: Any) -> DeltaTable:
        return DeltaTable.create(self.root / name, SCHEMA, owner=self.binding(batch_size), **kw)


@pytest.fixture(params=["local", "local-pg", "grpc", "grpc-pg"])
def owner(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Owner]:
    root, db = tmp_path / "tables", tmp_path / "owner.db"
    root.mkdir()
    if request.param == "local-pg":
        # the in-process owner on PostgreSQL: tables name it as db=postgresql://... (no password)
        url = request.getfixturevalue("postgres_url")
        monkeypatch.setenv(OWNER_ENV, url)
        o = Owner("local-pg", root, url, None, resolve_owner(Binding.feedlog(db=url)))
        yield o
        o.api.close()
        return
    if request.param == "grpc-pg":
        url = request.getfixturevalue("postgres_url")
        server = OwnerServer(url, "127.0.0.1:0", roots=[root]).start()
        monkeypatch.setenv(OWNER_ENV, server.endpoint)
        try:
            yield Owner("grpc-pg", root, url, server.endpoint, GrpcOwner(server.endpoint, timeout=10), server)
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
        yield Owner("grpc", root, db, server.endpoint, GrpcOwner(server.endpoint, timeout=10), server)
    finally:
        server.stop(grace=1)


def stop_owner(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM, then wait for the exit while reading its stderr (unread, a full pipe would block its
    last writes); if it does not exit in time, kill it and fail with what it wrote (the server dumps
    every thread's stack when a stop takes long, and again if it cannot exit)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"the owner did not exit within {timeout:.0f} s of SIGTERM; its stderr:\n"
            + (err or b"").decode(errors="replace")[-6000:]
        ) from None


def owner_process(
    db: str,
    root: Path | str,
    port: int,
    env: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A real `feedlog owner serve` process on 127.0.0.1:`port`, returned once it answers; `root` is a
    directory or an object-store prefix (reached with the owner's own `storage_options`)."""
    cmd = [sys.executable, "-m", "feedlog", "owner", "serve", "--db", db]
    cmd += ["--listen", f"127.0.0.1:{port}", "--root", str(root)]
    cmd += [a for k, v in (storage_options or {}).items() for a in ("--storage-option", f"{k}={v}")]
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
