"""`feedlog ingest --stream --engine local`: live tails landed in this process, exactly once, no JVM.

Real peers on loopback, real feed directories, real tables; the kill test kills the real command
with SIGKILL at moments the stream chooses (after some commits) and counts rows against the puts
the peer acknowledged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog.cli import main
from feedlog.delta import DeltaTable
from feedlog.errors import FeedlogError
from feedlog.lake.audit import audit_table
from feedlog.lake.ingest import IngestResult, ingest_batch, ingest_stream
from feedlog.lake.sink import TableRef, open_table
from feedlog.lake.stream_local import StreamStats, next_tick
from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient
from feedlog_server.app import PeerServer
from tests.conftest import wait_until

from .conftest import KEY_A, KEY_B, append, make_feed


def rows(table: Path) -> list[tuple[str, int]]:
    t = open_table(str(table), None, None, None).to_arrow()
    return list(zip(t.column("feed").to_pylist(), t.column("seq").to_pylist(), strict=True))


def landed_count(table: Path) -> int:
    try:
        return len(rows(table))
    except FeedlogError:
        return 0


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServer]:
    server = PeerServer(tmp_path / "peer").start()
    yield server
    server.stop(grace=1)


def served_feed(server: PeerServer) -> bytes:
    with FeedClient(server.address, token=server.token) as c:
        return c.create(timestamps="exact").key


def put(server: PeerServer, key: bytes, n: int, tag: str = "p") -> list[int]:
    """`n` single-entry puts, acknowledged; their seqs."""
    with FeedClient(server.address, token=server.token) as c, c.producer(key) as p:
        futs = [p.put(Write(f"/{tag}/{i}", f"{tag} {i}".encode())) for i in range(n)]
        return [f.result(30).seq for f in futs]


class Streaming:
    """`ingest_stream` (local engine, or Spark's with `spark`) in a thread of this test, until `stop()`."""

    def __init__(self, specs: list[str], table: Path, spark: Any = None, **kw: Any) -> None:
        self.stop_event = threading.Event()
        self.stats = StreamStats()
        self.result: IngestResult | None = None
        self.error: BaseException | None = None
        self.lines: list[str] = []

        def run() -> None:
            try:
                self.result = ingest_stream(
                    spark,
                    specs,
                    str(table),
                    stop=self.stop_event,
                    stats=self.stats,
                    progress=self.lines.append,
                    **kw,
                )
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> IngestResult:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the stream did not stop"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def test_next_tick_is_a_processing_time_trigger() -> None:
    # ticks at t0 + k * interval; a batch that overran its tick is followed by the next tick, not a burst
    assert next_tick(10.0, 0.5, 10.0) == 10.5
    assert next_tick(10.0, 0.5, 10.49) == 10.5
    assert next_tick(10.0, 0.5, 10.5) == 11.0
    assert next_tick(10.0, 0.5, 11.7) == 12.0
    assert next_tick(10.0, 0, 11.7) == 11.7  # trigger 0: as fast as possible


def test_the_inbox_holds_a_bounded_number_of_bytes() -> None:
    """Big blocks (up to 8 MiB each) fill the followers' inbox by bytes long before by count: a
    follower waits once the held bytes reach the budget, until the loop takes them."""
    from typing import cast

    from feedlog.lake.stream_local import _Feed, _Inbox
    from feedlog.replication.verify import Verified

    stop = threading.Event()
    inbox = _Inbox(1_000, stop, max_bytes=100)
    feed = _Feed("aa" * 32, "entry", b"")
    state = cast(Any, None)  # (the inbox never looks at the signed state)
    assert inbox.put(feed, Verified(1, [b"x" * 80], state))  # under the budget: taken at once
    assert inbox.put(feed, Verified(2, [b"y" * 80], state))  # 80 < 100 still: one batch past it
    done = threading.Event()

    def put_third() -> None:
        inbox.put(feed, Verified(3, [b"z" * 80], state))
        done.set()

    third = threading.Thread(target=put_third)
    third.start()
    assert not done.wait(0.3)  # 160 bytes held: the third waits
    assert [b.start for _, b in inbox.take(None)] == [1, 2]
    assert done.wait(5)
    assert inbox.held_bytes == 80 and inbox.held == 1
    stop.set()
    third.join(5)


def test_a_peer_and_a_directory_land_live_exactly_once_and_audit(tmp_path: Path, peer: PeerServer) -> None:
    key = served_feed(peer)
    put(peer, key, 5, "before")
    local = make_feed(tmp_path / "local", 30, kp=KEY_B, batch=10)
    table = tmp_path / "table"
    specs = [f"grpc://{peer.address}/{key.hex()}", str(tmp_path / "local")]
    s = Streaming(specs, table, trigger_seconds=0.05)
    try:
        wait_until(lambda: landed_count(table) == 35, 30, "the entries there at the start")
        acked = put(peer, key, 200, "live")
        append(local, 70, batch=7)
        wait_until(lambda: landed_count(table) == 305, 30, "the live entries")
        # (a micro-batch is counted once its commit's post-commit steps are done: a moment after
        # its rows are visible)
        wait_until(lambda: s.stats.behind == dict.fromkeys(specs, 0), 30, "the stream to count what it landed")
    finally:
        local.close()
        r = s.stop()
    got = rows(table)
    assert len(got) == len(set(got)) == 305
    assert sorted(q for f, q in got if f == key.hex()) == list(range(1, 6)) + acked
    assert sorted(q for f, q in got if f == KEY_B.public_key.hex()) == list(range(1, 101))
    assert r.rows == 305 and r.commits == s.stats.commits >= 2 and r.version == DeltaTable.open(table).version()
    history = DeltaTable.open(table).history()
    assert {h.operation for h in history if h.version > 0} == {"STREAMING UPDATE"}
    assert audit_table(str(table), [key, KEY_B.public_key]).ok


def test_available_now_lands_what_is_there_in_trigger_sized_commits_and_a_rerun_lands_nothing(
    tmp_path: Path,
) -> None:
    make_feed(tmp_path / "feed", 1000, batch=100).close()
    table = tmp_path / "table"
    kw: dict[str, Any] = {"available_now": True, "max_entries_per_trigger": 250, "progress": lambda _m: None}
    r = ingest_stream(None, [str(tmp_path / "feed")], str(table), **kw)
    # 250 entries a micro-batch, rounded up to the end of a signed batch of 100: 300 + 300 + 300 + 100
    assert (r.rows, r.commits) == (1000, 4)
    sizes = [h.commit_info["feedlog"]["feeds"][0]["rows"] for h in reversed(DeltaTable.open(table).history(4))]
    assert sizes == [300, 300, 300, 100]
    again = ingest_stream(None, [str(tmp_path / "feed")], str(table), **kw)
    assert (again.rows, again.commits) == (0, 0)
    assert sorted(q for _, q in rows(table)) == list(range(1, 1001))


def test_a_table_changed_while_the_stream_was_quiet_does_not_end_it(tmp_path: Path) -> None:
    """The stream's handle starts each commit from its last state; a property set by someone else
    since (hours, on a quiet stream) made the next commit a ConcurrentModification that ended the
    stream. It is committed again on the latest state, as DeltaTable.append does."""
    feed = make_feed(tmp_path / "feed", 10, batch=10)
    table = tmp_path / "table"
    s = Streaming([str(tmp_path / "feed")], table, trigger_seconds=0.05)
    try:
        wait_until(lambda: landed_count(table) == 10, 30, "the first entries")
        other = open_table(str(table), None, None, None)
        other.set_properties({"delta.logRetentionDuration": "interval 31 days"})
        append(feed, 10, batch=10)
        wait_until(lambda: landed_count(table) == 20 or s.error is not None, 30, "the entries after the change")
        assert s.error is None and s.thread.is_alive()
    finally:
        feed.close()
        r = s.stop()
    assert r.rows == 20 and len(set(rows(table))) == 20
    assert DeltaTable.open(table).snapshot().properties["delta.logRetentionDuration"] == "interval 31 days"


def test_a_timeout_ends_a_live_stream(tmp_path: Path) -> None:
    make_feed(tmp_path / "feed", 10, batch=10).close()
    table = tmp_path / "table"
    r = ingest_stream(None, [str(tmp_path / "feed")], str(table), timeout=0.5, progress=lambda _m: None)
    assert r.rows == 10 and len(rows(table)) == 10


def test_a_trigger_spaces_the_commits(tmp_path: Path) -> None:
    """With --trigger 400ms, micro-batches are cut at most every 400 ms however fast entries come:
    over a steady stream of appends, n commits span at least about (n - 1) triggers of ICTs (the
    slack is for one commit taking longer than the one before)."""
    feed = make_feed(tmp_path / "feed", 0)
    table = tmp_path / "table"
    s = Streaming([str(tmp_path / "feed")], table, trigger_seconds=0.4)
    try:
        for _ in range(300):  # every few ms an entry, until the stream has made 5 commits
            append(feed, 1, batch=1)
            if s.stats.commits >= 5:
                break
            s.stop_event.wait(0.01)
    finally:
        feed.close()
        s.stop()
    history = [h for h in DeltaTable.open(table).history() if h.operation == "STREAMING UPDATE"]
    assert len(history) >= 5
    icts = sorted(h.timestamp for h in history)
    assert icts[-1] - icts[0] >= (len(icts) - 1) * 400 - 300, icts


def test_maintenance_runs_beside_the_stream_and_ingestion_goes_on(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 0, ttl="1ms")  # every entry expired a millisecond after its write
    append(feed, 50, batch=10)
    table = tmp_path / "table"
    s = Streaming([str(tmp_path / "feed")], table, trigger_seconds=0.05, maintain_every_ms=300)

    def operations() -> list[str | None]:
        try:
            return [h.operation for h in open_table(str(table), None, None, None).history()]
        except FeedlogError:
            return []

    try:
        wait_until(lambda: "TTL COMPACTION" in operations(), 60, "a maintenance commit")
        before = landed_count(table)
        append(feed, 30, batch=10)  # after the maintenance commit: still landed
        wait_until(lambda: landed_count(table) == before + 30, 30, "entries after maintenance")
    finally:
        feed.close()
        s.stop()
    assert any(line.startswith("maintenance: ") for line in s.lines), s.lines
    assert sorted(q for _, q in rows(table)) == list(range(1, 81))
    assert audit_table(str(table), [KEY_A.public_key]).ok


@pytest.mark.slow
def test_a_peer_that_goes_away_is_reconnected_and_the_others_keep_landing(tmp_path: Path) -> None:
    server = PeerServer(tmp_path / "peer").start()
    address = server.address
    key = served_feed(server)
    put(server, key, 10, "a")
    local = make_feed(tmp_path / "local", 10, kp=KEY_B, batch=10)
    table = tmp_path / "table"
    specs = [f"grpc://{address}/{key.hex()}", str(tmp_path / "local")]
    s = Streaming(specs, table, trigger_seconds=0.05)
    try:
        wait_until(lambda: landed_count(table) == 20, 30, "the first entries")
        server.stop(grace=1)
        append(local, 40, batch=10)  # the directory keeps landing while the peer is away
        wait_until(lambda: landed_count(table) == 60, 30, "the directory's entries with the peer away")
        wait_until(lambda: s.stats.reconnects.get(specs[0], 0) >= 1, 30, "a failed reconnect")
        server = PeerServer(tmp_path / "peer", listen=address).start()  # back, on the same address
        acked = put(server, key, 25, "b")
        wait_until(lambda: landed_count(table) == 85, 60, "the peer's entries once it is back")
    finally:
        local.close()
        s.stop()
        server.stop(grace=1)
    got = rows(table)
    assert len(got) == len(set(got)) == 85
    assert sorted(q for f, q in got if f == key.hex()) == list(range(1, 11)) + acked


def short_log(table: Path) -> None:
    """A checkpoint every 5 commits, and log files kept no time past it."""
    props = {"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 0 seconds"}
    open_table(str(table), None, None, None).set_properties(props)


def log_files(table: Path) -> list[str]:
    return sorted(p.name for p in (table / "_delta_log").iterdir() if p.name[0].isdigit())


def test_log_cleanup_follows_each_checkpoint_of_a_stream(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 10, batch=10)
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=lambda _m: None)  # versions 0, 1
    short_log(table)  # version 2
    append(feed, 100, batch=10)
    feed.close()
    r = ingest_stream(None, [str(tmp_path / "feed")], str(table), available_now=True, max_entries_per_trigger=10)
    assert (r.rows, r.commits, r.version) == (100, 10, 12)
    # checkpoints at 5 and 10, each followed by cleanup: nothing before the newest checkpoint is left
    files = log_files(table)
    assert files[0] == f"{10:020d}.checkpoint.parquet" and f"{9:020d}.json" not in files, files
    assert f"{12:020d}.json" in files and len(rows(table)) == 110


