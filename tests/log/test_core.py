"""The on-disk signed log: durability rules, recovery, corruption detection, clearing."""

import os
from pathlib import Path

import pytest

from feedlog.errors import AlreadyExists, Corruption, NotFound, ReadOnly, SignatureError, Unavailable
from feedlog.log import core as core_mod
from feedlog.log import merkle, storage
from feedlog.log.core import Core
from feedlog.log.crypto import KeyPair

KP = KeyPair.from_seed(bytes([5]) * 32)


def blocks(n: int, start: int = 0) -> list[bytes]:
    return [f"block {i}".encode() * (1 + i % 3) for i in range(start, start + n)]


def make(tmp_path: Path, n: int = 10, batch: int = 3) -> Path:
    p = tmp_path / "f"
    with Core.create(p, KP) as c:
        data = blocks(n)
        for i in range(0, n, batch):
            c.append(data[i : i + batch])
    return p


def test_reopen_after_clean_close_replays_nothing(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p) as c:
        assert c.length == 10 and c.recovered_batches == 0
        assert [b for _, b in c.get_range(0, 10)] == blocks(10)
        assert c.verify().length == 10


def test_create_twice_and_missing(tmp_path: Path) -> None:
    p = make(tmp_path)
    with pytest.raises(AlreadyExists):
        Core.create(p, KP)
    with pytest.raises(NotFound):
        Core.open(tmp_path / "nope")


def test_one_writer_at_a_time_but_readers_welcome(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p) as w:
        with pytest.raises(Unavailable, match="open for writing"):
            Core.open(p)
        r = Core.open(p, writable=False)
        w.append([b"more"])
        assert r.length == 10
        assert r.refresh() == 1 and r.get(10) == b"more"
        with pytest.raises(ReadOnly):
            r.append([b"x"])
        r.close()


def test_crash_without_checkpoint_is_recovered_from_the_log(tmp_path: Path) -> None:
    p = make(tmp_path)
    # simulate a crash after the last append: caches and checkpoint lost, log intact
    (p / storage.CHECKPOINT).unlink()
    os.truncate(p / storage.TREE, 0)
    os.truncate(p / storage.INDEX, 0)
    with Core.open(p) as c:
        assert c.recovered_batches == 4 and c.length == 10
        assert c.get(9) == blocks(10)[9]
        c.verify()


@pytest.mark.parametrize("cut", [1, 7, 40, 150])
def test_torn_tail_is_truncated_never_served(tmp_path: Path, cut: int) -> None:
    p = make(tmp_path)
    with Core.open(p) as c:
        before = c.state
    with Core.open(p) as c:
        c.append([b"x" * 100])
    # tear the last record: as if power failed mid-write
    size = (p / storage.LOG).stat().st_size
    os.truncate(p / storage.LOG, size - cut)
    (p / storage.CHECKPOINT).unlink()  # the crash also lost the checkpoint that close() wrote
    with Core.open(p) as c:
        assert c.length == 10 and c.state == before
        assert c.truncated_bytes > 0
        c.verify()
        c.append([b"after"])  # and the log goes on from there
    with Core.open(p) as c:
        assert c.length == 11 and c.get(10) == b"after"


def test_garbage_after_the_last_record_is_dropped(tmp_path: Path) -> None:
    p = make(tmp_path)
    with open(p / storage.LOG, "ab") as f:
        f.write(b"FLB1" + os.urandom(300))
    with Core.open(p) as c:
        assert c.length == 10 and c.truncated_bytes == 304


def test_flipped_bit_in_a_block_is_detected_on_read_and_verify(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p, writable=False) as c:
        off, _n, _ = c._entry(4)
    with open(p / storage.LOG, "r+b") as f:
        f.seek(off + 2)
        b = f.read(1)
        f.seek(off + 2)
        f.write(bytes([b[0] ^ 0x40]))
    with Core.open(p, writable=False) as c:
        with pytest.raises(Corruption, match="block 4"):
            c.get(4)
        with pytest.raises(Corruption, match="block 4"):
            list(c.get_range(0, 10))
        with pytest.raises(Corruption, match="block 4"):
            c.verify()
        assert c.get(5) == blocks(10)[5]  # the rest is still served


def test_tampered_log_record_signature_fails_recovery(tmp_path: Path) -> None:
    p = make(tmp_path, n=3, batch=3)
    (p / storage.CHECKPOINT).unlink()
    raw = bytearray((p / storage.LOG).read_bytes())
    # re-sign nothing, but swap in a valid-CRC record carrying another key's signature
    rec = storage.decode_batch(bytes(raw), 0)
    assert rec is not None
    other = KeyPair.from_seed(bytes(32))
    from feedlog.log.crypto import Signer

    bad_sig = Signer(other.seed or b"").sign(merkle.TreeState(rec.length, 0, rec.tree_hash, b"").signable())
    blocks_ = [bytes(raw[o : o + n]) for o, n in zip(rec.block_offsets, rec.block_lengths, strict=True)]
    rebuilt, _ = storage.encode_batch(0, blocks_, 0, rec.tree_hash, bad_sig, 0, 0)
    (p / storage.LOG).write_bytes(rebuilt)
    with pytest.raises(Corruption, match="signature"):
        Core.open(p)


