"""A forgotten key in a table (issue 37): ingest carries a forget entry into the table, where every
earlier row of the key becomes a tombstone (as TTL compaction makes them), the audit still verifies,
and deltalake reads what feedlog reads. Ingest without Spark (`ingest_batch(None, ...)`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog import failpoints
from feedlog.delta import DeltaTable
from feedlog.errors import Unavailable
from feedlog.lake.audit import audit_table
from feedlog.lake.forget import Forget, forget_rewrite, forget_rows, may_hold
from feedlog.lake.ingest import ingest_batch
from feedlog.lake.sink import open_table
from feedlog.log.feed import Feed, Write

from .conftest import KEY_A, KEY_B, make_feed


def quiet(_m: str) -> None:
    pass


@pytest.fixture
def armed() -> Iterator[None]:
    yield
    failpoints.arm("")


def opened(table: Path) -> DeltaTable:
    return open_table(str(table), None, None, None)


def rows_of(table: Path, version: int | None = None) -> list[dict[str, Any]]:
    return sorted(DeltaTable.open(table).to_arrow(version=version).to_pylist(), key=lambda r: (r["feed"], r["seq"]))


def deltalake_rows(table: Path) -> list[dict[str, Any]]:
    import deltalake

    dt = deltalake.DeltaTable(str(table))
    got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())
    return sorted(got.to_pylist(), key=lambda r: (r["feed"], r["seq"]))


def live_files_holding(table: Path, needle: bytes) -> list[str]:
    """The data files of the table's latest version whose bytes hold `needle`."""
    adds = DeltaTable.open(table).snapshot().files()
    return [a.path for a in adds if needle in (table / a.path).read_bytes()]


def secret_feed(path: Path) -> Feed:
    """Feed A: /secret written three times among others, in two batches."""
    f = make_feed(path, 40, kp=KEY_A)
    f.append([Write("/secret", b"needle-1"), Write("/other", b"kept"), Write("/secret", b"needle-2")])
    f.put("/secret", b"needle-3")
    return f


def test_ingest_makes_every_earlier_row_of_a_forgotten_key_a_tombstone(tmp_path: Path) -> None:
    feed = secret_feed(tmp_path / "a")
    make_feed(tmp_path / "b", 10, kp=KEY_B).close()  # another feed: untouched
    table = tmp_path / "table"
    feeds = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert ingest_batch(None, feeds, str(table), progress=quiet).version == 1
    assert len(live_files_holding(table, b"needle-")) == 1
    forgot = feed.forget("/secret").seq
    feed.put("/secret", b"written again")  # after the forget: stays
    feed.close()
    landed = ingest_batch(None, feeds, str(table), progress=quiet)
    assert landed.version == 2
    t = DeltaTable.open(table)
    assert t.version() == 3
    assert t.history(1)[0].commit_info["operation"] == "FORGET"
    rows = rows_of(table)
    secret = [r for r in rows if r["key"] == "/secret"]
    assert [(r["seq"], r["cleared"], r["value"] is None, r["block"] is None) for r in secret] == [
        (41, True, True, True),
        (43, True, True, True),
        (44, True, True, True),
        (forgot, False, True, False),
        (forgot + 1, False, False, False),
    ]
    assert all(r["leaf_hash"] is not None and r["deleted"] is False for r in secret[:3])
    # the rest of feed A and all of feed B as they were
    before = {(r["feed"], r["seq"]): r for r in rows_of(table, version=2)}
    for r in rows:
        if r["key"] != "/secret":
            assert r == before[(r["feed"], r["seq"])]
    assert live_files_holding(table, b"needle-") == []
    assert audit_table(str(table), [KEY_A.public_key, KEY_B.public_key]).ok
    assert deltalake_rows(table) == rows
    # idempotent: nothing left to clear, no commit
    assert forget_rewrite(opened(table)).version is None
    assert DeltaTable.open(table).version() == 3


def test_a_forget_landed_without_its_rewrite_is_finished_by_a_rerun_or_maintenance(tmp_path: Path, armed: None) -> None:
    feed = secret_feed(tmp_path / "a")
    table = tmp_path / "table"
    assert ingest_batch(None, [str(tmp_path / "a")], str(table), progress=quiet).version == 1
    feed.forget("/secret")
    feed.close()
    failpoints.arm("forget.rewrite=error")  # the ingest's commit lands; its forget rewrite fails
    with pytest.raises(Unavailable):
        ingest_batch(None, [str(tmp_path / "a")], str(table), progress=quiet)
    failpoints.arm("")
    assert DeltaTable.open(table).version() == 2
    assert [r["value"] for r in rows_of(table) if r["key"] == "/secret" and not r["deleted"]] == [
        b"needle-1",
        b"needle-2",
        b"needle-3",
    ]
    # what maintenance runs: every forget row in the table, found and applied
    done = forget_rewrite(opened(table))
    assert (done.version, done.rows_cleared, done.forgets) == (3, 3, 1)
    assert live_files_holding(table, b"needle-") == []
    assert audit_table(str(table), [KEY_A.public_key]).ok
    assert deltalake_rows(table) == rows_of(table)


def test_forget_rows_and_file_pruning() -> None:
    from feedlog.delta.actions import Add

    block_forget = _block("/k", forget=True)
    data = pa.table(
        {
            "feed": ["aa", "aa", "aa"],
            "seq": [1, 2, 3],
            "deleted": [True, True, False],
            "block": [_block("/k"), block_forget, _block("/k", b"v")],
        }
    )
    assert forget_rows(data) == [Forget("aa", "/k", 2)]
    f = Forget("aa", "/k", 10)

    def add(stats: str | None) -> Add:
        return Add("x.parquet", {}, 1, 0, True, stats)

    assert may_hold(add(None), f)
    assert not may_hold(add('{"minValues": {"seq": 10}}'), f)
    assert may_hold(add('{"minValues": {"seq": 9}}'), f)
    assert not may_hold(add('{"minValues": {"key": "/l"}}'), f)
    assert not may_hold(add('{"maxValues": {"key": "/j"}}'), f)
    assert not may_hold(add('{"minValues": {"feed": "ab"}}'), f)
    assert may_hold(add('{"minValues": {"feed": "a", "key": "/"}, "maxValues": {"key": "/z"}}'), f)


def _block(key: str, value: bytes | None = None, *, forget: bool = False) -> bytes:
    from feedlog.log import entries

    return entries.encode_entry(
        entries.ENTRY, key, value, deleted=value is None, timestamp=None, expires_at=None, forget=forget
    )
