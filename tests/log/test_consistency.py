"""Consistency and fork proofs over random trees (Hypothesis): every prefix proves, every tampering fails,
every fork is proven and no prefix pair ever yields a fork proof."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.errors import Corruption, InvalidArgument, SignatureError
from feedlog.log import consistency, flat_tree, forks, merkle
from feedlog.log.consistency import ConsistencyProof, Inconsistent
from feedlog.log.crypto import KeyPair, Signer, Verifier
from feedlog.log.merkle import Node, TreeState

KP = KeyPair.from_seed(bytes(range(32)))
OTHER = KeyPair.from_seed(bytes(32))
V = Verifier(KP.public_key)


class History:
    """Every node and a signed state at every length of one history of blocks."""

    def __init__(self, blocks: list[bytes], kp: KeyPair = KP) -> None:
        self.nodes: dict[int, Node] = {}
        self.states: dict[int, TreeState] = {}
        signer = Signer(kp.seed or b"")
        roots: list[Node] = []
        for i, b in enumerate(blocks):
            created, roots = merkle.append_leaves(roots, i, [b])
            self.nodes.update((c.index, c) for c in created)
            th = merkle.roots_hash(roots)
            self.states[i + 1] = TreeState(i + 1, 0, th, signer.sign(TreeState(i + 1, 0, th, b"").signable()))

    def node(self, i: int) -> Node:
        return self.nodes[i]


blocks_st = st.lists(st.binary(max_size=12), min_size=2, max_size=80)


@settings(max_examples=80, deadline=None)
@given(blocks_st, st.data())
def test_every_prefix_proves_and_tampering_fails(blocks: list[bytes], data: st.DataObject) -> None:
    h = History(blocks)
    n = data.draw(st.integers(min_value=2, max_value=len(blocks)))
    m = data.draw(st.integers(min_value=1, max_value=n - 1))
    proof = consistency.prove(m, n, h.node)
    consistency.verify(proof, h.states[m], h.states[n], V)
    # O(log n): a root at m per bit of m; below the root at n spanning m a node per level, and the roots past it
    assert len(proof) <= m.bit_length() + 2 * n.bit_length()
    assert forks.check(KP.public_key, h.states[n], h.node, h.states[m]) is None

    # any altered hash or size fails
    k = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
    field = data.draw(st.sampled_from(["hash", "size"]))
    every = [*proof.old_roots, *proof.nodes]
    bad = every[k]._replace(hash=bytes(32)) if field == "hash" else every[k]._replace(size=every[k].size + 1)
    every[k] = bad
    tampered = replace(
        proof, old_roots=tuple(every[: len(proof.old_roots)]), nodes=tuple(every[len(proof.old_roots) :])
    )
    with pytest.raises(Corruption):
        consistency.verify(tampered, h.states[m], h.states[n], V)
    # ... as does a wrong length, a missing or extra node, or a state the key did not sign
    with pytest.raises(Corruption):
        consistency.verify(replace(proof, old_length=m + 1), h.states[m], h.states[n], V)
    with pytest.raises(Corruption):
        consistency.verify(proof, h.states[m], replace(h.states[n], length=n + 1), V)
    if proof.nodes:
        with pytest.raises(Corruption):
            consistency.verify(replace(proof, nodes=proof.nodes[:-1]), h.states[m], h.states[n], V)
    with pytest.raises(Corruption):
        consistency.verify(replace(proof, nodes=(*proof.nodes, proof.old_roots[0])), h.states[m], h.states[n], V)
    with pytest.raises(SignatureError):
        consistency.verify(proof, replace(h.states[m], signature=bytes(64)), h.states[n], V)
    with pytest.raises(SignatureError):
        consistency.verify(proof, h.states[m], h.states[n], Verifier(OTHER.public_key))
    # a proof between other lengths of the same history proves nothing for these states
    if m > 1:
        with pytest.raises(Corruption):
            consistency.verify(consistency.prove(m - 1, n, h.node), h.states[m], h.states[n], V)


@settings(max_examples=80, deadline=None)
@given(blocks_st, st.data())
def test_every_fork_is_proven_and_its_proof_verifies(blocks: list[bytes], data: st.DataObject) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(blocks) - 1))  # the first block that differs
    other = [*blocks[:at], blocks[at] + b"!", *data.draw(st.lists(st.binary(max_size=12), max_size=40))]
    a, b = History(blocks), History(other)
    m = data.draw(st.integers(min_value=at + 1, max_value=len(blocks)))
    n = data.draw(st.integers(min_value=at + 1, max_value=len(other)))
    # whoever holds the longer (or an equal) history judges the other's state from its own tree
    (short, sm), (long, ln) = sorted([(a, m), (b, n)], key=lambda x: x[1])
    fp = forks.check(KP.public_key, long.states[ln], long.node, short.states[sm])
    assert fp is not None
    forks.verify(fp)
    forks.verify(forks.loads(forks.dumps(fp)), KP.public_key)
    assert fp.fork_point == sm
    if sm < ln:  # the shorter side, sent the longer one's consistency proof, proves it as well
        proof = consistency.prove(sm, ln, long.node)
        with pytest.raises(Inconsistent):
            consistency.verify(proof, short.states[sm], long.states[ln], V)
        got = forks.from_received(KP.public_key, short.states[sm], long.states[ln], proof)
        assert got == fp
    with pytest.raises(InvalidArgument):
        forks.verify(fp, OTHER.public_key)  # a proof for another key
    with pytest.raises(SignatureError):
        forks.verify(replace(fp, b=replace(fp.b, signature=bytes(64))))  # a forged state


@settings(max_examples=60, deadline=None)
@given(blocks_st, st.data())
def test_no_prefix_pair_yields_a_fork_proof(blocks: list[bytes], data: st.DataObject) -> None:
    h = History(blocks)
    n = data.draw(st.integers(min_value=1, max_value=len(blocks)))
    m = data.draw(st.integers(min_value=1, max_value=n))
    assert forks.check(KP.public_key, h.states[n], h.node, h.states[m]) is None
    proof = consistency.prove(m, n, h.node) if m < n else None
    with pytest.raises(Corruption):
        forks.verify(forks.ForkProof(KP.public_key, h.states[m], h.states[n], proof))
    if m < n:  # a proof whose nodes were swapped for another history's does not match the signed tree
        fake = History([b"x" * 3] * n)
        bogus = replace(proof, old_roots=consistency.prove(m, n, fake.node).old_roots) if proof else None
        with pytest.raises(Corruption) as e:
            forks.verify(forks.ForkProof(KP.public_key, h.states[m], h.states[n], bogus))
        assert not isinstance(e.value, Inconsistent)


def test_proof_indices_are_the_minimal_cover() -> None:
    # RFC 9162's example shape: from 3 to 7 (flat tree: roots at 3 are 1 and 4; at 7: 3, 9, 12)
    assert flat_tree.full_roots(3) == [1, 4]
    assert consistency.proof_indices(3, 7) == [6, 9, 12]
    assert consistency.proof_indices(4, 8) == [11]
    assert consistency.proof_indices(4, 4) == []
    assert consistency.proof_indices(0, 5) == flat_tree.full_roots(5)
    with pytest.raises(InvalidArgument):
        consistency.proof_indices(5, 4)


def test_a_huge_length_costs_only_its_bits() -> None:
    n = (1 << 40) + 12345
    assert len(consistency.proof_indices(n - 999, n)) <= 2 * 41
    assert consistency.nodes_needed(n - 999, n) <= consistency.MAX_PROOF_NODES


def test_equal_length_fork_and_bad_fork_proofs(tmp_path: Path) -> None:
    a, b = History([b"a", b"b", b"c"]), History([b"a", b"b", b"C"])
    fp = forks.of_states(KP.public_key, a.states[3], b.states[3])
    assert fp.consistency is None and fp.fork_point == 3
    assert forks.keep(tmp_path, fp) and not forks.keep(tmp_path, fp)
    assert forks.load(tmp_path) == fp
    # replayed: the same state twice
    with pytest.raises(Corruption, match="not a fork"):
        forks.verify(forks.ForkProof(KP.public_key, a.states[3], a.states[3], None))
    # a different fork number is a truncation, no evidence
    with pytest.raises(Corruption, match="truncation"):
        truncated = replace(b.states[3], fork=1, signature=b"")
        truncated = replace(truncated, signature=Signer(KP.seed or b"").sign(truncated.signable()))
        forks.verify(forks.ForkProof(KP.public_key, a.states[3], truncated, None))
    # truncated or malformed files
    raw = forks.dumps(fp)
    for bad in (
        raw[: len(raw) // 2],
        b"[]",
        b'{"feedlog_fork_proof": 1}',
        raw.replace(b'"length": 3', b'"length": -3'),
    ):
        with pytest.raises(InvalidArgument):
            forks.loads(bad)
    # a hand-edited kept proof proves nothing
    (tmp_path / forks.FORK_FILE).write_bytes(raw.replace(fp.b.tree_hash.hex().encode(), fp.a.tree_hash.hex().encode()))
    with pytest.raises(Corruption):
        forks.load(tmp_path)


def test_consistency_proof_from_zero_and_equal() -> None:
    h = History([b"x"] * 9)
    empty = ConsistencyProof(0, 9, (), tuple(h.nodes[i] for i in flat_tree.full_roots(9)))
    assert consistency.derive_roots(empty) == [h.nodes[i] for i in flat_tree.full_roots(9)]
    same = consistency.prove(9, 9, h.node)
    consistency.verify(same, h.states[9], h.states[9], V)
