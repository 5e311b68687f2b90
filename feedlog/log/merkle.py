"""Merkle tree state and proofs, as pure functions over nodes (no I/O).

A feed of `length` blocks has one root per full subtree (`flat_tree.full_roots`);
its tree hash covers those roots, and one Ed25519 signature over
`crypto.tree_signable(tree_hash, length, fork)` commits to every block. A
proof of one block is its sibling path to its root plus the other roots:
O(log n) hashes, checkable with nothing but the feed key.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import Corruption, InvalidArgument, SignatureError
from . import flat_tree
from .crypto import PARENT_TYPE, Verifier, leaf_hash, parent_hash, tree_hash, tree_signable


class Node(NamedTuple):
    # a tuple, not a frozen dataclass: two are built per appended block, and tuples build ~5x faster
    index: int  # type: ignore[assignment]  # flat-tree index (shadows tuple.index, unused here)
    hash: bytes
    size: int  # bytes of block data under this node


@dataclass(frozen=True, slots=True)
class TreeState:
    """What a signature commits to."""

    length: int
    fork: int
    tree_hash: bytes
    signature: bytes

    def signable(self) -> bytes:
        return tree_signable(self.tree_hash, self.length, self.fork)


def roots_hash(roots: Sequence[Node]) -> bytes:
    return tree_hash((r.index, r.hash, r.size) for r in roots)


def leaves(start: int, blocks: Sequence[bytes]) -> list[Node]:
    return [Node(2 * (start + n), leaf_hash(b), len(b)) for n, b in enumerate(blocks)]


def append_nodes(roots: Sequence[Node], new_leaves: Sequence[Node]) -> tuple[list[Node], list[Node]]:
    """Add leaf nodes (consecutive, after `roots`) to a tree; return (created nodes, new roots).

    Created nodes come in creation order, leaves included. Roots of a flat tree
    have strictly decreasing depth, so a new node merges with the root to its
    left exactly while the two have equal depth.
    """
    stack = list(roots)
    depths = [flat_tree.depth(r.index) for r in stack]
    created: list[Node] = []
    for node in new_leaves:
        created.append(node)
        d = 0
        while depths and depths[-1] == d:
            left = stack.pop()
            depths.pop()
            size = left.size + node.size
            # the parent of two siblings sits between them in flat-tree order
            node = Node((left.index + node.index) // 2, parent_hash(left.hash, node.hash, size), size)
            created.append(node)
            d += 1
        stack.append(node)
        depths.append(d)
    return created, stack


def append_leaves(roots: Sequence[Node], start: int, blocks: Sequence[bytes]) -> tuple[list[Node], list[Node]]:
    """`append_nodes` for raw blocks with seqs start, start+1, ..."""
    return append_nodes(roots, leaves(start, blocks))


NODE = struct.Struct("<32sQ")  # a tree node on disk (storage.NODE)
_PARENT = struct.Struct("<BQ32s32s")


@dataclass(frozen=True, slots=True)
class Fold:
    """A batch folded into the tree, its nodes laid out as the tree file holds them.

    `buf` holds the nodes with indices lo .. lo + len(have) - 1 (the batch's leaf
    range), 40 bytes each; `have[i]` is 1 where the batch computed node lo + i
    (the parents reaching past the batch's last block are not known yet).
    `outside` are the parents joining the batch to older roots (indices < lo).
    """

    lo: int
    buf: bytearray
    have: bytearray
    outside: list[Node]
    roots: list[Node]


def fold(roots: Sequence[Node], start: int, blocks: Sequence[bytes]) -> Fold:
    """`append_leaves` without a Node per created node: the same nodes, packed for the tree file.

    The append path's hot loop (issue 17): one leaf hash per block and one
    parent hash per merge, written straight into one buffer.
    """
    n = len(blocks)
    lo = 2 * start
    width = 2 * n - 1 if n else 0
    size = NODE.size
    buf = bytearray(width * size)
    have = bytearray(width)
    pack = NODE.pack_into
    parent = _PARENT.pack
    b2 = hashlib.blake2b
    idxs = [r.index for r in roots]
    hashes = [r.hash for r in roots]
    sizes = [r.size for r in roots]
    depths = [flat_tree.depth(i) for i in idxs]
    outside: list[Node] = []
    for k, block in enumerate(blocks):
        i = lo + 2 * k
        h = leaf_hash(block)
        sz = len(block)
        pack(buf, 2 * k * size, h, sz)
        have[2 * k] = 1
        d = 0
        while depths and depths[-1] == d:
            depths.pop()
            sz += sizes.pop()
            i = (idxs.pop() + i) >> 1
            h = b2(parent(PARENT_TYPE, sz, hashes.pop(), h), digest_size=32).digest()
            if i >= lo:
                pack(buf, (i - lo) * size, h, sz)
                have[i - lo] = 1
            else:
                outside.append(Node(i, h, sz))
            d += 1
        idxs.append(i)
        hashes.append(h)
        sizes.append(sz)
        depths.append(d)
    return Fold(lo, buf, have, outside, [Node(*t) for t in zip(idxs, hashes, sizes, strict=True)])


def signed_append(
    roots: Sequence[Node], start: int, blocks: Sequence[bytes], signature: bytes, fork: int, verifier: Verifier
) -> tuple[list[Node], list[Node], TreeState]:
    """(created nodes, new roots, state) of a batch whose author sent only `signature`.

    The tree is recomputed here, so the signature is checked over what *we*
    hash; `SignatureError` unless the feed key signed exactly this tree.
    """
    created, new_roots = append_leaves(roots, start, blocks)
    state = TreeState(start + len(blocks), fork, roots_hash(new_roots), signature)
    if not verifier.verify(signature, state.signable()):
        raise SignatureError(
            f"signature over length {state.length} does not verify with the feed key (only the key holder can append)"
        )
    return created, new_roots, state


def nodes_for_roots(length: int, get: Callable[[int], Node]) -> list[Node]:
    return [get(i) for i in flat_tree.full_roots(length)]


@dataclass(frozen=True, slots=True)
class Proof:
    """Everything needed to check block `seq` against a signed tree state."""

    seq: int
    block: bytes
    path: tuple[Node, ...]  # siblings from the leaf up to (not including) its root
    roots: tuple[Node, ...]  # every root of the tree at `state.length`
    state: TreeState


def build_proof(seq: int, block: bytes, state: TreeState, get: Callable[[int], Node]) -> Proof:
    if not 0 <= seq < state.length:
        raise InvalidArgument(f"seq {seq} is outside the feed (length {state.length})")
    roots = nodes_for_roots(state.length, get)
    root_ids = {r.index for r in roots}
    path: list[Node] = []
    i = 2 * seq
    while i not in root_ids:
        path.append(get(flat_tree.sibling(i)))
        i = flat_tree.parent(i)
    return Proof(seq, block, tuple(path), tuple(roots), state)


def verify_proof(proof: Proof, public_key: bytes, verifier: Verifier | None = None) -> None:
    """Raise `Corruption`/`SignatureError` unless `proof.block` is block `seq` of the signed feed."""
    state = proof.state
    if not 0 <= proof.seq < state.length:
        raise Corruption(f"proof for seq {proof.seq} does not fit length {state.length}")
    expected = flat_tree.full_roots(state.length)
    if [r.index for r in proof.roots] != expected:
        raise Corruption("proof roots do not match the signed length")
    node = Node(2 * proof.seq, leaf_hash(proof.block), len(proof.block))
    for sib in proof.path:
        if sib.index != flat_tree.sibling(node.index):
            raise Corruption(f"proof node {sib.index} is not the sibling of {node.index}")
        left, right = (node, sib) if node.index < sib.index else (sib, node)
        size = left.size + right.size
        node = Node(flat_tree.parent(node.index), parent_hash(left.hash, right.hash, size), size)
    root = next((r for r in proof.roots if r.index == node.index), None)
    if root is None or root.hash != node.hash or root.size != node.size:
        raise Corruption(f"block {proof.seq} does not hash to the signed tree")
    if roots_hash(proof.roots) != state.tree_hash:
        raise Corruption("roots do not hash to the signed tree hash")
    v = verifier or Verifier(public_key)
    if not v.verify(state.signature, state.signable()):
        raise SignatureError(f"signature over length {state.length} does not verify with the feed key")
