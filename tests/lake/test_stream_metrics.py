"""A streaming ingest's metrics: the observer's rules on their own, and the Spark stream telling it what
each micro-batch committed, scraped over HTTP and parsed by Prometheus' text parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.actions import Add, CommitInfo, Protocol
from feedlog.lake.ingest import ingest_stream
from feedlog.lake.stream_metrics import StreamMetrics, commit_facts
from feedlog.metrics import MetricsListener, MetricsSettings, new_registry
from tests.scrape import label_values, scrape, value

from .conftest import KEY_A, make_feed

quiet = lambda _msg: None  # noqa: E731


def add(size: int, oldest: str | None, data_change: bool = True) -> Add:
    stats = {"numRecords": 3, "minValues": {"timestamp": oldest} if oldest else {}}
    return Add(f"part-{size}.parquet", {}, size, 0, data_change, json.dumps(stats))


def test_commit_facts_come_from_the_provenance_and_the_files_statistics() -> None:
    info = CommitInfo(
        1_800_000_010_500,
        None,
        "STREAMING UPDATE",
        extra={"feedlog": {"feeds": [{"key": "aa", "rows": 4}, {"key": "bb", "rows": 6}]}},
    )
    actions = [
        info,
        Protocol(3, 7, (), ("inCommitTimestamp",)),
        add(100, "2027-01-15T08:00:10.000Z"),  # 1_800_000_010_000 ms
        add(50, "2027-01-15T08:00:08.500Z"),
        add(7, None),  # no statistics: no sample
        add(1000, "2027-01-15T08:00:00.000Z", data_change=False),  # a rewrite lands nothing
    ]
    rows, nbytes, ict, samples = commit_facts(actions)
    assert (rows, nbytes, ict) == (10, 157, 1_800_000_010_500)
    assert samples == [500, 2000]
    assert commit_facts([CommitInfo(5, None, "WRITE")]) == (0, 0, 5, [])


def test_the_observer_counts_and_names_only_configured_sources() -> None:
    registry = new_registry()
    m = StreamMetrics(registry, ["aa" * 32])
    m.landed(10, 4096)
    m.landed(5, 1024)
    m.committed(7, 1_800_000_000_000, [250, 1500, -3])
    m.behind("aa" * 32, 12)
    m.behind("<script>", 99)  # a name nobody configured: never a label
    with MetricsListener(registry, MetricsSettings("127.0.0.1:0")) as listener:
        s = scrape(listener.url)
    assert value(s, "feedlog_ingest_entries_total") == 15
    assert value(s, "feedlog_ingest_bytes_total") == 5120
    assert value(s, "feedlog_ingest_commits_total") == 1
    assert value(s, "feedlog_ingest_last_commit_version") == 7
    assert value(s, "feedlog_ingest_last_commit_timestamp_seconds") == 1_800_000_000
    assert value(s, "feedlog_ingest_freshness_seconds_count") == 3
    assert value(s, "feedlog_ingest_freshness_seconds_bucket", le="0.25") == 2  # 0.25 s and the clamped -3 ms
    assert value(s, "feedlog_ingest_entries_behind", feed="aa" * 32) == 12
    assert "<script>" not in label_values(s)


@pytest.mark.slow
def test_a_spark_stream_tells_the_observer_what_it_landed(spark: Any, tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 250, batch=50)
    table = tmp_path / "table"
    registry = new_registry()
    m = StreamMetrics(registry, [KEY_A.public_key.hex()])
    kw: dict[str, Any] = dict(
        checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=quiet, timeout=120, metrics=m
    )
    r = ingest_stream(spark, [str(tmp_path / "feed")], str(table), max_entries_per_trigger=100, **kw)
    assert r.rows == 250
    t = DeltaTable.open(table)
    files = t.snapshot().files()
    with MetricsListener(registry, MetricsSettings("127.0.0.1:0")) as listener:
        s = scrape(listener.url)
    assert value(s, "feedlog_ingest_entries_total") == 250
    assert value(s, "feedlog_ingest_bytes_total") == sum(f.size for f in files)
    commits = [h for h in t.history() if h.operation == "STREAMING UPDATE"]
    assert value(s, "feedlog_ingest_commits_total") == len(commits) >= 3  # 100 entries a micro-batch at most
    assert value(s, "feedlog_ingest_last_commit_version") == t.version()
    assert value(s, "feedlog_ingest_freshness_seconds_count") == len(files)
    assert value(s, "feedlog_ingest_entries_behind", feed=KEY_A.public_key.hex()) == 0
    feed.close()


def test_the_local_stream_tells_the_observer_what_it_landed(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 250, batch=50)
    table = tmp_path / "table"
    registry = new_registry()
    m = StreamMetrics(registry, [KEY_A.public_key.hex()])
    r = ingest_stream(
        None,
        [str(tmp_path / "feed")],
        str(table),
        available_now=True,
        max_entries_per_trigger=100,
        progress=quiet,
        timeout=120,
        metrics=m,
    )
    assert r.rows == 250
    t = DeltaTable.open(table)
    commits = [h for h in t.history() if h.operation == "STREAMING UPDATE"]
    added = sum(f.size for f in t.snapshot().files())
    with MetricsListener(registry, MetricsSettings("127.0.0.1:0")) as listener:
        s = scrape(listener.url)
    assert value(s, "feedlog_ingest_entries_total") == 250
    assert value(s, "feedlog_ingest_bytes_total") == added  # no compaction at this size: the files as committed
    assert value(s, "feedlog_ingest_commits_total") == len(commits) >= 3
    assert value(s, "feedlog_ingest_last_commit_version") == t.version()
    assert value(s, "feedlog_ingest_freshness_seconds_count") == 250  # one sample per entry
    newest = t.history(1)[0]
    assert newest.in_commit_timestamp is not None  # (the gauge an operator alerts on: time() - it)
    assert value(s, "feedlog_ingest_last_commit_timestamp_seconds") == newest.in_commit_timestamp / 1000
    assert value(s, "feedlog_ingest_entries_behind", feed=KEY_A.public_key.hex()) == 0
    feed.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ingest", "FEED", "TABLE", "--metrics-listen", "127.0.0.1:0"], "--metrics-listen is for --stream"),
        (["ingest", "FEED", "TABLE", "--stream", "--metrics-listen", "0.0.0.0:9464"], "reachable from other"),
        (["ingest", "FEED", "TABLE", "--stream", "--metrics-tls-cert", "c.pem"], "need --metrics-listen"),
        (["owner", "serve", "--db", "DB", "--metrics-listen", "0.0.0.0:9464"], "reachable from other"),
    ],
)
def test_metrics_mistakes_are_one_line_before_anything_starts(tmp_path: Path, args: list[str], says: str) -> None:
    make_feed(tmp_path / "feed", 3, batch=3).close()
    where = {"FEED": str(tmp_path / "feed"), "TABLE": str(tmp_path / "table"), "DB": str(tmp_path / "o.db")}
    argv = [where.get(a, a) for a in args] + (["--master", "nonsense://"] if args[0] == "ingest" else [])
    p = subprocess.run([sys.executable, "-m", "feedlog", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("feedlog: error: ") and says in lines[0], p.stderr
    assert not (tmp_path / "table").exists() and not (tmp_path / "o.db").exists()
