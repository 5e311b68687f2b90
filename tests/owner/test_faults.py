"""Crashes and concurrency with real processes: `feedlog owner serve`, writer processes killed at fail points.

Each runs with the owner's state in SQLite and in PostgreSQL (`state`: a file, or a schema of the
test's own; the PostgreSQL runs are skipped, saying why, when no server answers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.managed import COMMITS_DIR, OWNER_ENV, Binding, LocalOwner, TableRef, resolve_owner
from feedlog.errors import Unavailable
from feedlog.failpoints import EXIT_CODE
from tests.conftest import postgres_dsn
from tests.delta.conftest import deltalake_read, deltalake_version
from tests.replication.test_shutdown import free_port

from .conftest import SCHEMA, batch, owner_process, stop_owner

WRITER = """
import sys, pyarrow as pa
from feedlog.delta import DeltaTable
path, token, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t = DeltaTable.open(path, owner_token=token)
for i in range(n):
    r = t.append(pa.table({"id": pa.array([who * 1000 + i], pa.int64()), "who": [f"w{who}"]}))
    print(r.version, flush=True)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the owner keeps its state: a SQLite file or a PostgreSQL URL (the table names either)."""
    return request.getfixturevalue("postgres_url") if request.param == "postgresql" else str(tmp_path / "owner.db")


def stop(proc: subprocess.Popen[bytes]) -> None:
    stop_owner(proc)


def writer(path: Path, token: str, who: int, n: int, failpoints: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "FEEDLOG_FAILPOINTS": failpoints}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), token, str(who), str(n)], env=env, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_writer_processes_through_the_grpc_owner(tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv(OWNER_ENV, f"grpc://127.0.0.1:{port}")  # the writer processes trust it too
    owner = owner_process(state, tmp_path, port)
    try:
        t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.parse(f"grpc://127.0.0.1:{port}", 4))
        assert t.owner_token
        procs = [writer(tmp_path / "t", t.owner_token, w, 10) for w in range(4)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4
        versions = sorted(int(v) for out in outs for v in out.split())
        assert versions == list(range(1, 41))  # each version ratified once, no gaps, no lost append
        t.backfill()
        ids = sorted(deltalake_read(tmp_path / "t").column("id").to_pylist())
        assert ids == sorted(w * 1000 + i for w in range(4) for i in range(10))
    finally:
        stop(owner)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["managed.staged", "managed.answered"])
def test_writer_killed_around_the_ratification(
    tmp_path: Path, state: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after staging (never ratified: invisible) or after the owner ratified (kept, then backfilled).
    The owner runs in the writer processes, its state shared through the SQLite file or PostgreSQL."""
    monkeypatch.setenv(OWNER_ENV, state)  # the writer processes and fresh readers trust it
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.feedlog(db=state, batch_size=100))
    assert t.owner_token
    doomed = writer(tmp_path / "t", t.owner_token, 1, 1, f"{point}=exit")
    doomed.communicate(timeout=60)
    assert doomed.returncode == EXIT_CODE
    staged = os.listdir(tmp_path / "t" / COMMITS_DIR)
    assert len(staged) == 1
    fresh = DeltaTable.open(tmp_path / "t")
    ratified = point == "managed.answered"
    assert fresh.version() == (1 if ratified else 0)
    assert deltalake_version(tmp_path / "t") == 0  # outside readers never see what is not backfilled
    later = writer(tmp_path / "t", t.owner_token, 2, 1)
    out, _ = later.communicate(timeout=60)
    assert later.returncode == 0 and int(out) == (2 if ratified else 1)
    t.backfill()
    ids = sorted(deltalake_read(tmp_path / "t").column("id").to_pylist())
    assert ids == ([1000, 2000] if ratified else [2000])
    assert os.listdir(tmp_path / "t" / COMMITS_DIR) == []  # the orphan staged file is cleaned up too


