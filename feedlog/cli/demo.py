"""`feedlog demo`: the whole product on one machine, on embedded defaults, narrated.

A commit owner and two peers on 127.0.0.1; a signed feed with fuzzed writer
timestamps, pushed to the first peer and replicated (verified) to the second;
Spark ingests it from the second peer into a managed Delta table with in-commit
timestamps, then again after more appends (exactly once); the table's history
with ICTs; the table read back by deltalake and DuckDB, which we did not write;
`feedlog audit` proving the rows are the signed feed; TTL compaction that keeps
the audit green; writer timestamps put to use (`feedlog activity` across the feed
and a dozen writers whose clocks it simulates over the past week, drawn to
`activity.png`); everything shut down and, unless kept, its files removed.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from feedlog_server.app import PeerServer
from feedlog_server.owner import OwnerServer

from ..clock import Clock, SystemClock
from ..delta import DeltaTable
from ..errors import NotFound, Unavailable
from ..lake.audit import audit_table
from ..log.feed import Feed, Write
from ..log.merkle import verify_proof
from ..log.timestamps import format_duration
from ..replication.client import FeedClient
from ..replication.sync import push
from ..rpc import Address
from .fmt import fmt_ts

if TYPE_CHECKING:  # only the Spark connector imports pyspark at run time
    from pyspark.sql import SparkSession


class Tour:
    """Numbered steps, each saying what it shows and why that matters, and where the time went."""

    def __init__(self) -> None:
        self.n = 0
        self.times: list[tuple[str, float]] = []
        self._t = time.monotonic()

    def step(self, title: str, why: str) -> None:
        self._lap()
        self.n += 1
        print(f"\n{self.n}. {title}\n   why: {why}", flush=True)

    def say(self, text: str) -> None:
        print(f"   {text}", flush=True)

    def _lap(self) -> None:
        now = time.monotonic()
        if self.n:
            self.times.append((f"{self.n}", now - self._t))
        self._t = now

    def summary(self) -> str:
        self._lap()
        return ", ".join(f"step {n} {s:.1f}s" for n, s in self.times)


def _wait_length(address: str, key: bytes, length: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with FeedClient(address) as c:
        while time.monotonic() < deadline:
            try:
                if c.info(key).state.length >= length:
                    return
            except (NotFound, Unavailable):  # the follower has not created its copy yet
                pass
            time.sleep(0.05)
    raise Unavailable(f"peer {address} did not replicate to length {length} within {timeout:.0f}s")


def _append(feed: Feed, first: int, n: int, ttl_ms: int | None = None) -> None:
    for lo in range(first, first + n, 1000):
        feed.append([Write(f"/sensor/{i % 100}", f"reading {i}".encode(), ttl_ms=ttl_ms) for i in range(lo, lo + 1000)])


def _quiet(_message: str) -> None:  # the tour prints its own one-line summary of each ingest
    pass


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def run_demo(
    workdir: str | None = None, spark: SparkSession | None = None, clock: Clock | None = None, keep: bool = False
) -> Path | None:
    """The demo in `workdir` (kept), or in a new temporary directory removed at the end unless `keep`;
    with `spark` if given (else a local session) and `clock` for the wall time TTL compaction runs at
    (default: the system clock). Returns the directory if it was kept."""
    clock = clock or SystemClock()
    keep = keep or workdir is not None  # a directory the user named is theirs: never removed
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="feedlog-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tour = Tour()
    servers: list[PeerServer | OwnerServer] = []
    print("feedlog demo: a signed feed, replicated between peers, ingested into Delta with Spark, audited.")
    try:
        _tour(tour, base, servers, spark, clock, keep)
    finally:
        for s in reversed(servers):
            s.stop(1)
        took = f"demo finished in {time.monotonic() - t0:.1f}s ({tour.summary()})"
        print(f"\n{took}; servers stopped; {leave(base, keep)}")
        print(NEXT)
        print(console_line(base, keep))
    return base if keep else None


def console_line(base: Path, keep: bool) -> str:
    """The one line that shows the demo's feed and table in a browser (`feedlog console`); the managed
    table's owner is trusted through its database file, since the demo's owner server has stopped."""
    cmd = shlex.join(
        [
            "feedlog",
            "console",
            "--data",
            str(base / "feed"),
            "--table",
            str(base / "table"),
            "--owner",
            str(base / "owner.db"),
            "--listen",
            "127.0.0.1:8080",
        ]
    )
    return (
        f"look at them: {cmd}"
        if keep
        else "to look at the demo's feed and table in a browser: `tools/run demo --keep`, then the "
        "`feedlog console ...` command it ends with"
    )


#: where a reader goes after the demo (the README's map names every page of docs/)
NEXT = "next: README.md's five-minute tour, then docs/ (`mkdocs serve` shows the docs as a site)"


def leave(base: Path, keep: bool) -> str:
    """Keep or remove the demo's directory; says which, and where."""
    if keep:
        return f"files kept in {base}"
    size = _size(base)
    shutil.rmtree(base, ignore_errors=True)
    return f"removed {base} ({size / 1e6:.0f} MB; --keep keeps it)"


