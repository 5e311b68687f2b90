"""A writer withdraws a key (issue 37): one signed forget entry, and every copy clears what it withdraws.

Checked on the bytes: after a forget, no file of the feed directory holds a
withdrawn value, while the feed still verifies (Merkle nodes stay).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from feedlog import failpoints
from feedlog.errors import InvalidArgument, ReadOnly
from feedlog.log import entries, forgets, merkle
from feedlog.log.crypto import KeyPair, Signer
from feedlog.log.feed import Feed, Write
from feedlog.pb import hyperdb_pb2

ROOT = Path(__file__).resolve().parents[2]
KP = KeyPair.from_seed(bytes([7]) * 32)


def files_holding(d: Path, needle: bytes) -> list[str]:
    """Names of the files under `d` whose bytes hold `needle`."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and needle in p.read_bytes())


def entry(key: str, value: bytes | None = None, *, forget: bool = False) -> bytes:
    deleted = value is None
    return entries.encode_entry(
        entries.ENTRY, key, value, deleted=deleted, timestamp=None, expires_at=None, forget=forget
    )


def sign(roots: list[merkle.Node], length: int, blocks: list[bytes]) -> merkle.TreeState:
    """The author's signed state after appending `blocks` at `length` (roots: the tree's before them)."""
    _, new = merkle.append_leaves(roots, length, blocks)
    state = merkle.TreeState(length + len(blocks), 0, merkle.roots_hash(new), b"")
    return merkle.TreeState(state.length, 0, state.tree_hash, Signer(KP.seed or b"").sign(state.signable()))


def test_forget_clears_every_earlier_entry_of_the_key_here(tmp_path: Path) -> None:
    p = tmp_path / "f"
    with Feed.create(p, key_pair=KP) as f:
        f.put("k", b"needle-one")
        f.put("other", b"kept")
        f.put("k", b"needle-two")
        f.delete("k")
        a = f.forget("k")
        assert a.seq == 5 and a.expires_at is None
        assert f.get("k") is None and f.forgotten("k") == 5 and f.forgotten("other") is None
        assert [(r.seq, r.forget, r.deleted) for r in f.history("k")] == [(5, True, True)]
        assert [r.cleared for r in f.records()] == [True, False, True, True, False]
        got = f.get("other")
        assert got is not None and got.value == b"kept"
        assert f.verify().cleared == 3
        f.put("k", b"again")  # a key can be written again after its withdrawal
        again = f.get("k")
        assert again is not None and again.value == b"again" and f.forgotten("k") is None
    assert files_holding(p, b"needle") == []
    assert not (p / forgets.PENDING_FILE).exists()
    with Feed.open(p) as f:
        assert f.verify().length == 7 and [r.seq for r in f.history("k")] == [5, 6]


def test_entries_before_the_forget_in_its_own_batch_are_stored_cleared(tmp_path: Path) -> None:
    p = tmp_path / "f"
    with Feed.create(p, timestamps="off") as f:
        f.append([Write("j", b"needle-a"), Write("x", b"kept"), Write("j", forget=True), Write("j", b"after")])
        assert [(r.seq, r.cleared) for r in f.records()] == [(1, True), (2, False), (3, False), (4, False)]
        got = f.get("j")
        assert got is not None and got.value == b"after"
        f.verify()
    assert files_holding(p, b"needle") == []


def test_a_forget_entry_reads_as_a_deletion_to_hyperdb() -> None:
    block = entry("k", forget=True)
    e = hyperdb_pb2.Entry()
    e.ParseFromString(block)
    assert e.deleted and e.key == "k"
    # field 11 is one that hyperdb's schema never used: its reader skips it as unknown
    assert {f.number for f, _ in e.ListFields()} == {1, 3, 4, 11}
    r = entries.decode_entry(entries.ENTRY, 1, block)
    assert r.forget and r.deleted
    with pytest.raises(InvalidArgument, match="deletion"):
        entries.encode_entry(entries.ENTRY, "k", b"v", deleted=False, timestamp=None, expires_at=None, forget=True)


def test_drive_event_feed_forgets_a_path(tmp_path: Path) -> None:
    p = tmp_path / "d"
    with Feed.create(p, content_type=entries.DRIVE_EVENT) as f:
        f.put("/secret.txt", {"mode": 33188, "size": 987654321})
        f.put("/other", {"mode": 33188, "size": 5})
        a = f.forget("/secret.txt")
        r = f.record(a.seq)
        assert r.forget and r.deleted and r.stat is None and r.key == "/secret.txt"
        assert f.record(1).cleared and not f.record(2).cleared
        assert f.get("/secret.txt") is None and f.forgotten("/secret.txt") == a.seq
        f.verify()
    with Feed.open(p) as f:
        assert [r.stat for r in f.records() if not r.cleared and r.stat] == [{"mode": 33188, "size": 5}]


