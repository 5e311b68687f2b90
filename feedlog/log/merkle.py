"""Merkle tree state and proofs, as pure functions over nodes (no I/O).

A feed of `length` blocks has one root per full subtree (`flat_tree.full_roots`);
its tree hash covers those roots, and one Ed25519 signature over
`crypto.tree_signable(tree_hash, length, fork)` commits to every block. A
proof of one block is its sibling path to its root plus the other roots:
O(log n) hashes, checkable with nothing but the feed key.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import Corruption, InvalidArgument, SignatureError
from . import flat_tree
from .crypto import _LEAF_PREFIXES, PARENT_TYPE, Verifier, leaf_hash, parent_hash, tree_hash, tree_signable


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
    return tree_hash(roots)  # a Node is an (index, hash, size) triple


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
_HASHER = hashlib.blake2b(digest_size=32)


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
    sizes: list[int]  # of the batch's blocks


def fold(roots: Sequence[Node], start: int, blocks: Sequence[bytes], sizes: list[int] | None = None) -> Fold:
    """`append_leaves` without a Node per created node: the same nodes, packed for the tree file.

    The append path's hot loop (issue 17), a level at a time: the batch's leaf
    hashes, then each level's parents from pairs of the level below (an old root
    joining in on the left where the level starts at an odd offset), each level
    one comprehension; an unpaired last node of a level is a new root.
    """
    n = len(blocks)
    lo = 2 * start
    width = 2 * n - 1 if n else 0
    size = NODE.size
    buf = bytearray(width * size)
    have = bytearray(width)
    pack = NODE.pack_into
    parent = _PARENT.pack
    copy = _HASHER.copy
    old = {flat_tree.depth(r.index): r for r in roots}
    kept = dict(old)  # old roots no new node joins
    outside: list[Node] = []
    new_roots: list[Node] = []
    leaf_sizes = sizes = list(map(len, blocks)) if sizes is None else sizes
    if sizes and max(sizes) < len(_LEAF_PREFIXES):  # small blocks: H(prefix || block) in one update
        prefixes = _LEAF_PREFIXES
        hashes = [_digest(copy(), prefixes[sz] + b) for sz, b in zip(sizes, blocks, strict=True)]
    else:
        hashes = [leaf_hash(b) for b in blocks]
    d, a = 0, start  # level and offset (among nodes of that depth) of hashes[0]
    if n:  # the leaves, every other node of the range, in one pack
        fields: list[Any] = [None] * (2 * n)
        fields[0::2] = hashes
        fields[1::2] = sizes
        _leaf_run(n).pack_into(buf, 0, *fields)
    have[0::2] = b"\x01" * n
    while hashes:
        if a & 1:  # the left sibling of the level's first node is an old root
            r = kept.pop(d)
            hashes = [r.hash, *hashes]
            sizes = [r.size, *sizes]  # a new list: `leaf_sizes` stays the blocks' sizes
            a -= 1
        m = len(hashes)
        if m & 1:
            new_roots.append(Node(flat_tree.index(d, a + m - 1), hashes[-1], sizes[-1]))
        if m < 2:
            break
        # zip stops before an unpaired last node
        sizes = [x + y for x, y in zip(sizes[0::2], sizes[1::2], strict=False)]
        hashes = [
            _digest(copy(), parent(PARENT_TYPE, sz, x, y))
            for sz, x, y in zip(sizes, hashes[0::2], hashes[1::2], strict=False)
        ]
        d += 1
        a >>= 1
        step, i = 1 << (d + 1), (a << (d + 1)) + (1 << d) - 1  # flat indices: i, i + step, ...
        k = 0
        if i < lo:  # only a level's first parent can join an old root (indices below the batch)
            outside.append(Node(i, hashes[0], sizes[0]))
            k, i = 1, i + step
        pos = i - lo
        count = len(hashes) - k
        if count:
            have[pos : pos + (count - 1) * step + 1 : step] = b"\x01" * count
        for h, sz in zip(hashes[k:], sizes[k:], strict=True):
            pack(buf, pos * size, h, sz)
            pos += step
    out_roots = sorted([*kept.values(), *new_roots], key=lambda r: r.index)
    return Fold(lo, buf, have, outside, out_roots, leaf_sizes)


@functools.lru_cache(maxsize=32)
def _leaf_run(n: int) -> struct.Struct:
    """n leaf nodes, each followed by a parent's slot left as it is (the last one by nothing)."""
    return struct.Struct("<" + "32sQ40x" * (n - 1) + "32sQ")


def _digest(h: Any, data: bytes) -> bytes:
    h.update(data)
    return h.digest()  # type: ignore[no-any-return]


def leaf_hashes(blocks: Sequence[bytes], sizes: Sequence[int]) -> list[bytes]:
    """`leaf_hash` of each block (`sizes` their lengths), in one comprehension: a reader's hot loop."""
    if sizes and max(sizes) < len(_LEAF_PREFIXES):  # small blocks: H(prefix || block) in one update
        copy, prefixes = _HASHER.copy, _LEAF_PREFIXES
        return [_digest(copy(), prefixes[sz] + b) for sz, b in zip(sizes, blocks, strict=True)]
    return [leaf_hash(b) for b in blocks]


def fold_roots(roots: Sequence[Node], start: int, hashes: list[bytes], sizes: list[int]) -> list[Node]:
    """The roots after appending leaves `hashes` (of blocks of `sizes`) at `start` to a tree with `roots`.

    What a reader that keeps no tree needs to check a signed batch: `fold` without
    laying out the nodes, a level at a time (one comprehension of parent hashes per
    level, an old root joining on the left where a level starts at an odd offset).
    `roots` must be the tree's roots at `start` (`flat_tree.full_roots(start)`).
    """
    kept = {flat_tree.depth(r.index): r for r in roots}
    new_roots: list[Node] = []
    parent, copy = _PARENT.pack, _HASHER.copy
    d, a = 0, start  # level and offset (among nodes of that depth) of hashes[0]
    while hashes:
        if a & 1:  # the left sibling of the level's first node is an old root
            r = kept.pop(d)
            hashes, sizes, a = [r.hash, *hashes], [r.size, *sizes], a - 1
        m = len(hashes)
        if m & 1:
            new_roots.append(Node(flat_tree.index(d, a + m - 1), hashes[-1], sizes[-1]))
        if m < 2:
            break
        # zip stops before an unpaired last node
        sizes = [x + y for x, y in zip(sizes[0::2], sizes[1::2], strict=False)]
        hashes = [
            _digest(copy(), parent(PARENT_TYPE, sz, x, y))
            for sz, x, y in zip(sizes, hashes[0::2], hashes[1::2], strict=False)
        ]
        d, a = d + 1, a >> 1
    return sorted([*kept.values(), *new_roots], key=lambda r: r.index)


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
