"""`feedlog ingest` on Spark with real executors, into a managed table on an object store.

`local-cluster[2,1,1024]` starts two executor JVMs, each with its own Python workers, that share
nothing with the driver but the network: they read the feeds from a peer over gRPC and write the
data files to moto's S3 server (tests/delta/s3.py) with the storage options the job hands them.
The driver (the `feedlog ingest` process: `land` keeps the rows in the executors' Python workers)
commits through a commit owner served over gRPC, which reaches the bucket with credentials of its
own. Three things are killed on the way, and every entry still lands exactly once (the rerun after
them lands in the command's own process, without Spark):

1. the driver (the whole `feedlog ingest` process group) while executors have written files;
2. one executor JVM while its task stands at the same step (Spark reruns the task elsewhere);
3. the driver again, once every task is done, just before its commit.

Each job is its own process (one SparkContext per JVM), so this does not use the suite's shared
local session. A fail point holds every executor task after its files are written (`wait`, released
by a gate file), so each kill lands at a known step rather than by timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.managed import OWNER_ENV, Binding
from feedlog.failpoints import GATE_ENV
from feedlog.lake import FAST_START
from feedlog.lake.audit import audit_table
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer
from feedlog_server.owner import OwnerServer

from ..delta.s3 import S3Server, served_owner
from .conftest import KEY_A, KEY_B, make_feed

MASTER = "local-cluster[2,1,1024]"
TOKEN = "cluster-test-token"
EXECUTOR = "CoarseGrainedExecutorBackend"
WAIT_S = 300  # for any one step of a job (executor JVMs start slowly on a loaded machine); longer fails
T = TypeVar("T")


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServer]:
    server = PeerServer(tmp_path / "peer").start()
    yield server
    server.stop()


@pytest.fixture
def owner(tmp_path: Path, s3_server: S3Server) -> Iterator[OwnerServer]:
    """The commit owner, serving s3://lake/cluster with its own credentials."""
    with served_owner(s3_server, tmp_path, "cluster") as server:
        yield server


def start_ingest(
    sources: list[str],
    table: str,
    s3: S3Server,
    owner: OwnerServer,
    tmp_path: Path,
    env: dict[str, str],
    engine: tuple[str, ...] = ("--master", MASTER),
) -> subprocess.Popen[str]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    cmd = [sys.executable, "-m", "feedlog.cli", "ingest", *sources, table, *engine]
    cmd += ["--owner", owner.endpoint, "--token-file", str(token_file), "--json"]
    cmd += [a for k, v in s3.options.items() for a in ("--storage-option", f"{k}={v}")]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,  # its own process group: the driver, its JVM, executors and workers
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"ingest did not finish within 300 s: {err[-3000:]}")
    return proc.returncode, out, err


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its command line."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdlines[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = cmdlines.get(child, "")
            todo.append(child)
    return out


def wait_for(what: str, check: Callable[[], T], proc: subprocess.Popen[str]) -> T:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"ingest ended (exit {proc.returncode}) before {what}: {err[-3000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no {what} within {WAIT_S} s")


def data_files(s3: S3Server, prefix: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/")
    return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".parquet")]


@pytest.mark.slow
def test_ingest_on_a_cluster_into_s3_lands_every_entry_once_across_killed_driver_executor_and_committer(
    tmp_path: Path, peer: PeerServer, owner: OwnerServer, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, n, kp in (("a", 300, KEY_A), ("b", 200, KEY_B)):
        make_feed(tmp_path / name, n, kp=kp).close()
        push(tmp_path / name, Address.parse(f"grpc://{peer.address}"), token=peer.token)
    sources = [f"grpc://{peer.address}/{kp.public_key.hex()}" for kp in (KEY_A, KEY_B)]
    prefix = "cluster/table"
    table = f"s3://{s3_server.bucket}/{prefix}"
    monkeypatch.setenv(OWNER_ENV, owner.endpoint)  # this process reads the table through the owner too

    def rows() -> list[dict[str, Any]]:
        t = DeltaTable.open(table, owner=Binding.parse(owner.endpoint), storage_options=s3_server.options)
        got: list[dict[str, Any]] = t.to_arrow().to_pylist()
        return got

    # 1. the driver dies while the executors hold their written files
    gate = tmp_path / "gate-1"
    env = {"FEEDLOG_FAILPOINTS": "sink.written=wait", GATE_ENV: str(gate)}
    proc = start_ingest(sources, table, s3_server, owner, tmp_path, env)
    wait_for("data files from the executors", lambda: data_files(s3_server, prefix), proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert rows() == []  # the table was created; nothing was committed

    # 2. one executor dies holding its task; the task reruns elsewhere; 3. the driver dies before committing
    gate = tmp_path / "gate-2"
    env = {"FEEDLOG_FAILPOINTS": "sink.written=wait,sink.before_commit=exit", GATE_ENV: str(gate)}
    before = set(data_files(s3_server, prefix))
    proc = start_ingest(sources, table, s3_server, owner, tmp_path, env)
    wait_for("new data files", lambda: set(data_files(s3_server, prefix)) - before, proc)
    executors = wait_for(
        "two executors", lambda: {p: c for p, c in descendants(proc.pid).items() if EXECUTOR in c}, proc
    )
    # the test cluster's executors start with the driver's fast-start JVM settings (a third less CPU a job)
    assert all(FAST_START in c for c in executors.values()), executors
    os.kill(next(iter(executors)), signal.SIGKILL)
    gate.touch()
    code, out, err = finish(proc)
    assert code != 0, out
    assert "Traceback" not in err.split("feedlog: error:")[-1]
    assert rows() == []

    # the rerun lands every entry exactly once; it runs without Spark (500 entries: `--engine auto`
    # lands them in the command's process), so it also shows either kind of job finishes the other's
    code, out, err = finish(start_ingest(sources, table, s3_server, owner, tmp_path, {}, engine=()))
    assert code == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["rows"], result["engine"]) == (500, "local")
    landed = rows()
    for kp, n in ((KEY_A, 300), (KEY_B, 200)):
        assert sorted(r["seq"] for r in landed if r["feed"] == kp.public_key.hex()) == list(range(1, n + 1))
    report = audit_table(
        table,
        [KEY_A.public_key, KEY_B.public_key],
        owner=owner.endpoint,
        storage_options=s3_server.options,
    )
    assert report.ok
