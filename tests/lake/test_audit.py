"""feedlog audit on tables written without Spark (rows from the real reader, real Delta files)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from feedlog.cli import main
from feedlog.delta import DeltaTable
from feedlog.lake.audit import audit_table
from feedlog.lake.feeds import FeedSource
from feedlog.lake.rows import SCHEMA
from feedlog.lake.sink import app_id
from feedlog.lake.source import FeedPartition, SourceFeed, read_partition
from feedlog.log.entries import decode_header
from feedlog.log.feed import Feed, Write

from .conftest import KEY_A, KEY_B, make_feed


def rows_of(path: Path, start: int = 1, end: int | None = None) -> pa.Table:
    src = FeedSource.parse(str(path))
    header = src.header()
    f = SourceFeed(src, header, decode_header(header))
    return pa.Table.from_batches(
        list(read_partition([f], FeedPartition(0, start, end or src.signed_length()))), schema=SCHEMA
    )


@pytest.fixture
def table(tmp_path: Path) -> tuple[DeltaTable, Path]:
    feed = make_feed(tmp_path / "feed", 250, batch=50)
    feed.close()
    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    t.append(rows_of(tmp_path / "feed", 1, 101), txn=(app_id(KEY_A.public_key.hex()), 101))
    t.append(rows_of(tmp_path / "feed", 101), txn=(app_id(KEY_A.public_key.hex()), 251))
    return t, tmp_path / "table"


def rewrite_file(table_path: Path, edit) -> None:
    """Edit the rows of the table's file holding seq 1 in place (same path, as an attacker would)."""
    t = DeltaTable.open(table_path)
    first = next(a for a in t.snapshot().files() if json.loads(a.stats or "{}")["minValues"]["seq"] == 1)
    f = table_path / urllib.parse.unquote(first.path)
    data = pq.read_table(f)
    pq.write_table(edit(data), f)


def test_a_faithful_table_verifies(table) -> None:
    _, path = table
    r = audit_table(str(path), [KEY_A.public_key])
    (f,) = r.feeds
    assert r.ok, r.to_json()
    assert (f.rows, f.signed_length, f.signatures) == (250, 251, 5)


def test_an_edited_value_is_an_altered_row(table) -> None:
    _, path = table

    def edit(data: pa.Table) -> pa.Table:
        values = data.column("value").to_pylist()
        values[7] = b"forged"
        return data.set_column(data.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))

    rewrite_file(path, edit)
    (f,) = audit_table(str(path), [KEY_A.public_key]).feeds
    assert not f.ok
    assert f.altered == ["seq 8: column value differs from its signed block"]
    assert not f.missing and not f.extra


def test_edited_block_bytes_break_their_batch_signature(table) -> None:
    _, path = table

    def edit(data: pa.Table) -> pa.Table:
        blocks = data.column("block").to_pylist()
        blocks[60] = blocks[60][:-1] + b"X"  # seq 61, in the signed batch 51..100
        return data.set_column(data.schema.get_field_index("block"), "block", pa.array(blocks, pa.binary()))

    rewrite_file(path, edit)
    (f,) = audit_table(str(path), [KEY_A.public_key]).feeds
    assert not f.ok
    assert any("seqs 51..100: do not hash to the signed tree at length 101" in a for a in f.altered), f.altered


def test_deleted_and_duplicated_rows(table) -> None:
    _, path = table
    rewrite_file(path, lambda d: pa.concat_tables([d.filter(pc.not_equal(d.column("seq"), 5)), d.slice(9, 1)]))
    (f,) = audit_table(str(path), [KEY_A.public_key]).feeds
    assert f.missing == [5]
    assert f.extra == ["seq 10: a duplicate row"]


def test_a_key_not_trusted_is_reported(table) -> None:
    _, path = table
    r = audit_table(str(path), [KEY_B.public_key])
    assert not r.ok
    by_key = {f.key: f for f in r.feeds}
    a, b = by_key[KEY_A.public_key.hex()], by_key[KEY_B.public_key.hex()]
    assert not a.trusted and a.extra_count == 250 and not a.missing_count
    assert "250 rows signed by a key that is not among the trusted keys" in a.summary()
    # the trusted feed has no rows at all: said as such, not as "missing seq 1"
    assert b.rows == 0 and not b.missing and b.summary().endswith("no rows in the table (a trusted key)")
    assert r.summary().endswith("AUDIT FAILED: 2 of 2 feeds (250 rows; 0 missing, 250 rows extra, 0 rows altered)")


def test_cli_audit_exit_codes(table, capsys) -> None:
    _, path = table
    assert main(["audit", str(path), "--key", KEY_A.public_key.hex()]) == 0
    assert "verified" in capsys.readouterr().out
    rewrite_file(path, lambda d: d.filter(pc.not_equal(d.column("seq"), 3)))
    assert main(["audit", str(path), "--key", KEY_A.public_key.hex()]) == 5
    assert "missing seqs: 3" in capsys.readouterr().out
    assert main(["audit", str(path), "--key", "zz"]) == 2
    assert main(["audit", str(path.parent / "nope")]) == 3