def test_a_table_that_turns_expired_log_cleanup_off_keeps_its_log(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 10, batch=10)
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=lambda _m: None)  # versions 0, 1
    short_log(table)  # version 2
    open_table(str(table), None, None, None).set_properties({"delta.enableExpiredLogCleanup": "false"})  # 3
    append(feed, 100, batch=10)
    feed.close()
    r = ingest_stream(None, [str(tmp_path / "feed")], str(table), available_now=True, max_entries_per_trigger=10)
    assert r.version == 13
    files = log_files(table)
    assert f"{10:020d}.checkpoint.parquet" in files  # checkpoints still made
    assert all(f"{v:020d}.json" in files for v in range(14)), files  # and no commit cleaned up


@pytest.mark.slow
def test_the_spark_engine_takes_a_trigger_and_maintenance_and_cleans_its_log(spark: Any, tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 10, batch=10)
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=lambda _m: None)
    short_log(table)
    append(feed, 100, batch=10)
    kw: dict[str, Any] = {"available_now": True, "max_entries_per_trigger": 10, "progress": lambda _m: None}
    assert ingest_stream(spark, [str(tmp_path / "feed")], str(table), **kw).rows == 100
    files = log_files(table)
    assert files[0] == f"{10:020d}.checkpoint.parquet" and f"{9:020d}.json" not in files, files
    # live, --trigger 0, maintenance beside it
    s = Streaming([str(tmp_path / "feed")], table, spark, trigger_seconds=0, maintain_every_ms=500)
    try:
        append(feed, 30, batch=10)
        wait_until(lambda: len(rows(table)) == 140, 120, "the live entries")
        wait_until(lambda: any(m.startswith("maintenance: ") for m in s.lines), 60, "a maintenance pass")
    finally:
        feed.close()
        s.stop()
    assert sorted(q for _, q in rows(table)) == list(range(1, 141))