def test_forget_refused_on_a_feed_we_cannot_sign_changes_nothing(tmp_path: Path) -> None:
    with Feed.create(tmp_path / "f", key_pair=KP) as f:
        f.put("k", b"needle")
        src_state = f.core.state
        blocks = [b for _, b in f.core.get_range(0, f.length)]
    with Feed.create_replica(tmp_path / "copy", KP.public_key) as copy:
        copy.store_signed([b for b in blocks if b is not None], src_state)
    with Feed.open(tmp_path / "copy") as copy:
        before = {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()}
        with pytest.raises(ReadOnly, match="no secret key"):
            copy.forget("k")
        assert {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()} == before
    with Feed.create(tmp_path / "g") as f, pytest.raises(InvalidArgument, match="no value"):
        f.append([Write("k", b"v", forget=True)])


def test_a_replica_clears_when_it_stores_the_forget_entry(tmp_path: Path) -> None:
    """store_signed (followers, pull, clone): earlier batches and the forget's own batch alike."""
    header = entries.encode_header(entries.ENTRY)
    first = [header, entry("k", b"needle-old"), entry("x", b"kept")]
    s1 = sign([], 0, first)
    second = [entry("k", b"needle-new"), entry("k", forget=True), entry("k", b"after")]
    roots = merkle.append_leaves([], 0, first)[1]
    s2 = sign(roots, 3, second)
    p = tmp_path / "copy"
    with Feed.create_replica(p, KP.public_key) as copy:
        copy.store_signed(first, s1)
        assert files_holding(p, b"needle-old") == ["log"]
        copy.store_signed_many([(second, s2)])
        assert [r.cleared for r in copy.records()] == [True, False, True, False, False]
        assert copy.forgotten("x") is None and copy.get("k") is not None
        assert copy.verify().cleared == 2
    assert files_holding(p, b"needle") == []


def test_a_key_holders_remote_append_clears_on_the_peer(tmp_path: Path) -> None:
    """append_with_signature (a peer-hosted feed appended to by its key holder)."""
    with Feed.create_replica(tmp_path / "peer", KP.public_key) as peer:
        header = entries.encode_header(entries.ENTRY)
        first = [header, entry("k", b"needle-old")]
        peer.append_with_signature(0, first, sign([], 0, first).signature)
        roots = merkle.append_leaves([], 0, first)[1]
        second = [entry("k", forget=True)]
        peer.append_with_signature(2, second, sign(roots, 2, second).signature)
        assert peer.record(1).cleared and peer.forgotten("k") == 2
    assert files_holding(tmp_path / "peer", b"needle") == []


def test_a_forged_forget_clears_nothing(tmp_path: Path) -> None:
    """Only a batch that verifies withdraws anything: a hostile sender cannot make a copy clear."""
    header = entries.encode_header(entries.ENTRY)
    first = [header, entry("k", b"needle-old")]
    with Feed.create_replica(tmp_path / "copy", KP.public_key) as copy:
        copy.store_signed(first, sign([], 0, first))
        roots = merkle.append_leaves([], 0, first)[1]
        forged = [entry("k", forget=True)]
        state = sign(roots, 2, [entry("k", b"something else")])
        with pytest.raises(Exception, match="signed tree hash"):
            copy.store_signed(forged, state)
        assert not copy.record(1).cleared and copy.length == 2
    assert not (tmp_path / "copy" / forgets.PENDING_FILE).exists()


def run_child(code: str, points: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), failpoints.ENV: points}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=60, capture_output=True)
    assert proc.returncode in (0, failpoints.EXIT_CODE), proc.stderr.decode()
    return proc.returncode


@pytest.mark.parametrize("point", ["forget.marked", "core.forget_hidden", "forget.applied"])
def test_a_writer_killed_while_forgetting_finishes_on_open(tmp_path: Path, point: str) -> None:
    """kill -9 at each step between storing a forget and clearing: reopening leaves no withdrawn payload
    beside a stored forget entry, and the feed verifies."""
    p = tmp_path / "f"
    with Feed.create(p, timestamps="off") as f:
        f.put("k", b"needle-stored")
    code = f"""
        from feedlog.log.feed import Feed, Write
        f = Feed.open({str(p)!r})
        f.append([Write("k", b"needle-in-batch"), Write("k", forget=True)])
    """
    assert run_child(code, f"{point}=exit") == failpoints.EXIT_CODE
    with Feed.open(p) as f:
        f.verify()
        stored = f.length == 4
        assert stored == (point != "forget.marked")
        if stored:
            assert f.forgotten("k") == 3 and f.get("k") is None
    assert not (p / forgets.PENDING_FILE).exists()
    if stored:
        assert files_holding(p, b"needle") == []


