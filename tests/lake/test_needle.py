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

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from ..delta.s3 import S3Server, served_owner
from ..delta.test_objectstore import duckdb_rows

HOUR = 3_600_000
KP = KeyPair.from_seed(bytes([37]) * 32)
COMPARED = ["feed", "seq", "key", "value", "deleted", "cleared", "leaf_hash"]


@dataclass
class Place:
    """Where the table lives: a local directory with its embedded owner, or a bucket on the S3 test
    server with a served owner (whose database is under the test's directory, searched with the rest)."""

    table: str
    s3: S3Server | None = None
    owner: str | None = None
    token: str | None = None
    prefix: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def open(self, clock: Any = None) -> DeltaTable:
        """The table as a feedlog job opens it (its owner and token), reading time from `clock`."""
        t = open_table(self.table, self.token, self.owner, self.options or None)
        if clock is not None:
            t.clock = clock
        return t

    def objects(self) -> Iterator[tuple[str, bytes]]:
        """Every object the table left in the bucket (none for a local table: its files are searched as files)."""
        if self.s3 is None:
            return
        client = self.s3.client()
        for key in self.s3.keys(self.prefix):
            try:
                body = client.get_object(Bucket=self.s3.bucket, Key=key)["Body"].read()
            except client.exceptions.NoSuchKey:
                continue  # deleted since the listing (the served owner cleans a backfilled staged commit)
            yield f"s3://{self.s3.bucket}/{key}", body

    def deltalake_rows(self) -> pa.Table:
        import deltalake

        dt = deltalake.DeltaTable(self.table, storage_options=self.options or None)
        return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())

    def duckdb_rows(self) -> pa.Table:
        return duckdb_read(self.table) if self.s3 is None else duckdb_rows(self.s3, self.table)


@contextlib.contextmanager
def place(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Place]:
    if where == "local":
        yield Place(str(tmp_path / "table"))
        return
    s3: S3Server = request.getfixturevalue("s3_server")
    prefix = f"needle-{uuid.uuid4().hex[:12]}"
    with served_owner(s3, tmp_path / "owner", prefix) as owner:
        yield Place(f"s3://{s3.bucket}/{prefix}/table", s3, owner.endpoint, uuid.uuid4().hex, f"{prefix}/", s3.options)


def _stream(spark: Any, source: str, at: Place, checkpoint: Path) -> None:
    """Land what the peer holds now with a Spark stream (availableNow), into the managed table."""
    writer = (
        spark.readStream.format("feedlog")
        .option("feed", source)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("feedlog-delta")
        .option("checkpointLocation", str(checkpoint))
    )
    if at.owner is not None:
        writer = writer.option("owner", at.owner).option("ownerToken", at.token)
    for k, v in at.options.items():
        writer = writer.option(f"storage.{k}", v)
    query = writer.trigger(availableNow=True).start(at.table)
    query.awaitTermination(300)


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in COMPARED) for r in t.select(COMPARED).to_pylist())


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_expired_and_forgotten_secrets_leave_every_copy(
    tmp_path: Path, spark: Any, where: str, request: pytest.FixtureRequest
) -> None:
    with place(where, tmp_path, request) as at:
        _needle(tmp_path, spark, at)


def _needle(tmp_path: Path, spark: Any, at: Place) -> None:
    clock = ManualClock(SystemClock().now_ms())
    expiring = [os.urandom(24) for _ in range(3)]
    withdrawn = [os.urandom(24) for _ in range(2)]
    secrets = expiring + withdrawn

    writer = Feed.create(tmp_path / "writer", key_pair=KP, timestamps="exact", clock=clock)
    writer.append([Write(f"/plain/{i}", f"kept {i}".encode()) for i in range(50)])
    writer.append([Write(f"/token/{i}", s, ttl_ms=HOUR) for i, s in enumerate(expiring)])
    writer.append([Write("/withdrawn", s) for s in withdrawn])

    def everything() -> Iterator[tuple[str, bytes]]:
        """Every byte the run left: the writer's feed, both peers, the table (log, checkpoints, staged
        commits, data files; the embedded or served owner's database with its WAL), Spark's checkpoints."""
        yield from needle.files_under(tmp_path)
        yield from at.objects()

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

        ckpt = tmp_path / "stream-ckpt"
        source = f"grpc://{first.address}/{KP.public_key.hex()}"
        _stream(spark, source, at, ckpt)
        # the search finds what is there: every secret is in the table, and on the follower
        in_table = (
            needle.find(at.objects(), secrets) if at.s3 else needle.find(needle.files_under(Path(at.table)), secrets)
        )
        assert {s for _w, s in in_table} == set(secrets)
        assert {s for _w, s in needle.find(needle.files_under(tmp_path / "peer2"), secrets)} == set(secrets)
        with_secrets = at.open(clock=SystemClock()).version()

        # the writer withdraws a key: every copy clears it before it serves the forget entry
        writer.forget("/withdrawn")
        push(tmp_path / "writer", Address.parse(f"grpc://{first.address}"), token=first.token)
        wait_until(caught_up, 30, "the follower to take the forget entry")
        _stream(spark, source, at, ckpt)  # lands the forget entry; the sink's rewrite makes the rows tombstones

        # the TTLs pass: peers compact on their schedule, the writer compacts, the table is maintained
        at.open().set_properties(
            {
                "delta.deletedFileRetentionDuration": "interval 1 hours",
                "delta.logRetentionDuration": "interval 1 hours",
            }
        )
        clock.advance(2 * HOUR)
        writer.compact()
        kw: dict[str, Any] = {"clock": clock, "engine": "local", "token": at.token, "owner": at.owner}
        maintain(at.table, storage_options=at.options or None, **kw)
        clock.advance(2 * HOUR)  # past the table's retentions for what that pass removed
        done = maintain(at.table, storage_options=at.options or None, **kw)
        assert done.vacuum is not None and done.log_files_deleted > 0

        def peers_forgot() -> bool:
            return not needle.find(needle.files_under(tmp_path / "peer1", tmp_path / "peer2"), secrets)

        wait_until(peers_forgot, 30, "the peers' scheduled compaction to clear the expired payloads")
        writer.close()

        found = needle.find(everything(), secrets)
        assert found == [], found

        # what is left still proves itself, and readers we did not write agree with us
        assert audit_table(at.table, [KP.public_key], owner=at.owner, storage_options=at.options or None).ok
        ours = at.open(clock=SystemClock()).to_arrow()
        assert _rows(at.deltalake_rows()) == _rows(ours)
        assert _rows(at.duckdb_rows()) == _rows(ours)
        cleared = {r["key"] for r in ours.to_pylist() if r["cleared"]}
        assert {"/token/0", "/token/1", "/token/2", "/withdrawn"} <= cleared
        with pytest.raises(BeforeRetainedHistory):  # the version that held them: refused, typed, never in part
            at.open(clock=clock).to_arrow(version=with_secrets)
    finally:
        if second is not None:
            second.stop(grace=1)
        first.stop(grace=1)
