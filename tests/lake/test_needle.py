"""The needle test (issue 37): secrets that expired or were withdrawn leave every copy, every file.

Unique secret values, some with a short TTL and some under a key the writer then forgets, go from a
writer's feed to a peer, which a second peer follows; a Spark stream lands them from the first peer
in a managed table. Time passes (an injected clock, never a sleep); the peers compact on their own
schedule, the writer compacts, and `maintain` runs with short retentions set on the table. Then
every byte of every file the run left is read (the feed, both peers, the table with its log,
checkpoints, staged commits and embedded owner database with its WAL, Spark's checkpoint location),
and none of the secrets is there, raw, hex, base64 or inside a decoded Parquet column. The table
still audits, deltalake and DuckDB read its latest version as feedlog does, and time travel to a
version that held the secrets is a typed refusal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable
from feedlog.errors import BeforeRetainedHistory, NotFound
from feedlog.lake.audit import audit_table
from feedlog.lake.maintain import maintain
from feedlog.lake.sink import open_table
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.replication.sync import push
from feedlog.rpc import Address
from feedlog_server.app import PeerServer

from .. import needle
from ..conftest import wait_until
from ..delta.conftest import duckdb_read

HOUR = 3_600_000
KP = KeyPair.from_seed(bytes([37]) * 32)
COMPARED = ["feed", "seq", "key", "value", "deleted", "cleared", "leaf_hash"]


def _stream(spark: Any, source: str, table: Path, checkpoint: Path) -> None:
    """Land what the peer holds now with a Spark stream (availableNow), into the managed table."""
    query = (
        spark.readStream.format("feedlog")
        .option("feed", source)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("feedlog-delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(table))
    )
    query.awaitTermination(300)


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in COMPARED) for r in t.select(COMPARED).to_pylist())


@pytest.mark.slow
def test_expired_and_forgotten_secrets_leave_every_copy(tmp_path: Path, spark: Any) -> None:
    clock = ManualClock(SystemClock().now_ms())
    expiring = [os.urandom(24) for _ in range(3)]
    withdrawn = [os.urandom(24) for _ in range(2)]
    secrets = expiring + withdrawn

    writer = Feed.create(tmp_path / "writer", key_pair=KP, timestamps="exact", clock=clock)
    writer.append([Write(f"/plain/{i}", f"kept {i}".encode()) for i in range(50)])
    writer.append([Write(f"/token/{i}", s, ttl_ms=HOUR) for i, s in enumerate(expiring)])
    writer.append([Write("/withdrawn", s) for s in withdrawn])

    first = PeerServer(tmp_path / "peer1", "127.0.0.1:0", clock=clock, compact_every=0.05).start()
    second: PeerServer | None = None
    try:
        push(tmp_path / "writer", Address.parse(f"grpc://{first.address}"), token=first.token)
        second = PeerServer(
            tmp_path / "peer2",
            "127.0.0.1:0",
            follow=[Address.parse(f"grpc://{first.address}/{KP.public_key.hex()}")],
            clock=clock,
            compact_every=0.05,
        ).start()
        followed = second

        def caught_up() -> bool:
            try:
                return bool(followed.host.get(KP.public_key).feed.length == writer.length)
            except NotFound:  # the follower has not created its copy yet
                return False

        wait_until(caught_up, 30, "the follower to catch up")

        table, ckpt = tmp_path / "table", tmp_path / "stream-ckpt"
        source = f"grpc://{first.address}/{KP.public_key.hex()}"
        _stream(spark, source, table, ckpt)
        everywhere = [tmp_path / "writer", tmp_path / "peer1", tmp_path / "peer2", table, ckpt]
        # the search finds what is there: every secret is in the table, and on both peers
        assert {s for _w, s in needle.find(needle.files_under(table), secrets)} == set(secrets)
        assert {s for _w, s in needle.find(needle.files_under(tmp_path / "peer2"), secrets)} == set(secrets)
        with_secrets = DeltaTable.open(table).version()

        # the writer withdraws a key: every copy clears it before it serves the forget entry
        writer.forget("/withdrawn")
        push(tmp_path / "writer", Address.parse(f"grpc://{first.address}"), token=first.token)
        wait_until(caught_up, 30, "the follower to take the forget entry")
        _stream(spark, source, table, ckpt)  # lands the forget entry; the sink's rewrite makes the rows tombstones

        # the TTLs pass: peers compact on their schedule, the writer compacts, the table is maintained
        t = open_table(str(table), None, None, None)
        t.set_properties(
            {
                "delta.deletedFileRetentionDuration": "interval 1 hours",
                "delta.logRetentionDuration": "interval 1 hours",
            }
        )
        clock.advance(2 * HOUR)
        writer.compact()
        maintain(str(table), clock=clock, engine="local")
        clock.advance(2 * HOUR)  # past the table's retentions for what that pass removed
        done = maintain(str(table), clock=clock, engine="local")
        assert done.vacuum is not None and done.log_files_deleted > 0

        def peers_forgot() -> bool:
            return not needle.find(needle.files_under(tmp_path / "peer1", tmp_path / "peer2"), secrets)

        wait_until(peers_forgot, 30, "the peers' scheduled compaction to clear the expired payloads")
        writer.close()

        found = needle.find(needle.files_under(*everywhere), secrets)
        assert found == [], found

        # what is left still proves itself, and readers we did not write agree with us
        assert audit_table(str(table), [KP.public_key]).ok
        ours = DeltaTable.open(table).to_arrow()
        import deltalake

        theirs = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(table))).execute("select * from t")
        assert _rows(pa.table(theirs.read_all())) == _rows(ours)
        assert _rows(duckdb_read(table)) == _rows(ours)
        cleared = {r["key"] for r in ours.to_pylist() if r["cleared"]}
        assert {"/token/0", "/token/1", "/token/2", "/withdrawn"} <= cleared
        with pytest.raises(BeforeRetainedHistory):  # the version that held them: refused, typed, never in part
            DeltaTable.open(table, clock=clock).to_arrow(version=with_secrets)
    finally:
        if second is not None:
            second.stop(grace=1)
        first.stop(grace=1)