def test_compaction_keeps_forget_entries(tmp_path: Path) -> None:
    """A copy that has not stored a forget yet learns from it what to clear: compacting overwritten
    entries never clears a forget entry, even once its key is written again."""
    with Feed.create(tmp_path / "f") as f:
        f.put("k", b"needle")
        gone = f.forget("k").seq
        f.put("k", b"again")
        f.put("k", b"and again")
        report = f.compact(overwritten=True)
        assert report.cleared == 1  # "again" only
        assert f.record(gone).forget and not f.record(gone).cleared


def test_append_jsonl_forget_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from feedlog.cli import main

    p = tmp_path / "f"
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"key": "k", "value": "needle"}\n{"key": "k", "forget": true}\n{"key": "j", "value": "v"}\n')
    assert main(["create", str(p)]) == 0
    assert main(["append", str(p), "--jsonl", str(lines)]) == 0
    with Feed.open(p) as f:
        assert f.forgotten("k") == 2 and f.record(1).cleared and f.verify().cleared == 1
    assert files_holding(p, b"needle") == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "k", "forget": true, "value": "x"}\n')
    capsys.readouterr()
    assert main(["append", str(p), "--jsonl", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


def _copy(writer: Feed, path: Path) -> Feed:
    """A replica of `writer` as a follower stores it (the writer's cleared blocks arrive as holes)."""
    copy = Feed.create_replica(path, writer.key)
    for s in writer.core.segments(0, writer.length, 1 << 30):
        assert s.state is not None  # one segment per signed batch here
        copy.store_signed(s.blocks, s.state, leaves=s.cleared)
    return copy


def test_a_fill_from_a_peer_behind_the_forget_brings_nothing_back(tmp_path: Path) -> None:
    """A copy that holds the forget gets the withdrawn entry as a hole; another peer that has not seen the
    forget yet still serves its payload: the fill must leave it cleared (found by review)."""
    with Feed.create(tmp_path / "w", key_pair=KP, timestamps="off") as w:
        w.append([Write("/k", b"needle-withdrawn"), Write("/x", b"kept")])
        with _copy(w, tmp_path / "behind") as behind:
            w.forget("/k")
            with _copy(w, tmp_path / "ahead") as ahead:
                assert ahead.core.holes(0, ahead.length, 10) == [1]
                ahead.fill(1, [behind.core.get(1)])
                assert ahead.core.holes(0, ahead.length, 10) == []  # no longer a hole: we know why it is empty
                assert ahead.record(1).cleared and ahead.get("/k") is None
                assert [r.seq for r in ahead.history("/k")] == [3]
                ahead.verify()
    assert files_holding(tmp_path / "ahead", b"needle") == []


def test_a_filled_forget_entry_is_applied_even_if_killed_between(tmp_path: Path) -> None:
    """A forget entry that arrives by a fill clears its key's earlier payloads; killed between storing it and
    clearing them, the copy finishes on open."""
    with Feed.create(tmp_path / "w", key_pair=KP, timestamps="off") as w:
        w.append([Write("/k", b"needle-withdrawn"), Write("/x", b"kept")])
        withdrawn = w.core.get(1)  # as a peer behind the forget still has it
        w.append([Write("/k", forget=True)])
        forget_block = w.core.get(3)
        assert forget_block is not None
        forget_leaf = w.core.leaf(3)
        segs = list(w.core.segments(0, w.length, 1 << 30))
    # a copy whose upstream withheld the forget entry as a hole (the payload at seq 1 it still sent)
    p = tmp_path / "copy"
    with Feed.create_replica(p, KP.public_key) as copy:
        for s in segs:
            blocks = [
                withdrawn if s.start + i == 1 else None if s.start + i == 3 else b for i, b in enumerate(s.blocks)
            ]
            withheld = [forget_leaf] if s.start <= 3 < s.start + len(s.blocks) else []
            leaves = [*(n for n in s.cleared if n.index != 2), *withheld]
            assert s.state is not None
            copy.store_signed(blocks, s.state, leaves=leaves)
        assert copy.core.holes(0, copy.length, 10) == [3] and files_holding(p, b"needle") == ["log"]
    code = f"""
        from feedlog.log.feed import Feed
        c = Feed.open({str(p)!r})
        c.fill(3, [bytes.fromhex({forget_block.hex()!r})])
    """
    assert run_child(code, "forget.fill_marked=exit") == failpoints.EXIT_CODE
    assert (p / forgets.PENDING_FILE).exists()
    with Feed.open(p) as copy:  # reopening applies the forget the killed fill stored
        assert copy.forgotten("/k") == 3 and copy.record(1).cleared
        copy.verify()
    assert files_holding(p, b"needle") == [] and not (p / forgets.PENDING_FILE).exists()
