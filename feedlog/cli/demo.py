"""`feedlog demo`: the whole product on one machine, on embedded defaults, narrated.

A commit owner and two peers on 127.0.0.1; a signed feed with fuzzed writer
timestamps, pushed to the first peer and replicated (verified) to the second;
Spark ingests it from the second peer into a managed Delta table with in-commit
timestamps, then again after more appends (exactly once); the table's history
with ICTs; the table read back by deltalake and DuckDB, which we did not write;
`feedlog audit` proving the rows are the signed feed; TTL compaction that keeps
the audit green; writer timestamps put to use (`feedlog activity` across the feed
and a dozen writers whose clocks it simulates over the past week, drawn to
`activity.png`); everything shut down.
"""

from __future__ import annotations

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
from ..replication.client import FeedClient
from ..replication.sync import push
from ..rpc import Address
from .fmt import fmt_ts

if TYPE_CHECKING:  # only the Spark connector imports pyspark at run time
    from pyspark.sql import SparkSession


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


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


def run_demo(workdir: str | None = None, spark: SparkSession | None = None, clock: Clock | None = None) -> None:
    """The demo in `workdir` (default: a new temporary directory), with `spark` if given (else a local
    session) and `clock` for the wall time TTL compaction runs at (default: the system clock)."""
    from ..lake import spark_session
    from ..lake.expire import expire
    from ..lake.ingest import ingest_batch

    clock = clock or SystemClock()
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="feedlog-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    servers: list[PeerServer | OwnerServer] = []
    try:
        step("start local Spark, a commit owner and two peers on 127.0.0.1")
        t = time.monotonic()
        # the JVM first: PySpark forks it, and a fork once gRPC's threads run can kill the child
        spark = spark or spark_session(app_name="feedlog-demo")
        spark.sparkContext.setLogLevel("ERROR")
        print(f"local Spark {spark.version} up in {time.monotonic() - t:.1f}s")
        owner = OwnerServer(base / "owner.db", roots=[base]).start()
        servers.append(owner)
        first = PeerServer(base / "peer1").start()
        servers.append(first)
        print(f"commit owner {owner.endpoint} (SQLite {base / 'owner.db'}); peer 1 at {first.address}")
        print(f"peer 1's write token (pushes of new feeds, server-side puts) is in {first.token_file}")

        path = base / "feed"
        step(f"create a feed at {path}: writer timestamps fuzzed by up to 30s, a 1-day default TTL")
        feed = Feed.create(path, timestamps="fuzz:30s", ttl="1d")
        key = feed.key
        print(f"key {key.hex()}")
        _append(feed, 0, 20_000)
        feed.put("/session/token", b"short-lived", ttl="5m")
        feed.delete("/sensor/7")
        print(f"{feed.length - 1} entries in signed batches; signed root {feed.core.state.tree_hash.hex()[:16]}...")
        proof = feed.core.proof(4242)
        verify_proof(proof, key)
        print(f"seq 4242 proven with {len(proof.path)} sibling hashes, {len(proof.roots)} roots and one signature")

        step("push it to peer 1; peer 2 follows peer 1 and verifies every batch it copies")
        push(path, Address.parse(f"grpc://{first.address}"), token=first.token)
        second = PeerServer(base / "peer2", follow=[Address.parse(f"grpc://{first.address}/{key.hex()}")]).start()
        servers.append(second)
        _wait_length(second.address, key, feed.length)
        print(f"peer 2 at {second.address} holds all {feed.length} blocks")

        table = base / "table"
        source = f"grpc://{second.address}/{key.hex()}"
        step(f"ingest from peer 2 with Spark into a managed Delta table at {table}")
        r = ingest_batch(spark, [source], str(table), owner=owner.endpoint)
        print(
            f"committed version {r.version} (ICT {fmt_ts(r.in_commit_timestamp)}): {r.rows} entries in {r.seconds:.1f}s"
        )

        step("append 5,000 more (with a 10-minute TTL), replicate, ingest again: only the new entries land")
        _append(feed, 20_000, 5_000, ttl_ms=600_000)
        push(path, Address.parse(f"grpc://{first.address}"), token=first.token)
        _wait_length(second.address, key, feed.length)
        r = ingest_batch(spark, [source], str(table), owner=owner.endpoint)
        print(f"committed version {r.version} (ICT {fmt_ts(r.in_commit_timestamp)}): {r.rows} entries")
        again = ingest_batch(spark, [source], str(table), owner=owner.endpoint, progress=lambda _m: None)
        print(f"ingest once more: {again.rows} entries, no commit (the txn markers say where each feed stopped)")

        step("table history: every commit ratified by the owner, stamped with an in-commit timestamp")
        dt = DeltaTable.open(table, owner=owner.endpoint)  # readers ask only an owner they trust
        for h in reversed(dt.history()):
            prov = (h.commit_info.get("feedlog") or {}).get("feeds") or []
            what = "; ".join(f"seqs {p['from']}..{p['to'] - 1} signed at length {p['signed']['length']}" for p in prov)
            print(f"  v{h.version}  ICT {fmt_ts(h.in_commit_timestamp)}  {h.operation:<12} {what}")
        info = dt.info()
        print(f"{info['rows']} rows in {info['files']} files; features {', '.join(info['features'])}")

        step("read it back with engines we did not write")
        _outside_readers(table, info["rows"])

        step("audit: rebuild the Merkle tree from the table's rows, check the signatures with the key")
        _audit(table, key, owner.endpoint)

        step("an hour later: TTL compaction (a Spark job) turns expired rows into tombstones")
        feed.close()
        res = expire(spark, str(table), now_ms=clock.now_ms() + 3_600_000, owner=owner.endpoint, clock=clock)
        print(f"version {res.version}: {res.rows_cleared} rows cleared in {res.files_rewritten} rewritten files")
        _audit(table, key, owner.endpoint)

        step("writer timestamps put to use: activity across feeds (12 writers' clocks simulated over a week)")
        _activity(base, path, clock.now_ms())
    finally:
        step("shut down")
        for s in reversed(servers):
            s.stop(1)
        print(f"demo finished in {time.monotonic() - t0:.1f}s; files in {base}")


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


