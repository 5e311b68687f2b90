"""Our hashes and signatures against vectors produced by hypercore 11 itself."""

from typing import Any

from feedlog.log import merkle
from feedlog.log.core import Core
from feedlog.log.crypto import KeyPair, discovery_key, leaf_hash, tree_signable


def test_keys_and_discovery_key(hypercore_vectors: Any) -> None:
    kp = KeyPair.from_seed(bytes.fromhex(hypercore_vectors["seed"]))
    assert kp.public_key.hex() == hypercore_vectors["public_key"] == hypercore_vectors["feed_key"]
    assert discovery_key(kp.public_key).hex() == hypercore_vectors["discovery_key"]


def test_leaf_hashes(hypercore_vectors: Any) -> None:
    for block, expected in zip(hypercore_vectors["blocks"], hypercore_vectors["leaf_hashes"], strict=True):
        assert leaf_hash(bytes.fromhex(block)).hex() == expected


def test_tree_hash_signable_and_signature_match_hypercore(tmp_path: Any, hypercore_vectors: Any) -> None:
    v = hypercore_vectors
    kp = KeyPair.from_seed(bytes.fromhex(v["seed"]))
    blocks = [bytes.fromhex(b) for b in v["blocks"]]
    # the same batches the generator appended: Ed25519 is deterministic, so signatures must match exactly
    batches = [[0], [1, 2], [3], [4, 5, 6, 7, 8], [9], [10, 11, 12]]
    with Core.create(tmp_path / "f", kp) as core:
        for batch, state in zip(batches, v["states"], strict=True):
            s = core.append([blocks[i] for i in batch])
            assert s.length == state["length"]
            assert core.byte_length == state["byte_length"]
            assert s.tree_hash.hex() == state["tree_hash"]
            assert tree_signable(s.tree_hash, s.length, s.fork).hex() == state["signable"]
            assert s.signature.hex() == state["signature"]


def test_pure_append_matches_incremental(hypercore_vectors: Any) -> None:
    blocks = [bytes.fromhex(b) for b in hypercore_vectors["blocks"]]
    _, roots = merkle.append_leaves([], 0, blocks)
    assert merkle.roots_hash(roots).hex() == hypercore_vectors["states"][-1]["tree_hash"]
