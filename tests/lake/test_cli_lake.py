"""`feedlog ingest` / `expire` as a user runs them: the real command in its own process, real Spark.

What is checked is what the user sees: one line per outcome, the exit code of the error's kind,
no traceback, no JVM noise, and no Spark at all where the answer is known without it (those runs
get `--master nonsense://`, which would fail the command if it started Spark). A small ingest
lands in the command's own process (`--engine auto`); `--engine spark` makes it a Spark job.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.lake.audit import audit_table
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

from .conftest import KEY_A, append, make_feed
from .test_spark import seqs, tampering_peer

pytestmark = pytest.mark.slow
NO_SPARK = ("--master", "nonsense://")  # a command that starts Spark with this fails
WAIT_S = 300  # for one command with its own Spark on a loaded 2-core machine


def feedlog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "feedlog.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=WAIT_S,
    )


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    """The command's stderr, which must be exactly one `feedlog: error:` line after the progress
    lines a long command prints there when it is not a terminal."""
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("feedlog: ingest: ")]
    assert len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith("feedlog: error: "), p.stderr
    return lines[0].removeprefix("feedlog: error: ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServer]:
    server = PeerServer(tmp_path / "peer").start()
    yield server
    server.stop(grace=1)


def test_ingest_then_reruns_with_nothing_to_do_say_so_in_one_line_without_spark(tmp_path: Path) -> None:
    make_feed(tmp_path / "feed", 3, batch=3).close()
    table = tmp_path / "table"
    # 3 entries: no Spark; progress lines (after ~2 s on a loaded machine) are not what this checks
    first = feedlog("ingest", str(tmp_path / "feed"), str(table), "--json", env={"FEEDLOG_PROGRESS_EVERY": "3600"})
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(first.stdout.splitlines()[-1])
    assert (result["version"], result["rows"], result["engine"]) == (1, 3, "local")
    assert first.stderr == ""  # no warning, no JVM noise
    assert seqs(table) == [1, 2, 3]
    assert audit_table(str(table), [KEY_A.public_key]).ok

    again = feedlog("ingest", str(tmp_path / "feed"), str(table), *NO_SPARK)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == [
        f"nothing new: feed {KEY_A.public_key.hex()[:16]}... ({tmp_path / 'feed'}) already landed up to seq 3"
    ]
    assert again.stderr == ""
    as_json = feedlog("ingest", str(tmp_path / "feed"), str(table), "--json", *NO_SPARK)
    assert as_json.returncode == 0 and as_json.stderr == ""
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == [
        {"version": None, "rows": 0, "seconds": 0.0, "ict": None}
    ]
    stream = feedlog("ingest", str(tmp_path / "feed"), str(table), "--stream", "--available-now", *NO_SPARK)
    assert stream.returncode == 0 and len(stream.stdout.splitlines()) == 1 and "nothing new" in stream.stdout
    expire = feedlog("expire", str(table), *NO_SPARK)  # no row has a TTL: the files' stats say so
    assert (expire.returncode, expire.stdout, expire.stderr) == (0, "nothing expired\n", "")
    assert DeltaTable.open(table).version() == 1


def test_expire_of_a_small_table_runs_without_spark_and_says_so(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 0)
    append(feed, 20, ttl=1)  # expired a millisecond after each was written
    feed.close()
    table = tmp_path / "table"
    ingested = feedlog("ingest", str(tmp_path / "feed"), str(table))
    assert ingested.returncode == 0, ingested.stderr[-3000:]
    # the entries and about how many bytes they are decide where it runs (~30 B a block here)
    assert re.search(r"^landing here without Spark \(20 entries, ~\d{3} B; --engine spark", ingested.stdout, re.M)
    assert ": 20 entries in " in ingested.stdout
    refused = feedlog("expire", str(table), "--engine", "local", "--master", "local[1]")
    assert (refused.returncode, one_error_line(refused)) == (2, "--master is for --engine spark")
    done = feedlog("expire", str(table))
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert done.stdout == (
        "version 2: 20 expired rows cleared in 1 rewritten file"
        " (without Spark; --engine spark runs it as a Spark job)\n"
    )
    # again: the file's stats still say it may hold expired rows, so it is read (here), and nothing is cleared
    assert json.loads(feedlog("expire", str(table), "--json").stdout) == {
        "version": None,
        "files_rewritten": 0,
        "rows_cleared": 0,
        "engine": "local",
    }
    assert audit_table(str(table), [KEY_A.public_key]).ok


def test_a_table_of_another_schema_is_refused_before_spark_naming_the_columns(tmp_path: Path) -> None:
    make_feed(tmp_path / "feed", 3, batch=3).close()
    other = tmp_path / "other"
    DeltaTable.create(other, pa.schema([("seq", pa.int64()), ("key", pa.string())]))
    p = feedlog("ingest", str(tmp_path / "feed"), str(other), *NO_SPARK)
    assert p.returncode == 2  # SchemaMismatch is an InvalidArgument
    message = one_error_line(p)
    assert "not a table of feed rows" in message and "'value'" in message and "'leaf_hash'" in message


def test_a_peer_that_is_down_fails_fast_without_spark(tmp_path: Path) -> None:
    source = f"grpc://127.0.0.1:{free_port()}/{KEY_A.public_key.hex()}"
    t0 = time.monotonic()
    p = feedlog("ingest", source, str(tmp_path / "table"), *NO_SPARK)
    assert p.returncode == 8  # Unavailable
    assert "127.0.0.1" in one_error_line(p)
    assert time.monotonic() - t0 < 60  # (seconds in fact; Spark alone used to take longer than this)
    assert not (tmp_path / "table").exists()


def test_a_failure_inside_a_spark_task_is_the_feedlog_error_behind_it(tmp_path: Path, peer: PeerServer) -> None:
    """A peer that serves a block that does not hash to its signed tree: the executor's Corruption,
    with its own exit code (5) and message, not "the Spark job failed"."""
    feed = make_feed(tmp_path / "feed", 300, batch=100)
    feed.close()
    push(tmp_path / "feed", Address.parse(f"grpc://{peer.address}"), token=peer.token)
    peer.stop(grace=1)
    with tampering_peer(tmp_path / "peer", victim=150) as port:
        table = tmp_path / "table"
        p = feedlog("ingest", f"grpc://127.0.0.1:{port}/{KEY_A.public_key.hex()}", str(table), "--engine", "spark")
        assert p.returncode == 5, p.stderr[-3000:]
        message = one_error_line(p)
        assert "do not hash to the signed tree" in message and "Spark" not in message
        assert not table.exists() or seqs(table) == []
        assert "incubator" not in p.stderr  # the JVM's start-up warning is filtered out
        # not a terminal: progress is a line on stderr every 5 s (Spark alone takes longer than that to start)
        assert any(ln.startswith("feedlog: ingest: ") and "of 300 entries" in ln for ln in p.stderr.splitlines())
        assert not list(table.glob("*.parquet"))  # the other tasks' files went with the failed job

        here = feedlog("ingest", f"grpc://127.0.0.1:{port}/{KEY_A.public_key.hex()}", str(table))  # the same, no Spark
        assert here.returncode == 5, here.stderr[-3000:]
        assert one_error_line(here) == message
        assert seqs(table) == [] and not list(table.glob("*.parquet"))


def test_a_peer_gone_once_spark_runs_is_the_peers_error(tmp_path: Path, peer: PeerServer) -> None:
    """The peer answers the plan, then stops before Spark's reader reaches it: the reader's
    Unavailable, naming the peer, comes out of the Spark job."""
    make_feed(tmp_path / "feed", 50, batch=10).close()
    push(tmp_path / "feed", Address.parse(f"grpc://{peer.address}"), token=peer.token)
    source = f"grpc://{peer.address}/{KEY_A.public_key.hex()}"
    job = subprocess.Popen(
        [sys.executable, "-m", "feedlog.cli", "ingest", source, str(tmp_path / "table"), "--engine", "spark"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None
        planned = job.stdout.readline()  # printed once the plan asked the peer, before Spark reads it
        assert "seqs 1..50, 50 new" in planned, planned
        peer.stop(grace=0)
        out, err = job.communicate(timeout=WAIT_S)
    finally:
        if job.poll() is None:
            job.kill()
    p = subprocess.CompletedProcess(job.args, job.returncode, planned + out, err)
    assert p.returncode == 8, p.stderr[-3000:]
    message = one_error_line(p)
    assert peer.address in message and "the Spark job failed" not in message