def _activity(base: Path, main_feed: Path, now_ms: int) -> None:
    from ..lake.feeds import parse_sources
    from ..lake.insight import activity, iso, read_feeds
    from ..lake.plots import plot_activity

    feeds = [main_feed, *_simulated_writers(base, now_ms)]
    rows, policies = read_feeds(parse_sources(",".join(str(f) for f in feeds)))
    a = activity(rows, 6 * 3_600_000, policies, now_ms)
    busiest = max(range(len(a.buckets)), key=lambda i: a.totals[i])
    apart = {c: sum(x[c] for x in a.apart.values()) for c in ("missing", "epoch", "future", "skew", "cleared")}
    print(f"{rows.num_rows:,} entries from {len(feeds)} feeds in {len(a.buckets)} buckets of 6h")
    print(f"busiest: {iso(a.buckets[busiest])}, {a.totals[busiest]:,} entries from {a.writers[busiest]} writers")
    print("counted apart: " + ", ".join(f"{n:,} {c}" for c, n in apart.items()))
    picture = plot_activity(a, str(base / "activity.png"))
    print(f"activity picture: {picture}  (feedlog activity {base / 'writers'}/* --every 6h --plot FILE)")


def _audit(table: Path, key: bytes, owner: str) -> None:
    rep = audit_table(str(table), [key], owner=owner)
    for f in rep.feeds:
        print(
            f"feed {f.key[:16]}...: {f.rows} rows = signed prefix 1..{f.signed_length - 1}, "
            f"{f.signatures} signatures checked; missing {len(f.missing)}, extra {len(f.extra)}, "
            f"altered {len(f.altered)} -> {'verified' if rep.ok else 'FAILED'}"
        )


def _outside_readers(table: Path, rows: int) -> None:
    try:
        import deltalake
    except ImportError:
        print("deltalake is not installed (pip install 'feedlog[dev]'): skipped")
    else:
        dl = deltalake.DeltaTable(str(table))
        n = dl.to_pyarrow_dataset().count_rows()
        verdict = "agrees" if n == rows else "DIFFERS"
        print(f"deltalake {deltalake.__version__}: version {dl.version()}, {n} rows ({verdict})")
    try:
        import duckdb
        import duckdb_extension_delta
    except ImportError:
        print("duckdb / duckdb-extension-delta are not installed: skipped")
        return
    ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    got = con.execute(
        f"SELECT count(*), count(DISTINCT feed), min(timestamp), max(timestamp) FROM delta_scan('{table}')"
    ).fetchone()
    assert got is not None
    n, feeds, first, last = got
    print(f"DuckDB {duckdb.__version__}: {n} rows of {feeds} feed ({'agrees' if n == rows else 'DIFFERS'})")
    print(f"  writer timestamps (fuzzed, untrusted) from {first} to {last}")
