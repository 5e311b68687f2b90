"""Readers cross-check (issue 40): an ingest with witnesses lands nothing from a forked feed and records the
witnesses that agreed; audit names a table holding two histories of one key."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.delta import DeltaTable
from feedlog.errors import Fork, InvalidArgument
from feedlog.lake.audit import audit_table
from feedlog.lake.rows import SCHEMA
from feedlog.lake.sink import app_id
from feedlog.lake.source import FeedBatchReader
from feedlog.log import forks
from feedlog.log.feed import Feed, Write
from feedlog_server.app import PeerServer

from .conftest import KEY_A
from .test_audit import rows_of


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[Callable[..., PeerServer]]:
    """Real peers on loopback, each serving tmp_path/NAME (as tests/replication's fixture)."""
    started: list[PeerServer] = []

    def start(name: str) -> PeerServer:
        started.append(PeerServer(tmp_path / name, "127.0.0.1:0").start())
        return started[-1]

    yield start
    for p in reversed(started):
        p.stop(grace=1)


def history(path: Path, tag: str, n: int, batch: int = 1) -> None:
    with Feed.create(path, key_pair=KEY_A, timestamps="off") as feed:
        for lo in range(0, n, batch):
            feed.append([Write(f"/{tag}{i}", tag.encode()) for i in range(lo, min(lo + batch, n))])


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_ingest_with_a_witness_of_another_history_lands_nothing(
    peers: Callable[..., PeerServer], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history(tmp_path / "p1" / "feed", "a", 8)
    history(tmp_path / "p2" / "feed", "b", 5)
    history(tmp_path / "p3" / "feed", "a", 3)  # a prefix of A
    p1, p2, p3 = peers("p1"), peers("p2"), peers("p3")
    src = f"grpc://{p1.address}/{KEY_A.public_key.hex()}"
    table = tmp_path / "table"
    code, _, err = run(capsys, "ingest", src, str(table), "--witness", f"grpc://{p2.address}", "--engine", "local")
    assert code == 5 and "forked" in err, err
    assert not table.exists() or not DeltaTable.open(table).to_arrow().num_rows  # nothing landed
    # an agreeing witness is recorded in the commit's provenance, at the signed length it agreed with
    w = f"grpc://{p3.address}"
    code, out, err = run(capsys, "ingest", src, str(table), "--witness", w, "--engine", "local", "--json")
    assert code == 0, err
    info = DeltaTable.open(table).history()[0].commit_info
    (agreed,) = info["feedlog"]["witnesses"][KEY_A.public_key.hex()]
    assert agreed["witness"] == w and agreed["length"] == 4 and json.loads(out)["rows"] == 8


def test_audit_names_a_table_holding_two_histories_of_one_key(tmp_path: Path) -> None:
    history(tmp_path / "a", "a", 20, batch=5)
    history(tmp_path / "b", "b", 20, batch=5)  # the same lengths signed, other trees
    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    t.append(rows_of(tmp_path / "a", 1, 11), txn=(app_id(KEY_A.public_key.hex()), 11))
    t.append(rows_of(tmp_path / "b", 6, 21))  # rows of the other history, some at lengths already signed
    r = audit_table(str(tmp_path / "table"), [KEY_A.public_key])
    (f,) = r.feeds
    assert not r.ok and f.forks and "forked" in f.forks[0]
    assert "FORKED" in f.summary() and f.to_json()["forks"] == f.forks
    # each named fork is a proof that checks with the key alone
    with Feed.open(tmp_path / "a", writable=False) as a, Feed.open(tmp_path / "b", writable=False) as b:
        forks.verify(forks.of_states(KEY_A.public_key, a.core.state, b.core.state))


def test_the_spark_source_checks_its_witnesses_on_the_driver(peers: Callable[..., PeerServer], tmp_path: Path) -> None:
    history(tmp_path / "a", "a", 6)  # read from its directory
    history(tmp_path / "pb" / "feed", "b", 6)
    history(tmp_path / "pa" / "feed", "a", 9)  # A, further on
    pb, pa = peers("pb"), peers("pa")
    with pytest.raises(Fork, match="forked"):
        FeedBatchReader({"feed": str(tmp_path / "a"), "witnesses": f"grpc://{pb.address}"})
    r = FeedBatchReader({"feed": str(tmp_path / "a"), "witnesses": f"grpc://{pa.address}"})
    assert [(p.start, p.end) for p in r.partitions()] == [(1, 7)]
    with pytest.raises(InvalidArgument, match="grpc://"):
        FeedBatchReader({"feed": str(tmp_path / "a"), "witnesses": "127.0.0.1:1"})


@pytest.mark.slow
def test_a_spark_ingest_records_its_witnesses(peers: Callable[..., PeerServer], tmp_path: Path) -> None:
    """The same through a Spark job: the sink's `witnesses` option reaches the committing worker."""
    history(tmp_path / "p1" / "feed", "a", 5)
    history(tmp_path / "p2" / "feed", "a", 5)  # the same history: agrees
    p1, p2 = peers("p1"), peers("p2")
    w = f"grpc://{p2.address}"
    table = tmp_path / "table"
    src = f"grpc://{p1.address}/{KEY_A.public_key.hex()}"
    args = ["ingest", src, str(table), "--witness", w, "--engine", "spark", "--master", "local[1]", "--json"]
    p = subprocess.run(
        [sys.executable, "-m", "feedlog.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    info = DeltaTable.open(table).history()[0].commit_info
    assert info["feedlog"]["witnesses"] == {
        KEY_A.public_key.hex(): [
            {"witness": w, "length": 6, "tree_hash": info["feedlog"]["feeds"][0]["signed"]["tree_hash"]}
        ]
    }
