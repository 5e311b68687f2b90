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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat, starmap
from operator import add
from types import ModuleType
from typing import NamedTuple

from ..errors import Corruption, InvalidArgument, SignatureError
from . import flat_tree
from .crypto import _LEAF_PREFIXES, LEAF_TYPE, PARENT_TYPE, Verifier, leaf_hash, parent_hash, tree_hash, tree_signable

#: batch hashing in C where setup.py could build it; None: hashlib, the reference (`_leaf_hashes`, `_parent_hashes`)
_native: ModuleType | None
try:
    from . import _blake2batch as _native
except ImportError:  # a machine without a C compiler
    _native = None


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
_LEAF_PREFIX = struct.Struct("<BQ")
_HASHER = hashlib.blake2b(digest_size=32)
_COPY, _UPDATE, _DIGEST = hashlib.blake2b.copy, hashlib.blake2b.update, hashlib.blake2b.digest
_ZERO_HASH = bytes(32)
#: nodes packed per struct call when a batch's range is laid out (`_pack_nodes`)
_RUN = 128
_NODE_RUN = struct.Struct("<" + "32sQ" * _RUN)


def _hash_each(n: int, *parts: Iterable[bytes]) -> list[bytes]:
    """BLAKE2b-256 of `n` inputs, input i being the concatenation of the i-th item of each of `parts`.

    The append path's hot loop (issue 17): two hashes per block. Every step is a
    `map` of a C method (copy a prepared hasher, update, digest), so no Python
    bytecode runs per hash; a comprehension calling a helper per hash cost about
    as much again as the hashing. `update` returns None, so `any` drains its map.
    """
    hashers = list(map(_COPY, repeat(_HASHER, n)))
    for part in parts:
        any(map(_UPDATE, hashers, part))
    return list(map(_DIGEST, hashers))


def _parents(hashes: list[bytes], sizes: list[int]) -> tuple[list[bytes], list[int]]:
    """The parents of consecutive sibling pairs (hashes[0], hashes[1]), ...; an unpaired last node has none."""
    if len(hashes) < 4:  # one parent (a top level): hashed directly, cheaper than setting up the maps
        if len(hashes) < 2:
            return [], []
        size = sizes[0] + sizes[1]
        return [parent_hash(hashes[0], hashes[1], size)], [size]
    sizes = list(map(add, sizes[0::2], sizes[1::2]))  # map stops before an unpaired last node
    if _native is not None:
        return _native.parent_hashes(hashes, sizes), sizes
    return _parent_hashes(hashes, sizes), sizes


def _parent_hashes(hashes: list[bytes], sizes: list[int]) -> list[bytes]:
    """`parent_hash(hashes[2i], hashes[2i + 1], sizes[i])` for each i: the reference of `_native.parent_hashes`."""
    packed = map(_PARENT.pack, repeat(PARENT_TYPE), sizes, hashes[0::2], hashes[1::2])
    return _hash_each(len(sizes), packed)


@dataclass(frozen=True, slots=True)
class Fold:
    """A batch folded into the tree, its nodes laid out as the tree file holds them.

    `buf` holds the nodes with indices lo .. lo + width - 1 (the batch's leaf
    range), 40 bytes each, zero where the batch computed no node (`have`).
    `outside` are the parents joining the batch to older roots (indices < lo).
    """

    lo: int
    buf: bytes
    outside: list[Node]
    roots: list[Node]
    sizes: list[int]  # of the batch's blocks

    @property
    def have(self) -> bytearray:
        """1 for each node of the range the batch computed, 0 for the parents reaching past its last block.

        A node of the range is computed exactly when its span ends at or before
        the batch's last leaf (older roots are complete, so nothing else is
        missing). Derived, not kept: only a replay writing the range in runs
        needs it, an append writes the range whole.
        """
        width = len(self.buf) // NODE.size
        out = bytearray(width)
        lo, last = self.lo, self.lo + width - 1  # the batch's first and last leaf nodes
        d = 0
        while 1 << d <= width:
            step, half = 1 << (d + 1), (1 << d) - 1  # depth d: indices half mod step, spans j - half .. j + half
            count = len(range(lo + (half - lo) % step, last - half + 1, step))
            if count:
                first = (half - lo) % step
                out[first : first + (count - 1) * step + 1 : step] = b"\x01" * count
            d += 1
        return out


def fold(roots: Sequence[Node], start: int, blocks: Sequence[bytes], sizes: list[int] | None = None) -> Fold:
    """`append_leaves` without a Node per created node: the same nodes, packed for the tree file.

    The append path's hot loop (issue 17), a level at a time: the batch's leaf
    hashes, then each level's parents from pairs of the level below (an old root
    joining in on the left where the level starts at an odd offset); an unpaired
    last node of a level is a new root. Each level's hashes and sizes go into the
    range's (hash, size) field list with two strided slice assignments, and the
    list is packed once (`_pack_nodes`).
    """
    if _native is not None:  # the same, with no Python object per node (the nodes go straight into buf)
        leaf_sizes = list(map(len, blocks)) if sizes is None else sizes
        buf, outside_nodes, root_nodes = _native.fold(roots, start, blocks, leaf_sizes)
        return Fold(2 * start, buf, list(map(Node._make, outside_nodes)), list(map(Node._make, root_nodes)), leaf_sizes)
    leaf_sizes = list(map(len, blocks)) if sizes is None else sizes
    return _fold_hashes(roots, start, leaf_hashes(blocks, leaf_sizes), leaf_sizes)