def _tour(
    tour: Tour,
    base: Path,
    servers: list[PeerServer | OwnerServer],
    spark: SparkSession | None,
    clock: Clock,
    keep: bool,
) -> None:
    from ..lake import spark_session
    from ..lake.expire import expire
    from ..lake.ingest import ingest_batch

    tour.step(
        "Start local Spark, a commit owner and peer 1 on 127.0.0.1",
        "the owner decides every commit of the managed table; peers serve feeds over gRPC.",
    )
    t = time.monotonic()
    # the JVM first: PySpark forks it, and a fork once gRPC's threads run can kill the child
    spark = spark or spark_session(app_name="feedlog-demo")
    spark.sparkContext.setLogLevel("ERROR")
    spark_s = time.monotonic() - t
    owner = OwnerServer(base / "owner.db", roots=[base]).start()
    servers.append(owner)
    first = PeerServer(base / "peer1").start()
    servers.append(first)
    tour.say(f"Spark {spark.version} up in {spark_s:.1f}s; owner {owner.endpoint}; peer 1 {first.address}")

    path = base / "feed"
    tour.step(
        "Write a signed feed: 20,000 sensor readings, a session token with a 5-minute TTL, a deletion",
        "each batch's Merkle root is signed, so anyone with the public key can verify any entry.",
    )
    feed = Feed.create(path, timestamps="fuzz:30s", ttl="1d")
    key = feed.key
    _append(feed, 0, 20_000)
    feed.put("/session/token", b"short-lived", ttl="5m")
    feed.delete("/sensor/7")
    proof = feed.core.proof(4242)
    verify_proof(proof, key)
    tour.say(f"key {key.hex()[:16]}...; writer timestamps fuzzed by up to 30s (privacy); default TTL 1 day")
    tour.say(f"{feed.length - 1:,} entries, seqs 1..{feed.length - 1} (seq 0 is the header block naming the type)")
    tour.say(f"seq 4242 proven by {len(proof.path)} sibling hashes, {len(proof.roots)} roots and one signature")

    tour.step(
        "Push the feed to peer 1; peer 2 follows peer 1",
        "peers trust nothing they receive: peer 2 re-hashes every batch and checks its signature.",
    )
    push(path, Address.parse(f"grpc://{first.address}"), token=first.token)
    second = PeerServer(base / "peer2", follow=[Address.parse(f"grpc://{first.address}/{key.hex()}")]).start()
    servers.append(second)
    _wait_length(second.address, key, feed.length)
    tour.say(f"peer 2 ({second.address}) holds all {feed.length:,} blocks, verified: the header + every entry")

    table = base / "table"
    source = f"grpc://{second.address}/{key.hex()}"
    tour.step(
        "Ingest from peer 2 into a managed Delta table with Spark",
        "Spark verifies every block against the signed tree; the owner ratifies the commit.",
    )
    r = ingest_batch(spark, [source], str(table), owner=owner.endpoint, progress=_quiet)
    tour.say(f"version {r.version}: {r.rows:,} entries in one commit ({r.seconds:.1f}s)")

    tour.step(
        "Append 5,000 readings with a 10-minute TTL, replicate, ingest twice",
        "each run starts where the table's txn marker for the feed stopped: every entry lands once.",
    )
    _append(feed, 20_000, 5_000, ttl_ms=600_000)
    push(path, Address.parse(f"grpc://{first.address}"), token=first.token)
    _wait_length(second.address, key, feed.length)
    r = ingest_batch(spark, [source], str(table), owner=owner.endpoint, progress=_quiet)
    again = ingest_batch(spark, [source], str(table), owner=owner.endpoint, progress=_quiet)
    tour.say(f"version {r.version}: {r.rows:,} entries; the second run: {again.rows} entries, no commit")

    tour.step(
        "Read the table's history, then the table with engines we did not write",
        "in-commit timestamps say when feedlog saw the data; writer timestamps are untrusted claims.",
    )
    dt = DeltaTable.open(table, owner=owner.endpoint)  # readers ask only an owner they trust
    for h in reversed(dt.history()):
        prov = (h.commit_info.get("feedlog") or {}).get("feeds") or []
        what = "; ".join(f"seqs {p['from']}..{p['to'] - 1}, signed at length {p['signed']['length']}" for p in prov)
        tour.say(f"  v{h.version}  ICT {fmt_ts(h.in_commit_timestamp)}  {h.operation:<12} {what}".rstrip())
    info = dt.info()
    _outside_readers(tour, table, info["rows"])

    tour.step(
        "Audit: rebuild the Merkle tree from the table's rows, check the signatures with the key",
        "the table proves itself: a missing, extra or altered row would be named.",
    )
    _audit(tour, table, key, owner.endpoint)

    tour.step(
        "An hour later: TTL compaction (a Spark job)",
        "expired rows become tombstones that keep their leaf hash, so the audit still verifies.",
    )
    feed.close()
    res = expire(
        spark, str(table), now_ms=clock.now_ms() + 3_600_000, owner=owner.endpoint, clock=clock, engine="spark"
    )
    tour.say(
        f"version {res.version}: {res.rows_cleared:,} rows cleared (the 5,000 readings and the session token)"
        f" in {res.files_rewritten} rewritten files"
    )
    _audit(tour, table, key, owner.endpoint)
    files_ms = DeltaTable.open(table, owner=owner.endpoint).info()["retention"]["deleted_file_retention_ms"]
    tour.say(
        f"the files that held them stay for delta.deletedFileRetentionDuration ({format_duration(files_ms)}): "
        f"versions before version {res.version} still read them until then; `feedlog maintain {table}` then "
        "vacuums them, and time travel that needs them is refused (feedlog table info tells when)"
    )

    tour.step(
        "Writer timestamps put to use: activity of the feed and 12 simulated writers over a week",
        "buckets never finer than a writer's privacy policy; unbelievable times are counted apart.",
    )
    _activity(tour, base, path, clock.now_ms(), keep)


