"""`maintain`: one pass of the table's forgetting, in order, idempotent, beside a running ingest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable
from feedlog.delta.log import list_log
from feedlog.errors import BeforeRetainedHistory, InvalidArgument, Unavailable
from feedlog.lake.audit import audit_table
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.maintain import maintain, maintain_every
from feedlog.lake.sink import open_table
from feedlog.log.feed import Write

from .. import needle
from .conftest import KEY_A, append, make_feed

HOUR = 3_600_000
DAY = 24 * HOUR


def quiet(_m: str) -> None:
    pass


def _table(tmp_path: Path) -> tuple[Path, Path]:
    feed = make_feed(tmp_path / "feed", 40)
    append(feed, 30, ttl=60_000)  # expire a minute after they were written
    feed.close()
    table = tmp_path / "table"
    assert ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet).rows == 70
    return tmp_path / "feed", table


def test_a_pass_expires_checkpoints_and_is_idempotent(tmp_path: Path) -> None:
    _feed, table = _table(tmp_path)
    clock = ManualClock(SystemClock().now_ms() + 2 * HOUR)
    r = maintain(str(table), clock=clock, engine="local")
    assert r.rows_expired == 30 and r.expired_version is not None
    latest = DeltaTable.open(table).version()
    assert r.checkpoint == latest == r.expired_version
    assert latest in list_log(DeltaTable.open(table).storage).checkpoints
    rows = DeltaTable.open(table).to_arrow().to_pylist()
    assert sum(1 for x in rows if x["cleared"]) == 30 and all(x["value"] is None for x in rows if x["cleared"])
    assert audit_table(str(table), [KEY_A.public_key]).ok

    again = maintain(str(table), clock=clock, engine="local")  # nothing left to do: no commit, no file
    assert (again.expired_version, again.checkpoint, again.log_files_deleted) == (None, None, 0)
    assert DeltaTable.open(table).version() == latest

    # a month later the log before the checkpoint is past delta.logRetentionDuration (30 days)
    clock.advance(31 * DAY)
    late = maintain(str(table), clock=clock, engine="local")
    assert late.log_files_deleted >= 1 and late.expired_version is None
    assert min(list_log(DeltaTable.open(table).storage).commits) == latest
    assert audit_table(str(table), [KEY_A.public_key]).ok
    import deltalake  # a reader we did not write reads what is left as we do

    assert deltalake.DeltaTable(str(table)).to_pyarrow_table().num_rows == 70


def test_with_short_retentions_the_expired_values_leave_every_file(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 40)
    secrets = [os.urandom(24) for _ in range(5)]
    feed.append([Write(f"/secret{i}", s, ttl_ms=60_000) for i, s in enumerate(secrets)])
    withdrawn = [os.urandom(24) for _ in range(2)]
    feed.append([Write("/withdrawn", s) for s in withdrawn])
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    feed.forget("/withdrawn")  # the writer withdraws it: the next ingest makes its rows tombstones
    feed.close()
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=quiet)
    secrets += withdrawn
    assert needle.find(needle.files_under(table), secrets)  # the search finds them while they are there
    t = open_table(str(table), None, None, None)  # with the token the table keeps in _feedlog/
    t.set_properties(
        {"delta.deletedFileRetentionDuration": "interval 1 hours", "delta.logRetentionDuration": "interval 1 hours"}
    )
    before = t.version()
    clock = ManualClock(SystemClock().now_ms() + 2 * HOUR)
    first = maintain(str(table), clock=clock, engine="local")
    assert first.rows_expired == 5
    # the file the forget rewrite removed (at ingest, two hours ago by this clock) is past the retention and
    # gone; the one TTL compaction removed just now is inside it, so the expired values are still on disk
    assert first.vacuum is not None and first.vacuum["files_deleted"] == 1
    assert {s for _where, s in needle.find(needle.files_under(table), secrets)} == set(secrets[:5])
    clock.advance(2 * HOUR)
    later = maintain(str(table), clock=clock, engine="local")
    assert later.vacuum is not None and later.vacuum["files_deleted"] == 1 and later.log_files_deleted >= 1
    # no byte of an expired value is left under the table: not in data files, the log, checkpoints, or
    # the embedded owner's database
    assert needle.find(needle.files_under(table), secrets) == []
    with pytest.raises(BeforeRetainedHistory):  # time travel to a version with the values is refused, typed
        DeltaTable.open(table, clock=clock).to_arrow(version=before)
    again = maintain(str(table), clock=clock, engine="local")
    assert again.vacuum is None  # nothing left: no VACUUM commits on a quiet table
    assert audit_table(str(table), [KEY_A.public_key]).ok


def test_maintain_every_runs_bounded_passes_and_refuses_bad_intervals(tmp_path: Path) -> None:
    _feed, table = _table(tmp_path)
    naps: list[float] = []
    seen: list[int] = []
    clock = ManualClock(SystemClock().now_ms() + 2 * HOUR)
    n = maintain_every(
        str(table), 60_000, rounds=3, sleep=naps.append, on_report=lambda r: seen.append(r.rows_expired), clock=clock
    )
    assert n == 3 and naps == [60.0, 60.0] and seen == [30, 0, 0]
    # a pass that fails for a moment (here: the table's directory unreadable, a store away) does not end the
    # loop; a mistake does
    failed: list[str] = []
    calls = {"n": 0}

    def flaky(_r: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Unavailable("the store is away")

    n = maintain_every(
        str(table),
        60_000,
        rounds=2,
        sleep=naps.append,
        on_report=flaky,
        on_error=lambda e: failed.append(str(e)),
        clock=clock,
    )
    assert n == 2 and failed == ["the store is away"]
    with pytest.raises(InvalidArgument):
        maintain_every(str(table), 60_000, rounds=2, sleep=naps.append, clock=clock, vacuum_retain_ms=1)
    for every, rounds in ((0, None), (-5, None), (1000, 0)):
        with pytest.raises(InvalidArgument):
            maintain_every(str(table), every, rounds=rounds, sleep=naps.append, clock=clock)


def test_cli_maintain(tmp_path: Path) -> None:
    _feed, table = _table(tmp_path)

    def feedlog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "feedlog", *args], capture_output=True, text=True, timeout=120, check=False
        )

    done = feedlog("maintain", str(table), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # nothing has expired yet (a minute's TTL, now); the newest version gets its checkpoint
    assert report["rows_expired"] == 0 and report["checkpoint"] == DeltaTable.open(table).version()
    info = json.loads(feedlog("table", "info", str(table), "--json").stdout)["retention"]
    assert (info["deleted_file_retention_ms"], info["log_retention_ms"]) == (7 * DAY, 30 * DAY)
    assert info["oldest_version"] == 0
    before = sorted(p.name for p in (table / "_delta_log").iterdir())
    short = feedlog("maintain", str(table), "--retain", "1h")  # shorter than the table's 7 days, no --force
    assert short.returncode == 2 and "--force" in short.stderr and "Traceback" not in short.stderr
    assert sorted(p.name for p in (table / "_delta_log").iterdir()) == before  # nothing changed
    bad = feedlog("maintain", str(table), "--rounds", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    missing = feedlog("maintain", str(tmp_path / "nothing"))
    assert missing.returncode == 3 and "Traceback" not in missing.stderr


def test_any_delta_table_gets_checkpoint_cleanup_and_vacuum(tmp_path: Path) -> None:
    import pyarrow as pa

    t = DeltaTable.create(tmp_path / "plain", pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1, 2, 3]}))
    r = maintain(str(tmp_path / "plain"), engine="local")
    assert not r.feedlog_table and (r.expired_version, r.forgotten_version) == (None, None)
    assert r.checkpoint == 1 and DeltaTable.open(tmp_path / "plain").to_arrow().num_rows == 3