def fold_leaves(
    roots: Sequence[Node], start: int, blocks: Sequence[bytes | None], sizes: list[int], leaves: dict[int, bytes]
) -> Fold:
    """`fold` of a batch some of whose blocks are known by their leaf only (None in `blocks`; `leaves`:
    their hashes by position, `sizes` all the leaves' sizes): a replica storing blocks a peer sent
    cleared (issue 37). The leaf hash stands in for the block, as in `Core.verify`."""
    present = [(k, b) for k, b in enumerate(blocks) if b is not None]
    hashed = leaf_hashes([b for _k, b in present], [sizes[k] for k, _b in present])
    hashes = [leaves.get(k, b"") for k in range(len(blocks))]
    for (k, _b), h in zip(present, hashed, strict=True):
        hashes[k] = h
    return _fold_hashes(roots, start, hashes, sizes)


def _fold_hashes(roots: Sequence[Node], start: int, hashes: list[bytes], leaf_sizes: list[int]) -> Fold:
    """`fold` from the leaves' hashes and sizes."""
    n = len(hashes)
    lo = 2 * start
    width = 2 * n - 1 if n else 0
    kept = {flat_tree.depth(r.index): r for r in roots}  # old roots no new node joins
    outside: list[Node] = []
    new_roots: list[Node] = []
    sizes = leaf_sizes
    # (hash, size) of each node of the range, zero where the batch computes none
    fields: list[bytes | int] = [_ZERO_HASH, 0] * width
    fields[0::4], fields[1::4] = hashes, sizes  # the leaves, every other node of the range
    d, a = 0, start  # level and offset (among nodes of that depth) of hashes[0]
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
        hashes, sizes = _parents(hashes, sizes)
        d += 1
        a >>= 1
        step, i = 1 << (d + 1), (a << (d + 1)) + (1 << d) - 1  # flat indices: i, i + step, ...
        k = 0
        if i < lo:  # only a level's first parent can join an old root (indices below the batch)
            outside.append(Node(i, hashes[0], sizes[0]))
            k, i = 1, i + step
        count = len(hashes) - k
        if count:
            pos = i - lo
            stop = 2 * (pos + (count - 1) * step) + 1
            fields[2 * pos : stop : 2 * step], fields[2 * pos + 1 : stop + 1 : 2 * step] = hashes[k:], sizes[k:]
    out_roots = sorted([*kept.values(), *new_roots], key=lambda r: r.index)
    return Fold(lo, _pack_nodes(fields), outside, out_roots, leaf_sizes)


def _pack_nodes(fields: list[bytes | int]) -> bytes:
    """Nodes given as (hash, size, hash, size, ...) packed as the tree file holds them.

    `_RUN` nodes per call of one prebuilt struct, the rest with one built for their
    count (cached): a struct for each batch width would cost its build at every new width.
    """
    n = len(fields) // 2
    full = 2 * (n - n % _RUN)
    run = 2 * _RUN
    head = b"".join(starmap(_NODE_RUN.pack, [fields[i : i + run] for i in range(0, full, run)]))
    return head + _node_run(n % _RUN).pack(*fields[full:])


@functools.lru_cache(maxsize=_RUN)
def _node_run(n: int) -> struct.Struct:
    return struct.Struct("<" + "32sQ" * n)


def leaf_hashes(blocks: Sequence[bytes], sizes: Sequence[int]) -> list[bytes]:
    """`leaf_hash` of each block (`sizes` their lengths), with no bytecode per block: a reader's hot loop."""
    if _native is not None:
        return _native.leaf_hashes(blocks, sizes)  # type: ignore[no-any-return]
    return _leaf_hashes(blocks, sizes)


def _leaf_hashes(blocks: Sequence[bytes], sizes: Sequence[int]) -> list[bytes]:
    """`leaf_hashes` with hashlib: the reference of `_native.leaf_hashes`."""
    try:  # the prefixes of small blocks are prebuilt: a lookup costs less than a pack
        prefixes: Iterable[bytes] = list(map(_LEAF_PREFIXES.__getitem__, sizes))
    except IndexError:
        prefixes = map(_LEAF_PREFIX.pack, repeat(LEAF_TYPE), sizes)
    return _hash_each(len(sizes), prefixes, blocks)


def fold_roots(roots: Sequence[Node], start: int, hashes: list[bytes], sizes: list[int]) -> list[Node]:
    """The roots after appending leaves `hashes` (of blocks of `sizes`) at `start` to a tree with `roots`.

    What a reader that keeps no tree needs to check a signed batch: `fold` without
    laying out the nodes, a level at a time (the parent hashes of a level in one
    `_parents`, an old root joining on the left where a level starts at an odd offset).
    `roots` must be the tree's roots at `start` (`flat_tree.full_roots(start)`).
    """
    kept = {flat_tree.depth(r.index): r for r in roots}
    new_roots: list[Node] = []
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
        hashes, sizes = _parents(hashes, sizes)
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
