"""feedlog audit on tables written without Spark (rows from the real reader, real Delta files)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

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
    assert not by_key[KEY_A.public_key.hex()].trusted
    assert by_key[KEY_B.public_key.hex()].missing  # the trusted feed has no rows at all


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