def count_opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every `DeltaTable` this process builds (open, create): each reads the log's head."""
    n = [0]
    real = DeltaTable.__init__

    def counting(self: DeltaTable, *a: Any, **kw: Any) -> None:
        n[0] += 1
        real(self, *a, **kw)

    monkeypatch.setattr(DeltaTable, "__init__", counting)
    return n


def test_a_job_opens_its_table_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolved at the entrance, handed on: a batch ingest opens an existing table once (it opened
    it five times: its plan, its version before, the sink's prepare and commit, the check after), and
    a stream's opens do not grow with its commits."""
    feed = make_feed(tmp_path / "feed", 100, batch=10)
    table = tmp_path / "table"
    ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=lambda _m: None)  # (creates the table)
    append(feed, 100, batch=10)
    opens = count_opens(monkeypatch)
    assert ingest_batch(None, [str(tmp_path / "feed")], str(table), progress=lambda _m: None).rows == 100
    assert opens[0] == 1
    append(feed, 100, batch=10)
    feed.close()
    opens[0] = 0
    ref = TableRef.resolve(str(table))
    r = ingest_stream(None, [str(tmp_path / "feed")], ref, available_now=True, max_entries_per_trigger=10)
    assert (r.rows, r.commits, opens[0]) == (100, 10, 1)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--trigger", "1s"], "--trigger is for --stream"),
        (["--maintain-every", "1m"], "--maintain-every is for --stream"),
        (["--timeout", "1m"], "--timeout is for --stream"),
        (["--stream", "--trigger", "soon"], "bad duration 'soon'"),
        (["--stream", "--maintain-every", "0s"], "bad duration '0s': must be greater than zero"),
        (["--stream", "--trigger", "1s", "--available-now"], "--trigger and --available-now are two triggers"),
        (["--stream", "--max-entries-per-trigger", "0"], "--max-entries-per-trigger must be >= 1, got 0"),
        (
            ["--stream", "--engine", "local", "--checkpoint-location", "x"],
            "--checkpoint-location is for --engine spark",
        ),
        (["--stream", "--engine", "local", "--master", "local[1]"], "--master is for --engine spark"),
    ],
)
def test_bad_stream_flags_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    make_feed(tmp_path / "feed", 3, batch=3).close()
    code, out, err = cli(capsys, "ingest", str(tmp_path / "feed"), str(tmp_path / "table"), *flags)
    assert code == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith("feedlog: error: ") and message in err, err
    assert not (tmp_path / "table").exists()