def test_append_signed_verifies_before_storing(tmp_path: Path) -> None:
    src = make(tmp_path, n=6)
    with Core.open(src, writable=False) as s:
        state = s.state
        data = [b or b"" for _, b in s.get_range(0, 6)]
    replica = tmp_path / "replica"
    with Core.create(replica, KeyPair(KP.public_key, None)) as r:
        with pytest.raises(SignatureError):
            r.append_signed(data, merkle.TreeState(6, 0, state.tree_hash, bytes(64)))
        with pytest.raises(Corruption):
            r.append_signed([*data[:5], b"evil"], state)
        assert r.length == 0
        r.append_signed(data, state)
        assert r.state == state and r.verify().length == 6
        with pytest.raises(ReadOnly):
            r.append([b"no key"])


def test_clear_keeps_proofs_and_survives_reopen(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p) as c:
        assert c.clear([2, 3, 3]) == 2
        assert c.clear([2]) == 0
        assert c.get(2) is None and c.get(4) == blocks(10)[4]
        merkle.verify_proof(c.proof(4), KP.public_key)
        with pytest.raises(NotFound, match="cleared"):
            c.proof(2)
    raw = (p / storage.LOG).read_bytes()
    assert blocks(10)[2] not in raw  # the payload really is gone from disk
    with Core.open(p) as c:
        rep = c.verify()
        assert rep.cleared == 2 and rep.length == 10
        c.append([b"later"])
        assert c.verify().length == 11


def test_checkpoint_interval_bounds_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_mod, "CHECKPOINT_BYTES", 200)
    p = tmp_path / "f"
    with Core.create(p, KP) as c:
        for _i in range(20):
            c.append([b"y" * 50])
        ck = storage.Checkpoint.load(p / storage.CHECKPOINT)
        assert ck.length > 10  # checkpoints happened along the way, not only at close


@pytest.mark.parametrize("sizes", [[], [0], [5], [3, 0, 7, 1 << 20], list(range(300))])
def test_packed_index_entries_and_record_parts_match_the_plain_encoding(sizes: list[int]) -> None:
    blocks = [bytes([n % 251]) * n for n in sizes]
    expected = b"".join(storage.INDEX_ENTRY.pack(1000 + sum(sizes[:k]), n, 0) for k, n in enumerate(sizes))
    assert storage.index_entries(1000, sizes) == expected
    if blocks:
        rec, first = storage.encode_batch(7, blocks, 2, b"t" * 32, b"s" * 64, 3, 9)
        parts, first2, total = storage.encode_batch_parts(7, blocks, sizes, 2, b"t" * 32, b"s" * 64, 3, 9)
        assert (b"".join(parts), first2, total) == (rec, first, len(rec))


def test_a_reader_maps_the_grown_index_and_tree_and_refuses_a_lost_entry(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p) as w, Core.open(p, writable=False) as r:
        assert r.get(9) == blocks(10)[9]  # maps the files as they are
        for k in range(40):
            w.append(blocks(3, 10 + 3 * k))
        assert r.refresh() == 120
        assert [r.get(s) for s in (10, 64, 129)] == [blocks(130)[s] for s in (10, 64, 129)]
    with Core.open(p) as c:
        c.checkpoint()
    os.truncate(p / storage.INDEX, 16 * 100)  # entries 100.. lost, the checkpoint says they are durable
    with Core.open(p, writable=False) as r:
        assert r.get(99) == blocks(100)[99]
        with pytest.raises(Corruption, match="index entries 100"):
            r.get(100)


def test_a_tampered_block_fails_its_hash_check_through_the_maps_and_after_growth(tmp_path: Path) -> None:
    p = make(tmp_path)
    with Core.open(p) as c:
        assert c.get(4) == blocks(10)[4]  # maps made
        off, _n, _ = c._entry(4)
        with open(p / storage.LOG, "r+b") as f:
            f.seek(off)
            f.write(bytes([blocks(10)[4][0] ^ 1]))
        with pytest.raises(Corruption, match="block 4 fails its hash check"):
            c.get(4)
        c.append([b"new"])  # past the maps: read with a pread, checked the same way
        assert c.get(10) == b"new"
        with pytest.raises(Corruption, match="block 4 fails its hash check"):
            c._get_unmapped(4)