@pytest.mark.slow
def test_owner_killed_mid_backfill_finishes_it_on_restart(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv(OWNER_ENV, f"grpc://127.0.0.1:{port}")
    owner = owner_process(state, tmp_path, port, {"FEEDLOG_FAILPOINTS": "owner.backfilled_one=exit@3"})
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.parse(f"grpc://127.0.0.1:{port}", 5))
    assert t.owner_token
    w = writer(tmp_path / "t", t.owner_token, 1, 5)
    out, _ = w.communicate(timeout=120)
    # the 5th commit was ratified, then the owner died copying versions 1-5 to _delta_log (in the
    # background, once the 5th commit made a batch): its writer either had the answer already or
    # could not learn the outcome and says so (exit 1); either way nothing was committed twice
    assert owner.wait(30) == EXIT_CODE
    answered = ["1", "2", "3", "4", "5"] if w.returncode == 0 else ["1", "2", "3", "4"]
    assert out.split() == answered
    assert deltalake_version(tmp_path / "t") == 3  # versions 1-3 were copied before the crash
    owner = owner_process(state, tmp_path, port)  # restart: it completes the backfill before serving
    try:
        assert deltalake_version(tmp_path / "t") == 5
        assert sorted(deltalake_read(tmp_path / "t").column("id").to_pylist()) == [1000 + i for i in range(5)]
        assert DeltaTable.open(tmp_path / "t").version() == 5
    finally:
        stop(owner)


@pytest.mark.slow
def test_owner_killed_between_ratifying_and_answering(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner dies once version 3's ratification is committed to its database, before it answers or
    backfills: the writer cannot learn the outcome and says so; the restarted owner has kept the
    commit (durable before any answer) and backfills it, once."""
    port = free_port()
    monkeypatch.setenv(OWNER_ENV, f"grpc://127.0.0.1:{port}")
    owner = owner_process(state, tmp_path, port, {"FEEDLOG_FAILPOINTS": "owner.ratified=exit@3"})
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.parse(f"grpc://127.0.0.1:{port}", 1))
    assert t.owner_token
    w = writer(tmp_path / "t", t.owner_token, 1, 3)
    out, _ = w.communicate(timeout=120)
    assert owner.wait(30) == EXIT_CODE
    assert w.returncode != 0 and out.split() == ["1", "2"]
    # version 3 is ratified, not yet backfilled; 1 and 2 are copied in the background, so on a
    # loaded machine 2 (or 1) may still be waiting for it when the owner dies
    assert deltalake_version(tmp_path / "t") < 3
    owner = owner_process(state, tmp_path, port)  # restart: it backfills what it ratified first
    try:
        assert deltalake_version(tmp_path / "t") == 3
        later = writer(tmp_path / "t", t.owner_token, 2, 1)
        out, _ = later.communicate(timeout=60)
        assert later.returncode == 0 and out.split() == ["4"]
        ids = sorted(deltalake_read(tmp_path / "t").column("id").to_pylist())
        assert ids == [1000, 1001, 1002, 2000]  # the uncertain commit is there exactly once
        assert os.listdir(tmp_path / "t" / COMMITS_DIR) == []
    finally:
        stop(owner)


def test_the_owners_postgresql_connection_dies_under_it(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the owner's connection (a restart, a failover, an administrator): the call
    that finds it dead fails Unavailable, on one line; the next one reconnects and nothing is lost."""
    import psycopg

    monkeypatch.setenv(OWNER_ENV, postgres_url)
    binding = Binding.feedlog(db=postgres_url, batch_size=100)
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=binding)
    t.append(batch([1]))
    owner = resolve_owner(binding)
    assert isinstance(owner, LocalOwner)
    ref = TableRef(t.snapshot().metadata.id, t.storage.location)
    (pid,) = owner.database.read("SELECT pg_backend_pid()")[0]  # this thread's connection
    with psycopg.connect(postgres_dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the backend did not end"
            time.sleep(0.01)
    with pytest.raises(Unavailable, match="commit owner database") as e:
        owner.get_commits(ref, 0)
    assert "\n" not in str(e.value)  # libpq says it on three lines
    assert owner.get_commits(ref, 0).latest == 1  # reconnected
    assert t.append(batch([2])).version == 2
    assert sorted(DeltaTable.open(tmp_path / "t").to_arrow().column("id").to_pylist()) == [1, 2]
    owner.close()
