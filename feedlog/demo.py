"""`feedlog demo`: the product end to end on embedded defaults, narrated.

Today: a signed feed on disk with fuzzed writer timestamps, bulk and single
appends, key/value reads, a Merkle proof checked with nothing but the public
key, TTL expiry and compaction, a full verify after reopening, and the feed
landed in a Delta table with in-commit timestamps, exactly once. Later issues
extend this with peers, the commit owner and Spark.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow as pa

from .cli.feed_cmds import fmt_ts, record_line
from .clock import ManualClock
from .delta import DeltaTable
from .log.feed import Feed, Write
from .log.merkle import verify_proof


def step(text: str) -> None:
    print(f"\n== {text}")


def run_demo(workdir: str | None = None) -> None:
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="feedlog-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    path = base / "feed"
    t0 = time.monotonic()

    step(f"create a feed at {path} (timestamps fuzzed by up to 30s, default TTL 1d)")
    # a manual clock lets the demo jump past the TTL instead of waiting an hour
    clock = ManualClock(int(time.time() * 1000))
    feed = Feed.create(path, timestamps="fuzz:30s", ttl="1d", clock=clock)
    print(f"key           {feed.key.hex()}")
    print(f"discovery key {feed.discovery_key.hex()}")

    step("append 10,000 entries in signed batches of 1,000, then a few single puts")
    for b in range(10):
        feed.append([Write(f"/sensor/{i % 100}", f"reading {b * 1000 + i}".encode()) for i in range(1000)])
    feed.put("/config/mode", b"fast", ttl="7d")
    feed.put("/session/token", b"short-lived", ttl="5m")
    feed.delete("/sensor/7")
    root = feed.core.state.tree_hash.hex()[:16]
    print(f"length {feed.length} blocks, {feed.core.byte_length} bytes, signed root {root}...")

    step("read back: latest values, history, writer timestamps (untrusted, fuzzed)")
    now = clock.now_ms()
    for r in feed.records(feed.length - 3):
        print(record_line(r, now))
    got = feed.get("/sensor/42")
    print(f"get /sensor/42 -> {got.value.decode() if got and got.value else None}")
    print(
        f"get /sensor/7 -> {feed.get('/sensor/7')} (deleted; {len(feed.history('/sensor/7'))} entries in its history)"
    )
    print(f"timestamp of seq 1: {fmt_ts(feed.timestamp(1))}")

    step("prove one entry to someone who has only the public key")
    proof = feed.core.proof(4242)
    verify_proof(proof, feed.key)
    print(f"seq 4242 verified with {len(proof.path)} sibling hashes + {len(proof.roots)} roots and one signature")

    step("two hours later: the 5-minute entry has expired; compaction clears its payload")
    clock.advance(2 * 3600 * 1000)
    print(f"get /session/token -> {feed.get('/session/token')}")
    rep = feed.compact()
    print(f"compaction cleared {rep.cleared} blocks ({rep.bytes_cleared} bytes); Merkle nodes kept")
    feed.close()

    step("reopen and verify every block against the signed root")
    with Feed.open(path) as again:
        v = again.verify()
        print(f"ok: {v.length} blocks, {v.cleared} cleared, tree hash {v.tree_hash.hex()[:16]}...")
    land_in_delta(path, base / "table")
    print(f"\ndemo finished in {time.monotonic() - t0:.1f}s; files in {base}")


FEED_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("key", pa.string()),
        ("value", pa.binary()),
        ("deleted", pa.bool_()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def land_in_delta(feed_path: Path, table_path: Path) -> None:
    step(f"land the feed in a managed Delta table at {table_path} (in-commit timestamps, exactly once)")
    with Feed.open(feed_path) as feed:
        live = [r for r in feed.records() if not r.cleared]
        app_id, length = f"feed-{feed.key.hex()[:16]}", feed.length
    batch = pa.table(
        {
            "seq": [r.seq for r in live],
            "key": [r.key for r in live],
            "value": [r.value for r in live],
            "deleted": [r.deleted for r in live],
            "timestamp": pa.array([r.timestamp for r in live], pa.timestamp("ms", tz="UTC")),
        }
    )
    owner_db = table_path.parent / "owner.db"  # the embedded commit owner: one SQLite file
    table = DeltaTable.create(table_path, FEED_SCHEMA, owner=str(owner_db))
    print(f"commit owner: in process, state in {owner_db}; every commit staged, ratified, backfilled")
    first = table.append(batch, txn=(app_id, length))
    again = table.append(batch, txn=(app_id, length))  # a retried job: the txn marker makes it a no-op
    ict = fmt_ts(first.in_commit_timestamp)
    print(f"committed version {first.version} (ICT {ict}); the retried batch was skipped: {again.skipped}")
    table.checkpoint()
    info = table.info()
    print(f"{info['rows']} rows in {info['files']} file(s); features {', '.join(info['features'])}")
    for h in table.history():
        print(f"  version {h.version}  {fmt_ts(h.timestamp)}  {h.operation}")
    print(f"version at that ICT: {table.version_at(first.in_commit_timestamp or 0)}")
    print(f"backfilled through version {info['backfilled_version']}: deltalake and DuckDB see it all")
