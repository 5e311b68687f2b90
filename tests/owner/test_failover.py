"""One owner, several processes: `grpc://h1:7070,h2:7070` endpoint lists, the trust they need, and
two `feedlog owner serve` processes on one PostgreSQL database with a killed one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.managed import OWNER_ENV, Auth, Binding, TableRef
from feedlog.delta.managed.client import GrpcOwner
from feedlog.delta.managed.protocol import is_trusted, owner_endpoints
from feedlog.errors import InvalidArgument, Unavailable
from feedlog_server.owner import OwnerServer
from tests.replication.test_shutdown import free_port

from .conftest import SCHEMA, batch, owner_process, stop_owner


def test_endpoint_lists_name_each_member() -> None:
    assert owner_endpoints("grpc://h1:7070,h2:7071") == ("grpc://h1:7070", "grpc://h2:7071")
    assert owner_endpoints("grpc://h1:7070") == ("grpc://h1:7070",)
    for bad in ("grpc://h1:7070,", "grpc://h1:7070,h2", "grpc://h1:7070,,grpc://h2:1"):
        with pytest.raises(InvalidArgument):
            Binding.parse(bad)
    assert Binding.parse("grpc://h1:7070,h2:7071").config["endpoint"] == "grpc://h1:7070,h2:7071"


def test_a_list_is_trusted_only_when_every_member_is() -> None:
    both = Binding.parse("grpc://h1:7070,h2:7070")
    h1, h2, h3 = (Binding.parse(f"grpc://h{i}:7070") for i in (1, 2, 3))
    assert is_trusted(both, [h1, h2])
    assert is_trusted(both, [both])
    assert is_trusted(h1, [both])  # a trusted list vouches for each of its processes
    assert not is_trusted(both, [h1])  # commits could go to h2, which nobody vouched for
    assert not is_trusted(Binding.parse("grpc://h1:7070,h3:7070"), [both])
    assert not is_trusted(h3, [both])
    assert is_trusted(h1, [h1]) and not is_trusted(h1, [h2])


def test_feedlog_owner_may_name_an_endpoint_list_as_a_table_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """$FEEDLOG_OWNER=grpc://h1:7070,h2:7070 is one owner served by two processes (it was split into
    two owners, the second a file path 'h2:7070', and the list was then untrusted)."""
    from feedlog.delta.managed.protocol import env_owners, trusted_owners

    monkeypatch.setenv(OWNER_ENV, "grpc://h1:7070,h2:7071")
    assert trusted_owners(None) == (Binding.parse("grpc://h1:7070,h2:7071"),)
    assert is_trusted(Binding.parse("grpc://h1:7070,h2:7071"), trusted_owners(None))
    assert env_owners("grpc://h1:7070,grpc://h2:7071,/tmp/o.db") == ["grpc://h1:7070", "grpc://h2:7071", "/tmp/o.db"]
    assert env_owners("/tmp/a.db, grpc://x:1 ,y:2,") == ["/tmp/a.db", "grpc://x:1,y:2"]


def test_a_client_moves_on_from_an_endpoint_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tables"
    root.mkdir()
    dead = f"grpc://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    with OwnerServer(tmp_path / "owner.db", "127.0.0.1:0", roots=[root]) as server:
        endpoints = f"{dead},{server.endpoint}"
        monkeypatch.setenv(OWNER_ENV, endpoints)
        t = DeltaTable.create(root / "t", SCHEMA, owner=Binding.parse(endpoints, 2))
        for i in range(3):
            t.append(batch([i]))
        assert DeltaTable.open(root / "t").to_arrow().num_rows == 3
        client = GrpcOwner(endpoints, timeout=5)
        assert t.owner_token
        status = client.status(t.snapshot().metadata.id, Auth(t.owner_token))
        assert status.latest == 3 and str(client.address) == server.endpoint  # it stays where it was answered
        client.close()
    with pytest.raises(Unavailable):  # none answers: the caller learns it (and asks again later)
        GrpcOwner(endpoints, timeout=2).get_commits(TableRef("x", str(root / "t")), 0)


# ---- two owner processes, one PostgreSQL database --------------------------------------------------

WRITER = """
import json, sys, pyarrow as pa
from feedlog.delta import DeltaTable
from feedlog.delta.managed.client import GrpcOwner
path, token, endpoints, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
options = json.loads(sys.argv[6]) or None
GrpcOwner.shared(endpoints)._current = who % 2  # writers alternate between the owner processes
t = DeltaTable.open(path, owner_token=token, storage_options=options)
for i in range(n):
    r = t.append(pa.table({"id": pa.array([who * 1000 + i], pa.int64()), "who": [f"w{who}"]}))
    print(r.version, flush=True)
"""
WRITERS = 8


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", "s3"])
def test_two_owner_processes_on_one_database_and_one_killed(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch, store: str, request: pytest.FixtureRequest
) -> None:
    """8 writer processes, two owner processes on one PostgreSQL database, one owner killed mid-run:
    no version lost or ratified twice, every writer's sequence whole; on a local disk and on S3
    (where the owners reach the bucket with their own credentials, and the writers with theirs)."""
    options: dict[str, str] = {}
    if store == "s3":
        s3 = request.getfixturevalue("s3_server")
        options = s3.options
        root: str = f"s3://{s3.bucket}/failover-{uuid.uuid4().hex[:8]}"
        table = f"{root}/t"
    else:
        root, table = str(tmp_path), str(tmp_path / "t")
    ports = [free_port(), free_port()]
    endpoints = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
    monkeypatch.setenv(OWNER_ENV, endpoints)  # the writer processes trust both
    owners = [owner_process(postgres_url, root, p, storage_options=options) for p in ports]
    writers: list[subprocess.Popen[str]] = []
    try:
        t = DeltaTable.create(table, SCHEMA, owner=Binding.parse(endpoints, 4), storage_options=options or None)
        assert t.owner_token
        n = 12
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, table, t.owner_token, endpoints, str(w), str(n), json.dumps(options)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for w in range(WRITERS)
        ]
        first = writers[0].stdout.readline() if writers[0].stdout else ""  # the run is under way
        assert first.strip(), "the first writer committed nothing"
        owners[0].send_signal(signal.SIGKILL)  # kill -9 one owner mid-run
        outs = [(first if i == 0 else "") + w.communicate(timeout=300)[0] for i, w in enumerate(writers)]
        assert [w.returncode for w in writers] == [0] * WRITERS
        versions = sorted(int(v) for out in outs for v in out.split())
        assert versions == list(range(1, WRITERS * n + 1))  # each version ratified once: none lost, none twice
        assert t.backfill() == WRITERS * n  # through the surviving owner
        ids = sorted(read_ids(table, options))
        assert ids == sorted(w * 1000 + i for w in range(WRITERS) for i in range(n))  # every sequence whole
        # and no append committed twice: a repeated add of one file would hide in the rows above
        assert DeltaTable.open(table, storage_options=options or None).version() == WRITERS * n
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(20)
        for o in owners:
            stop_owner(o)


def read_ids(table: str, options: dict[str, str]) -> list[int]:
    """The ids as delta-rs reads the backfilled table (not our reader)."""
    import deltalake
    import pyarrow as pa

    dt = deltalake.DeltaTable(table, storage_options=options or None)
    got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("select id from t").read_all())
    return [int(i) for i in got.column("id").to_pylist()]
