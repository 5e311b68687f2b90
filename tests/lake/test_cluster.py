"""`feedlog ingest` on Spark with real executors: `local-cluster[2,1,1024]` starts two executor JVMs,
each with its own Python workers, that share nothing with the driver but the network and the disk.

The executors read the feeds from a peer over gRPC and write the data files; the committing worker
commits through the table's owner. A job whose committing worker dies before its commit lands
nothing; the rerun lands every entry exactly once. Each job is its own process (one SparkContext
per JVM), so this does not use the suite's shared local session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from feedlog.delta import DeltaTable
from feedlog.lake.audit import audit_table
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

from .conftest import KEY_A, KEY_B, make_feed

MASTER = "local-cluster[2,1,1024]"


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServer]:
    server = PeerServer(tmp_path / "peer").start()
    yield server
    server.stop()


def ingest(sources: list[str], table: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "feedlog.cli", "ingest", *sources, str(table), "--master", MASTER],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_ingest_with_executor_processes_lands_every_entry_once_across_a_dead_committer(
    tmp_path: Path, peer: PeerServer
) -> None:
    for name, n, kp in (("a", 300, KEY_A), ("b", 200, KEY_B)):
        make_feed(tmp_path / name, n, kp=kp).close()
        push(tmp_path / name, Address.parse(f"grpc://{peer.address}"), token=peer.token)
    sources = [f"grpc://{peer.address}/{kp.public_key.hex()}" for kp in (KEY_A, KEY_B)]
    table = tmp_path / "table"

    died = ingest(sources, table, {"FEEDLOG_FAILPOINTS": "sink.before_commit=exit"})
    assert died.returncode != 0, died.stdout
    assert "Traceback" not in died.stderr.split("feedlog: error:")[-1]
    assert DeltaTable.open(table).to_arrow().num_rows == 0  # created, nothing committed

    done = ingest(sources, table)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = DeltaTable.open(table).to_arrow().to_pylist()
    for kp, n in ((KEY_A, 300), (KEY_B, 200)):
        assert sorted(r["seq"] for r in rows if r["feed"] == kp.public_key.hex()) == list(range(1, n + 1))
    held = {a.path for a in DeltaTable.open(table).snapshot().files()}
    assert {p.name for p in table.glob("*.parquet")} == held  # the dead job's files were removed
    assert audit_table(str(table), [KEY_A.public_key, KEY_B.public_key]).ok
