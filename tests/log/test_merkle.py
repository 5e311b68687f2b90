"""Proofs over random trees (Hypothesis): every block verifies, every tampering fails."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.errors import Corruption, SignatureError
from feedlog.log import merkle
from feedlog.log.crypto import KeyPair, Signer
from feedlog.log.merkle import Node, TreeState

KP = KeyPair.from_seed(bytes(range(32)))
OTHER = KeyPair.from_seed(bytes(32))


def build(blocks: list[bytes], batch_sizes: list[int]) -> tuple[dict[int, Node], TreeState]:
    nodes: dict[int, Node] = {}
    roots: list[Node] = []
    start = 0
    i = 0
    while start < len(blocks):
        n = batch_sizes[i % len(batch_sizes)]
        i += 1
        created, roots = merkle.append_leaves(roots, start, blocks[start : start + n])
        nodes.update((c.index, c) for c in created)
        start += n
    th = merkle.roots_hash(roots)
    sig = Signer(KP.seed or b"").sign(TreeState(len(blocks), 0, th, b"").signable())
    return nodes, TreeState(len(blocks), 0, th, sig)


blocks_st = st.lists(st.binary(max_size=40), min_size=1, max_size=70)
batches_st = st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(blocks_st, batches_st, st.data())
def test_every_block_proves_and_tampering_fails(blocks: list[bytes], batches: list[int], data: st.DataObject) -> None:
    nodes, state = build(blocks, batches)
    # batching does not change the tree
    _, state_one = build(blocks, [len(blocks)])
    assert state_one.tree_hash == state.tree_hash
    seq = data.draw(st.integers(min_value=0, max_value=len(blocks) - 1))
    proof = merkle.build_proof(seq, blocks[seq], state, nodes.__getitem__)
    merkle.verify_proof(proof, KP.public_key)
    assert len(proof.path) <= len(blocks).bit_length()

    with pytest.raises(Corruption):
        merkle.verify_proof(replace(proof, block=blocks[seq] + b"x"), KP.public_key)
    if proof.path:
        k = data.draw(st.integers(min_value=0, max_value=len(proof.path) - 1))
        bad = proof.path[k]._replace(hash=bytes(32))
        with pytest.raises(Corruption):
            merkle.verify_proof(replace(proof, path=(*proof.path[:k], bad, *proof.path[k + 1 :])), KP.public_key)
    with pytest.raises(SignatureError):
        merkle.verify_proof(proof, OTHER.public_key)
    with pytest.raises(Corruption):
        merkle.verify_proof(replace(proof, state=replace(state, length=state.length + 1)), KP.public_key)
    if len(blocks) > 1:
        other = (seq + 1) % len(blocks)
        if blocks[other] != blocks[seq]:
            with pytest.raises(Corruption):
                merkle.verify_proof(replace(proof, seq=other), KP.public_key)


def test_signature_over_other_length_is_rejected() -> None:
    blocks = [b"a", b"b", b"c"]
    nodes, state = build(blocks, [3])
    forged = replace(state, signature=bytes(64))
    with pytest.raises(SignatureError):
        merkle.verify_proof(merkle.build_proof(1, b"b", forged, nodes.__getitem__), KP.public_key)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=1100), min_size=1, max_size=60), batches_st)
def test_fold_packs_exactly_the_nodes_append_leaves_creates(blocks: list[bytes], batches: list[int]) -> None:
    # the append path's packed fold against the Node-per-node reference, batch after batch
    roots: list[Node] = []
    start = i = 0
    while start < len(blocks):
        n = batches[i % len(batches)]
        i += 1
        batch = blocks[start : start + n]
        created, expected_roots = merkle.append_leaves(roots, start, batch)
        f = merkle.fold(roots, start, batch)
        got = dict((n.index, n) for n in f.outside)
        for k in range(len(f.have)):
            if f.have[k]:
                h, size = merkle.NODE.unpack_from(f.buf, 40 * k)
                got[f.lo + k] = Node(f.lo + k, h, size)
            else:
                assert f.buf[40 * k : 40 * k + 40] == bytes(40)
        assert got == {c.index: c for c in created}
        assert f.roots == expected_roots and all(o.index < f.lo for o in f.outside)
        roots, start = expected_roots, start + len(batch)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.integers(min_value=1, max_value=700))
def test_fold_have_marks_exactly_the_range_nodes_a_wide_batch_computes(start: int, n: int) -> None:
    # `have` is derived from the range alone (a replay writes the range in its runs): deep levels too
    _, roots = merkle.append_leaves([], 0, [b"o"] * start)
    created, _ = merkle.append_leaves(roots, start, [b"n"] * n)
    f = merkle.fold(roots, start, [b"n"] * n)
    assert {f.lo + k for k, h in enumerate(f.have) if h} == {c.index for c in created if c.index >= f.lo}
    assert {o.index for o in f.outside} == {c.index for c in created if c.index < f.lo}
