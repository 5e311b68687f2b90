"""What an append may carry (issue 13 items 9 and 6): valid entries only, no block over MAX_BLOCK_BYTES.

Bad blocks are refused wherever a writer appends; a feed that holds one anyway
(signed by its author, replicated as is) still reads: the block shows as invalid.
"""

import json
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.errors import InvalidArgument
from feedlog.log import entries, merkle
from feedlog.log.core import MAX_BLOCK_BYTES
from feedlog.log.crypto import KeyPair, Signer
from feedlog.log.feed import Feed, Write
from feedlog.pb import drive_pb2, hyperdb_pb2

KP = KeyPair.from_seed(bytes([5]) * 32)

NON_UTF8_KEY = b"\x0a\x02\xff\xfe\x22\x00"  # Entry{key: b"\xff\xfe" (not UTF-8), trie: b""}
BAD_BLOCKS = {
    "empty block": b"",
    "second header": entries.encode_header(entries.ENTRY),
    "key not UTF-8": NON_UTF8_KEY,
    "no trie": hyperdb_pb2.Entry(key="k").SerializePartialToString(),
    "empty key": hyperdb_pb2.Entry(key="", trie=b"").SerializeToString(),
    "garbage": b"\xff\x00 not an entry",
}


def signed(feed: Feed, blocks: list[bytes]) -> bytes:
    core = feed.core
    _, roots = merkle.append_leaves(core.roots(), core.length, blocks)
    state = merkle.TreeState(core.length + len(blocks), 0, merkle.roots_hash(roots), b"")
    return Signer(KP.seed or b"").sign(state.signable())


def entry(key: str, value: bytes = b"v") -> bytes:
    return entries.encode_entry(entries.ENTRY, key, value, deleted=False, timestamp=None, expires_at=None)


@pytest.mark.parametrize("kind", sorted(BAD_BLOCKS))
def test_a_key_holders_append_refuses_blocks_readers_cannot_use(tmp_path: Path, kind: str) -> None:
    with Feed.create(tmp_path / "f", key_pair=KP) as f:
        f.put("a", b"1")
        before = f.core.state
        blocks = [entry("ok"), BAD_BLOCKS[kind]]
        with pytest.raises(InvalidArgument, match="block 3"):
            f.append_with_signature(2, blocks, signed(f, blocks))
        assert f.core.state == before


def test_drive_event_content_is_checked_too(tmp_path: Path) -> None:
    no_mode = drive_pb2.DriveEvent(stat=drive_pb2.Stat(size=3)).SerializePartialToString()
    bad = [
        hyperdb_pb2.Entry(key="/f", trie=b"", value=no_mode).SerializeToString(),
        hyperdb_pb2.Entry(key="/f", trie=b"", value=b"\xff\xff").SerializeToString(),
    ]
    with Feed.create(tmp_path / "d", key_pair=KP, content_type=entries.DRIVE_EVENT) as f:
        for block in bad:
            with pytest.raises(InvalidArgument, match="block 1"):
                f.append_with_signature(1, [block], signed(f, [block]))
        assert f.length == 1


def test_blocks_over_the_limit_are_refused_on_every_append_path(tmp_path: Path) -> None:
    big = bytes(MAX_BLOCK_BYTES + 1)
    limit = MAX_BLOCK_BYTES
    with Feed.create(tmp_path / "f", key_pair=KP) as f:
        for call in (
            lambda: f.put("big", big),
            lambda: f.check([Write("big", big)]),
            lambda: f.core.append([big]),
        ):
            with pytest.raises(InvalidArgument, match=rf"\d+ bytes.*limit is {limit}"):
                call()
        blocks = [entry("k", big)]
        with pytest.raises(InvalidArgument, match=f"limit is {limit}"):
            f.append_with_signature(1, blocks, signed(f, blocks))
        assert f.length == 1
        f.put("fits", bytes(MAX_BLOCK_BYTES - 100))  # the limit is on the encoded block
        assert f.length == 2 and f.verify().length == 2


def test_a_replica_refuses_an_oversized_signed_batch(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "author", key_pair=KP) as author:
        header = author.core.get(0)
        assert header is not None
        big = [entry("k", bytes(MAX_BLOCK_BYTES + 10))]
        _, roots = merkle.append_leaves(author.core.roots(), 1, big)
        th = merkle.roots_hash(roots)
        sig = Signer(KP.seed or b"").sign(merkle.TreeState(2, 0, th, b"").signable())
        with Feed.create_replica(tmp_path / "copy", KP.public_key) as copy:
            copy.store_signed([header], author.core.state)
            with pytest.raises(InvalidArgument, match=f"limit is {MAX_BLOCK_BYTES}"):
                copy.store_signed(big, merkle.TreeState(2, 0, th, sig))
            assert copy.length == 1


def feed_holding_bad_blocks(path: Path) -> None:
    """A feed whose author signed invalid blocks (bypassing the checks through Core, as another tool could)."""
    with Feed.create(path, key_pair=KP, timestamps="off") as f:
        f.put("a", b"1")
        f.core.append([BAD_BLOCKS["key not UTF-8"], BAD_BLOCKS["empty block"], BAD_BLOCKS["second header"]])
        f.put("b", b"2")


def test_readers_show_invalid_blocks_instead_of_crashing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "f"
    feed_holding_bad_blocks(p)
    with Feed.open(p, writable=False) as f:
        recs = list(f.records())
        assert [r.invalid is not None for r in recs] == [False, True, True, True, False]
        assert recs[1].block == NON_UTF8_KEY and "UTF-8" in (recs[1].invalid or "")
        b = f.get("b")
        assert b is not None and b.value == b"2" and f.history("a")[0].value == b"1"
        assert f.info()["length"] == 6 and f.verify().length == 6
    assert main(["cat", "--json", str(p)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[1]["invalid"] and rows[1]["block"] == NON_UTF8_KEY.hex() and rows[2]["block"] == ""
    assert rows[4]["key"] == "b"
    for argv in (["cat", str(p)], ["cat", "--raw", "--json", str(p)], ["info", str(p)], ["verify", str(p)]):
        assert main(argv) == 0, argv
    assert "invalid" in capsys.readouterr().out
    with Feed.open(p) as f:  # compaction walks every record too
        f.compact(overwritten=True)


def test_a_batch_heavier_than_any_reader_holds_is_refused_and_bulk_append_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    value = "v" * (7 << 20)  # five of these weigh more than MAX_BATCH_BYTES
    with Feed.create(tmp_path / "f") as feed:
        with pytest.raises(InvalidArgument, match="smaller batches"):
            feed.append([Write(f"/k{i}", value.encode()) for i in range(5)])
        assert feed.length == 1  # nothing written
        with pytest.raises(InvalidArgument, match="smaller batches"):
            feed.check([Write(f"/k{i}", value.encode()) for i in range(5)])
    lines = tmp_path / "big.jsonl"
    lines.write_text("".join(json.dumps({"key": f"/k{i}", "value": value}) + "\n" for i in range(5)))
    assert main(["append", str(tmp_path / "f"), "--jsonl", str(lines)]) == 0
    with Feed.open(tmp_path / "f", writable=False) as feed:
        assert feed.length == 6 and feed.verify().length == 6
        assert feed.core.batch_end(1) < 6  # cut into batches a reader can take back
    capsys.readouterr()
