"""Serving whole signed batches (Core.segments) and checking them without a copy (SegmentVerifier)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.errors import Corruption, SignatureError
from feedlog.log import merkle
from feedlog.log.core import Core, Segment
from feedlog.log.crypto import KeyPair
from feedlog.log.merkle import TreeState
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication import wire
from feedlog.replication.verify import SegmentVerifier

KP = KeyPair.from_seed(bytes([3]) * 32)


def block(i: int) -> bytes:
    return f"block-{i}-".encode() * (1 + i % 5)


def build(path: Path, batches: list[int]) -> Core:
    core = Core.create(path, KP)
    n = 0
    for size in batches:
        core.append([block(i) for i in range(n, n + size)])
        n += size
    return core


def read_all(core: Core, start: int, end: int, budget: int) -> list[Segment]:
    out: list[Segment] = []
    pos = start
    stop = core.batch_end(end - 1)  # as a peer's Read does
    while pos < stop:
        segs = core.segments(pos, stop, budget)
        assert segs, "a read that has blocks left returns at least one"
        out += segs
        pos = segs[-1].end
    return out


def test_segments_follow_batch_boundaries(tmp_path: Path) -> None:
    with build(tmp_path / "f", [3, 1, 5]) as core:
        segs = core.segments(0, 9, 1 << 20)
        assert [(s.start, s.end, s.state.length if s.state else None) for s in segs] == [
            (0, 3, 3),
            (3, 4, 4),
            (4, 9, 9),
        ]
        # a range ending mid-batch is served to the batch's end, so its signature comes along
        assert [(s.start, s.end) for s in core.segments(1, 5, 1 << 20)] == [(1, 3), (3, 4), (4, 9)]
        assert core.segments(9, 9, 100) == [] and core.segments(10, 20, 100) == []


def test_budget_splits_a_batch_and_only_its_last_part_is_signed(tmp_path: Path) -> None:
    with build(tmp_path / "f", [20]) as core:
        segs = read_all(core, 0, 20, 30)
        assert len(segs) > 3
        assert all(s.state is None for s in segs[:-1]) and segs[-1].state == core.state
        assert [b for s in segs for b in s.blocks] == [block(i) for i in range(20)]


def test_record_index_survives_reopen_and_recovery(tmp_path: Path) -> None:
    build(tmp_path / "f", [2, 2]).close()
    with Core.open(tmp_path / "f") as core:
        core.append([block(4)])
        assert [s.end for s in core.segments(0, 5, 1 << 20)] == [2, 4, 5]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    data=st.data(),
)
def test_any_range_verifies_from_the_peers_roots(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int], data: st.DataObject
) -> None:
    total = sum(batches)
    start = data.draw(st.integers(0, total - 1))
    end = data.draw(st.integers(start + 1, total))
    budget = data.draw(st.sampled_from([1, 40, 1 << 20]))
    with build(tmp_path_factory.mktemp("p") / "f", batches) as core:
        roots = merkle.nodes_for_roots(start, core.node)
        v = SegmentVerifier(KP.public_key, start, roots)
        got: list[bytes | None] = []
        for seg in read_all(core, start, end, budget):
            out = v.add(wire.segment_of(wire.segment_pb(seg)))  # through the wire format too
            if out is not None:
                got += out.blocks
        assert got[: end - start] == [block(i) for i in range(start, end)]
        assert v.state is not None and v.state.length >= end


def _segs(tmp_path: Path) -> tuple[Core, list[Segment]]:
    core = build(tmp_path / "f", [4, 4])
    return core, core.segments(0, 8, 1 << 20)


def test_tampered_block_wrong_signature_and_wrong_key_are_caught(tmp_path: Path) -> None:
    core, segs = _segs(tmp_path)
    with core:
        bad = Segment(0, [b"evil", *segs[0].blocks[1:]], [], segs[0].state)
        with pytest.raises(Corruption, match="do not hash"):
            SegmentVerifier(KP.public_key, 0, [], source="peer X").add(bad)
        assert segs[0].state is not None
        forged = TreeState(4, 0, segs[0].state.tree_hash, bytes(64))
        with pytest.raises(SignatureError, match="peer X"):
            SegmentVerifier(KP.public_key, 0, [], source="peer X").add(Segment(0, segs[0].blocks, [], forged))
        other = KeyPair.from_seed(bytes([4]) * 32)
        with pytest.raises(SignatureError):
            SegmentVerifier(other.public_key, 0, []).add(segs[0])
        v = SegmentVerifier(KP.public_key, 0, [])
        v.add(segs[0])
        with pytest.raises(Corruption, match="expected 4"):
            v.add(Segment(5, segs[1].blocks[1:], [], segs[1].state))


def test_forged_roots_for_a_mid_feed_start_are_caught(tmp_path: Path) -> None:
    core, _ = _segs(tmp_path)
    with core:
        roots = merkle.nodes_for_roots(4, core.node)
        fake = [roots[0]._replace(hash=bytes(32))]
        v = SegmentVerifier(KP.public_key, 4, fake)
        with pytest.raises(Corruption):
            v.add(core.segments(4, 8, 1 << 20)[0])
        with pytest.raises(Corruption, match="do not fit"):
            SegmentVerifier(KP.public_key, 3, roots)


def test_cleared_blocks_verify_by_their_leaf(tmp_path: Path) -> None:
    with build(tmp_path / "f", [6]) as core:
        core.clear([2])
        seg = core.segments(0, 6, 1 << 20)[0]
        assert seg.blocks[2] is None and [n.index for n in seg.cleared] == [4]
        out = SegmentVerifier(KP.public_key, 0, []).add(wire.segment_of(wire.segment_pb(seg)))
        assert out is not None and out.blocks[2] is None and out.blocks[3] == block(3)
        # a peer claiming a cleared block must send the genuine leaf
        fake = Segment(0, seg.blocks, [seg.cleared[0]._replace(hash=bytes(32))], seg.state)
        with pytest.raises(Corruption):
            SegmentVerifier(KP.public_key, 0, []).add(fake)


def test_a_batch_spanning_messages_verifies_within_the_unsigned_bound(tmp_path: Path) -> None:
    """A signed batch may come in several parts; what is held unsigned is bounded, and released once signed."""
    with build(tmp_path / "f", [1, 40, 3]) as core:
        parts = read_all(core, 0, core.length, 200)  # the 40-block batch in parts, only its last signed
        assert sum(1 for s in parts if s.state is None) >= 3
        v = SegmentVerifier(KP.public_key, 0, [], max_unsigned=64 << 10)
        got = [b for s in parts if (b := v.receive(wire.segment_pb(s))) is not None]
        assert [b.state.length for b in got] == [1, 41, 44] and v.pending == 0 and v.unsigned.cost == 0


def test_unsigned_blocks_past_the_bound_are_refused_naming_the_peer(tmp_path: Path) -> None:
    v = SegmentVerifier(KP.public_key, 0, [], source="10.0.0.9:7000", max_unsigned=1 << 20)
    with pytest.raises(Corruption, match=r"10\.0\.0\.9:7000: sent \d+ blocks from 0 .*without a signed state"):
        for k in range(100):
            v.receive(pb.Segment(start=64 * k, blocks=[b"y" * 1024] * 64))
    assert v.pending < (1 << 20) // 1024
    # blocks are counted before anything is built from them: a million empty ones cost their count
    v = SegmentVerifier(KP.public_key, 0, [], source="peer", max_unsigned=1 << 20)
    with pytest.raises(Corruption, match="sent 1000000 blocks"):
        v.receive(pb.Segment(start=0, blocks=[b""] * 1_000_000))
    assert v.pending == 0


def reference_segments(core: Core, start: int, end: int, max_bytes: int) -> list[Segment]:
    """`Core.segments` as it was written first: a block at a time through `get_range` (each hash-checked)."""
    from bisect import bisect_right

    from feedlog.log.core import segment_cost

    end = min(end, core.length)
    if not 0 <= start < end:
        return []
    ends = core._records()
    i = bisect_right(ends, start)
    stop = ends[bisect_right(ends, end - 1)]
    out: list[Segment] = []
    size = 0
    blocks: list[bytes | None] = []
    cleared: list[merkle.Node] = []
    seg_start = start
    for seq, b in core.get_range(start, stop):
        cost = segment_cost(b, first=not blocks)
        if size + cost > max_bytes and (out or blocks):
            break
        size += cost
        if b is None:
            cleared.append(core.node(2 * seq))
        blocks.append(b)
        if seq + 1 == ends[i]:
            out.append(Segment(seg_start, blocks, cleared, core._record_state(i)))
            blocks, cleared, seg_start = [], [], seq + 1
            i += 1
    if blocks:
        out.append(Segment(seg_start, blocks, cleared, None))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    data=st.data(),
)
def test_segments_are_the_block_at_a_time_reference(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int], data: st.DataObject
) -> None:
    """The batch-at-a-time `segments` (numpy budget, one pread) against the block-at-a-time reference:
    any range, budgets from below one block to all, cleared blocks anywhere, checked or not, and
    reads longer than SEGMENT_ROWS index entries."""
    import feedlog.log.core as core_mod

    total = sum(batches)
    gone = data.draw(st.lists(st.integers(0, total - 1), max_size=6))
    rows = data.draw(st.sampled_from([core_mod.SEGMENT_ROWS, 3, 7]))
    with build(tmp_path_factory.mktemp("p") / "f", batches) as core:
        if gone:
            core.clear(gone)
        for _ in range(4):
            start = data.draw(st.integers(0, total))
            end = data.draw(st.integers(start, total + 2))
            budget = data.draw(st.sampled_from([1, 20, 210, 250, 600, 3000, 1 << 20]))
            want = reference_segments(core, start, end, budget)
            old, core_mod.SEGMENT_ROWS = core_mod.SEGMENT_ROWS, rows
            try:
                for check in (True, False):
                    assert core.segments(start, end, budget, check=check) == want
            finally:
                core_mod.SEGMENT_ROWS = old


def test_a_tampered_block_is_refused_by_the_serving_check_or_by_the_reader(tmp_path: Path) -> None:
    """check=True (local readers) refuses a block that fails its leaf hash; a peer's Read (check=False)
    sends it, and the reader's verifier refuses the batch against its signed tree."""
    with build(tmp_path / "f", [4, 4]) as core:
        off, _n, _ = core._entry(5)
        with open(tmp_path / "f" / "log", "r+b") as f:
            f.seek(off)
            f.write(bytes([block(5)[0] ^ 1]))
        with pytest.raises(Corruption, match="block 5 fails its hash check"):
            core.segments(4, 8, 1 << 20)
        segs = core.segments(0, 8, 1 << 20, check=False)
        assert segs[1].blocks[1] != block(5)
        v = SegmentVerifier(KP.public_key, 0, [], source="peer X")
        v.add(segs[0])
        with pytest.raises(Corruption, match="do not hash"):
            v.add(segs[1])