def test_rows_of_a_cleared_block_keep_its_leaf(tmp_path: Path) -> None:
    feed = make_feed(tmp_path / "feed", 20, batch=10)
    feed.core.clear([4])
    feed.close()
    rows = rows_of(tmp_path / "feed")
    r4 = rows.filter(pc.equal(rows.column("seq"), 4)).to_pylist()[0]
    assert r4["cleared"] and r4["block"] is None and len(r4["leaf_hash"]) == 32 and r4["size"] > 0
    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    t.append(rows)
    assert audit_table(str(tmp_path / "table"), [KEY_A.public_key]).ok


def test_cli_audit_says_once_and_consistently_what_is_wrong(table, capsys) -> None:
    """Issue 19 item 6: a wrong key said "extra 1" then "all 3 rows", a key with no rows "missing seqs: 1"."""
    _, path = table
    a, b = KEY_A.public_key.hex(), KEY_B.public_key.hex()
    assert main(["audit", str(path), "--key", b]) == 5
    out = capsys.readouterr().out.splitlines()
    assert (
        sorted(out[:2])
        == [  # feeds in key order
            f"feed {b[:16]}...  FAILED: no rows in the table (a trusted key)",
            f"feed {a[:16]}...  FAILED: 250 rows signed by a key that is not among the trusted keys (not checked)",
        ][:: 1 if b < a else -1]
    )
    assert out[2:] == [
        f"table {path} version 2: AUDIT FAILED: 2 of 2 feeds (250 rows; 0 missing, 250 rows extra, 0 rows altered)",
    ]
    assert main(["audit", str(path), "--key", b, "--json"]) == 5
    by_key = {f["feed"]: f for f in json.loads(capsys.readouterr().out)["feeds"]}
    assert (by_key[a]["extra"], by_key[a]["missing"], by_key[b]["rows"], by_key[b]["missing"]) == (250, 0, 0, 0)
    assert by_key[b]["problem"] == "no rows in the table (a trusted key)"

    rewrite_file(path, lambda d: d.filter(pc.invert(pc.is_in(d.column("seq"), pa.array([3, 5, 6, 7])))))
    assert main(["audit", str(path), "--key", a]) == 5
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"feed {a[:16]}...  FAILED: 246 rows, signed prefix seqs 1..250 (0 signatures checked): "
        "4 missing, 0 rows extra, 0 rows altered"
    )
    assert out[1:] == [
        "  missing seqs: 3, 5..7",
        "  246 rows of seqs 1..250 not checked against a signature (the tree breaks at seq 3)",
        f"table {path} version 2: AUDIT FAILED: 1 of 1 feed (246 rows; 4 missing, 0 rows extra, 0 rows altered)",
    ]


def feed_rows(tmp_path: Path, name: str, n: int, kp=KEY_A, batch: int = 10) -> pa.Table:
    make_feed(tmp_path / name, n, kp=kp, batch=batch).close()
    return rows_of(tmp_path / name)


def test_streaming_is_independent_of_batches_files_and_their_order(tmp_path: Path) -> None:
    """Rows arrive a batch at a time from files in any seq order, feeds mixed in one file: the same verdicts
    whatever the batch size (down to rows that wait for an earlier file), problems included."""
    a, b = feed_rows(tmp_path, "a", 120), feed_rows(tmp_path, "b", 90, kp=KEY_B, batch=7)
    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    t.append(a.slice(60))  # a's later seqs land first
    t.append(pa.concat_tables([b.slice(40), a.slice(0, 60), b.slice(0, 40)]))  # both feeds, out of order
    t.append(a.slice(30, 1))  # a duplicate of seq 31
    keys = [KEY_A.public_key, KEY_B.public_key]
    reports = [audit_table(str(tmp_path / "table"), keys, batch_rows=n).to_json() for n in (1, 7, 64, 100_000)]
    assert all(r == reports[0] for r in reports[1:])
    fa, fb = (
        reports[0]["feeds"] if reports[0]["feeds"][0]["feed"] == KEY_A.public_key.hex() else reports[0]["feeds"][::-1]
    )
    assert (fa["rows"], fa["signatures_checked"], fa["extra"], fa["extra_rows"]) == (
        121,
        12,
        1,
        ["seq 31: a duplicate row"],
    )
    assert fb["ok"] and (fb["rows"], fb["signatures_checked"]) == (90, 13)


def test_rows_past_the_last_signature_and_below_one_are_extra(tmp_path: Path) -> None:
    rows = feed_rows(tmp_path, "a", 30)

    def with_seq(r: pa.Table, seq: int) -> pa.Table:
        return r.set_column(1, SCHEMA.field("seq"), pa.array([seq] * r.num_rows, pa.int64()))

    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    # the last signed batch's signature dropped: its rows are past the last signed length 21
    no_sig = rows.slice(20).set_column(12, SCHEMA.field("signed"), pa.nulls(10, SCHEMA.field("signed").type))
    t.append(pa.concat_tables([rows.slice(0, 20), no_sig, with_seq(rows.slice(3, 1), 0)]))
    (f,) = audit_table(str(tmp_path / "table"), [KEY_A.public_key]).feeds
    assert (f.signed_length, f.extra_count, f.missing_count, f.altered_count) == (21, 11, 0, 0)
    assert f.extra[0] == "seq 0: below 1 (seq 0 is the feed's header, never a row)"
    assert f.extra[1:] == [f"seq {s}: past the last signed length 21" for s in range(21, 30)]  # the first 10 shown