# ---- kill -9 ------------------------------------------------------------------------------------


def stream_process(source: str, table: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "feedlog", "ingest", source, str(table), "--stream", "--engine", "local"]
    return subprocess.Popen(
        [*cmd, "--trigger", "20ms", "--max-entries-per-trigger", "50"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def versions(table: Path) -> int:
    try:
        return open_table(str(table), None, None, None).version()
    except FeedlogError:
        return -1


@pytest.mark.slow
def test_kill_9_of_the_stream_loses_and_duplicates_nothing(tmp_path: Path, peer: PeerServer) -> None:
    """Puts go on while `feedlog ingest --stream --engine local` is killed with SIGKILL three times, each
    a few commits after it (re)started, and restarted: every acknowledged put lands once."""
    key = served_feed(peer)
    table = tmp_path / "table"
    source = f"grpc://{peer.address}/{key.hex()}"
    acked: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            while not stop.is_set():
                acked.extend(put(peer, key, 20, f"n{len(acked)}"))
                stop.wait(0.01)
        except BaseException as e:
            errors.append(e)

    put(peer, key, 1, "first")  # (the stream's plan finds a feed with entries)
    acked.append(1)
    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    proc = stream_process(source, table)
    try:
        for _ in range(3):
            start = versions(table)
            wait_until(lambda s=start: versions(table) >= s + 3, 120, "commits before the kill")  # type: ignore[misc]
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            proc = stream_process(source, table)
        stop.set()
        thread.join(30)
        assert not errors, errors
        wait_until(lambda: landed_count(table) >= len(acked), 120, "every acknowledged put landed")
    finally:
        stop.set()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    got = rows(table)
    dupes = [k for k, n in Counter(got).items() if n > 1]
    assert not dupes, dupes[:10]
    assert sorted(q for _, q in got) == sorted(acked) == list(range(1, len(acked) + 1))
    assert audit_table(str(table), [key]).ok