#: (timestamp policy, entries a day, the writer's waking hours in UTC, a misconfigured clock first)
_WRITERS = [
    ("exact", 40, (7, 19), False),
    ("exact", 15, (13, 23), False),
    ("truncate:1h", 60, (0, 10), False),
    ("truncate:1h", 25, (8, 16), False),
    ("fuzz:10m", 80, (6, 14), False),
    ("fuzz:10m", 10, (18, 24), False),
    ("fuzz:30s", 35, (9, 17), True),
    ("exact", 5, (0, 24), False),
    ("truncate:1m", 50, (10, 20), False),
    ("fuzz:1m", 20, (15, 23), False),
    ("exact", 70, (5, 13), False),
    ("off", 30, (8, 18), False),
]


def _simulated_writers(base: Path, now_ms: int) -> list[Path]:
    """A dozen feeds whose writers' clocks are simulated over the 7 days before `now_ms`: each
    writes in its own waking hours under its own privacy policy; one starts with an unset clock."""
    import random

    from ..clock import ManualClock

    rnd = random.Random(20261123)
    day, hour = 86_400_000, 3_600_000
    out = []
    for i, (policy, per_day, (wake, sleep), unset_first) in enumerate(_WRITERS):
        clock = ManualClock(0 if unset_first else now_ms - 7 * day)
        path = base / "writers" / f"w{i:02d}"
        with Feed.create(path, timestamps=policy, clock=clock, fsync=False) as feed:  # scratch feeds
            if unset_first:  # a device whose clock reads 1970 until it syncs
                feed.append([Write("/boot", b"1")])
                clock.set(now_ms - 7 * day)
            t = float(now_ms - 7 * day)
            while t < now_ms:
                t += rnd.expovariate(per_day / (sleep - wake)) * hour
                if wake <= (t // hour) % 24 < sleep and t < now_ms:
                    clock.set(int(t))
                    feed.append([Write(f"/item/{rnd.randrange(200)}", b"x" * rnd.randrange(1, 64))])
        out.append(path)
    return out


def _activity(tour: Tour, base: Path, main_feed: Path, now_ms: int, keep: bool) -> None:
    from ..lake.feeds import parse_sources
    from ..lake.insight import activity, iso, read_feeds
    from ..lake.plots import plot_activity

    feeds = [main_feed, *_simulated_writers(base, now_ms)]
    rows, policies = read_feeds(parse_sources(",".join(str(f) for f in feeds)))
    a = activity(rows, 6 * 3_600_000, policies, now_ms)
    busiest = max(range(len(a.buckets)), key=lambda i: a.totals[i])
    apart = {c: sum(x[c] for x in a.apart.values()) for c in ("missing", "epoch", "future", "skew", "cleared")}
    tour.say(f"{rows.num_rows:,} entries from {len(feeds)} feeds in {len(a.buckets)} buckets of 6h")
    tour.say(f"busiest: {iso(a.buckets[busiest])}, {a.totals[busiest]:,} entries from {a.writers[busiest]} writers")
    tour.say("counted apart: " + ", ".join(f"{n:,} {c}" for c, n in apart.items()))
    plot_activity(a, str(base / "activity.png"))
    where = base / "activity.png" if keep else "activity.png (removed at the end unless --keep)"
    tour.say(f"drawn to {where}: `feedlog activity FEED... --every 6h --plot FILE` does the same")


def _audit(tour: Tour, table: Path, key: bytes, owner: str) -> None:
    rep = audit_table(str(table), [key], owner=owner)
    for f in rep.feeds:
        tour.say(
            f"{f.rows:,} rows = signed seqs 1..{f.signed_length - 1}, {f.signatures} signatures checked; "
            f"missing {f.missing_count}, extra {f.extra_count}, altered {f.altered_count}"
            f" -> {'verified' if rep.ok else 'FAILED'}"
        )


def _outside_readers(tour: Tour, table: Path, rows: int) -> None:
    try:
        import deltalake
    except ImportError:
        tour.say("deltalake is not installed (pip install 'feedlog[readers]'): skipped")
    else:
        dl = deltalake.DeltaTable(str(table))
        n = dl.to_pyarrow_dataset().count_rows()
        verdict = "agrees" if n == rows else "DIFFERS"
        tour.say(f"deltalake {deltalake.__version__}: version {dl.version()}, {n:,} rows ({verdict})")
    try:
        import duckdb
        import duckdb_extension_delta
    except ImportError:
        tour.say("duckdb / duckdb-extension-delta are not installed: skipped")
        return
    ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    got = con.execute(f"SELECT count(*), count(DISTINCT feed) FROM delta_scan('{table}')").fetchone()
    assert got is not None
    n, feeds = got
    tour.say(f"DuckDB {duckdb.__version__}: {n:,} rows of {feeds} feed ({'agrees' if n == rows else 'DIFFERS'})")