def test_each_decoded_column_is_checked_against_its_block(table) -> None:
    """The batch comparison names the same column a row-by-row decode would, for every column."""
    _, path = table
    edits = {
        "key": (2, pa.string(), "/forged"),
        "deleted": (4, pa.bool_(), True),
        "timestamp": (5, SCHEMA.field("timestamp").type, 0),
        "expires_at": (6, SCHEMA.field("expires_at").type, 1_000_000),
    }

    def edit(data: pa.Table) -> pa.Table:
        for n, (name, (row, typ, v)) in enumerate(edits.items()):
            values = data.column(name).to_pylist()
            values[row + n * 10] = v
            data = data.set_column(data.schema.get_field_index(name), name, pa.array(values, typ))
        stat = data.column("stat").to_pylist()
        stat[50] = {"mode": 1, **dict.fromkeys(list(SCHEMA.field("stat").type.names)[1:])}
        return data.set_column(data.schema.get_field_index("stat"), "stat", pa.array(stat, SCHEMA.field("stat").type))

    rewrite_file(path, edit)
    (f,) = audit_table(str(path), [KEY_A.public_key]).feeds
    assert f.altered == [
        "seq 3: column key differs from its signed block",
        "seq 15: column deleted differs from its signed block",
        "seq 26: column timestamp differs from its signed block",
        "seq 37: column expires_at differs from its signed block",
        "seq 51: column stat differs from its signed block",
    ]
    assert f.signatures == 5 and not f.missing_count and not f.extra_count


def test_a_drive_event_table_verifies(tmp_path: Path) -> None:
    feed = Feed.create(tmp_path / "d", content_type="drive-event", key_pair=KEY_A, timestamps="exact")
    feed.append([Write(f"/f{i}", {"mode": 33188, "size": i}) for i in range(20)])
    feed.append([Write("/f3", None, deleted=True)])
    feed.close()
    t = DeltaTable.create(tmp_path / "table", SCHEMA)
    t.append(rows_of(tmp_path / "d"))
    r = audit_table(str(tmp_path / "table"), [KEY_A.public_key])
    assert r.ok and r.feeds[0].rows == 21, r.to_json()


@pytest.mark.parametrize(
    "layout",
    [{"partition_by": ["feed"]}, {"properties": {"delta.columnMapping.mode": "name"}}],
    ids=["partitioned-by-feed", "column-mapped"],
)
def test_tables_laid_out_otherwise_audit_alike(tmp_path: Path, layout: dict[str, Any]) -> None:
    """Files whose columns are not stored as is (a partition column, physical names) are read whole
    through the scan, a file at a time; the verdicts are the same."""
    a, b = feed_rows(tmp_path, "a", 60), feed_rows(tmp_path, "b", 40, kp=KEY_B)
    t = DeltaTable.create(tmp_path / "table", SCHEMA, **layout)
    t.append(pa.concat_tables([a.slice(30), b]))
    t.append(a.slice(0, 30).filter(pc.not_equal(a.slice(0, 30).column("seq"), 7)))
    r = audit_table(str(tmp_path / "table"), [KEY_A.public_key, KEY_B.public_key], batch_rows=16)
    by_key = {f.key: f for f in r.feeds}
    assert by_key[KEY_B.public_key.hex()].ok
    fa = by_key[KEY_A.public_key.hex()]
    assert (fa.rows, fa.missing, fa.signatures) == (59, [7], 0)


def test_an_empty_table_fails_saying_there_is_nothing_to_check(tmp_path: Path) -> None:
    DeltaTable.create(tmp_path / "table", SCHEMA)
    r = audit_table(str(tmp_path / "table"))
    assert not r.ok and r.summary().endswith("AUDIT FAILED: no rows and no trusted key to check")


def test_a_signed_state_with_fields_missing_is_an_altered_row(table) -> None:
    _, path = table

    def edit(data: pa.Table) -> pa.Table:
        signed = data.column("signed").to_pylist()
        signed[49] = {**signed[49], "fork": None}  # seq 50's state, for length 51
        signed[99] = {**signed[99], "tree_hash": b"short"}
        return data.set_column(12, SCHEMA.field("signed"), pa.array(signed, SCHEMA.field("signed").type))

    rewrite_file(path, edit)
    (f,) = audit_table(str(path), [KEY_A.public_key]).feeds
    assert f.altered == [
        "seq 50: its signed state (length 51) does not verify",
        "seq 100: its signed state (length 101) does not verify",
    ]
    assert f.signatures == 3 and f.signed_length == 251  # the other states still check every row
