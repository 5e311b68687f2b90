"""Consistency proofs between two signed states of one feed, as pure functions over tree nodes.

RFC 9162 section 2.1.4 (RFC 6962 section 2.1.2) for hypercore's flat tree: the
tree a key signed at length m is a prefix of the one it signed at n > m exactly
when the roots at m (`flat_tree.full_roots(m)`) are nodes of the tree at n. The
proof is those roots plus the fewest nodes of the tree at n that, with them,
derive every root at n: below a root at n that spans position m, the nodes
whose span starts at or after m (the right siblings on the way up from the
roots at m); the roots at n past m whole. O(log n) nodes; the indices are a
function of (m, n) alone (`proof_indices`), so a verifier takes no shape from
the prover. Checked with nothing but the feed key: each state's signature, the
roots at m against the signed tree hash at m, the derived roots at n against
the signed tree hash at n.

Unlike RFC 9162, whose tree head is one root, hypercore signs a hash over all
roots with their byte sizes (`crypto.tree_hash`), so the roots at m travel
whole and every node carries its size (a parent's is its children's sum).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Corruption, InvalidArgument, SignatureError
from . import flat_tree
from .crypto import Verifier, parent_hash
from .merkle import Node, TreeState, roots_hash

#: the most nodes a proof between lengths below 2**64 holds: a root at m per bit, and at n a node per level
#: below the root spanning m plus the roots after it
MAX_PROOF_NODES = 3 * 64


@dataclass(frozen=True, slots=True)
class ConsistencyProof:
    """What the tree at `new_length` holds that derives its roots from the roots at `old_length`."""

    old_length: int
    new_length: int
    old_roots: tuple[Node, ...]  # the roots at old_length, left to right
    nodes: tuple[Node, ...]  # the nodes of `proof_indices(old_length, new_length)`, in that order

    def __len__(self) -> int:
        return len(self.old_roots) + len(self.nodes)


def proof_indices(old_length: int, new_length: int) -> list[int]:
    """Flat-tree indices of the nodes (besides the roots at `old_length`) that derive the roots at
    `new_length`, left to right: a root at n that lies past m whole is sent as it is; one that spans m
    is split until each part is a root at m or lies past m (its first leaf at or after m)."""
    _check_lengths(old_length, new_length)
    old = set(flat_tree.full_roots(old_length))
    out: list[int] = []
    for r in flat_tree.full_roots(new_length):
        _cover(r, old, 2 * old_length, out)
    return out


def _cover(i: int, old: set[int], boundary: int, out: list[int]) -> None:
    # a node whose span ends before the boundary is inside a root at m: every such node here is one
    if i in old:
        return
    first, _last = flat_tree.span(i)
    if first >= boundary:
        out.append(i)
        return
    kids = flat_tree.children(i)
    if kids is None:  # pragma: no cover - a leaf before the boundary is under a root at m
        raise AssertionError(f"leaf {i} before {boundary} is not under a root")
    _cover(kids[0], old, boundary, out)
    _cover(kids[1], old, boundary, out)


def _check_lengths(old_length: int, new_length: int) -> None:
    if not 0 <= old_length <= new_length < 1 << 63:
        raise InvalidArgument(
            f"a consistency proof goes from a length to one at least as long, not {old_length} to {new_length}"
        )


def prove(old_length: int, new_length: int, node: Callable[[int], Node]) -> ConsistencyProof:
    """The proof that the tree at `old_length` is a prefix of the tree at `new_length`, from the nodes of
    the latter (`node(index)`, e.g. `Core.node`: every node a proof names exists once the tree reaches n)."""
    old_roots = tuple(node(i) for i in flat_tree.full_roots(old_length))
    return ConsistencyProof(
        old_length, new_length, old_roots, tuple(node(i) for i in proof_indices(old_length, new_length))
    )


def derive_roots(proof: ConsistencyProof) -> list[Node]:
    """The roots at `new_length` that `proof` derives: Corruption if its shape is not the one its
    lengths call for (wrong indices, a size that does not add up)."""
    _check_proof_shape(proof)
    known = {n.index: n for n in proof.old_roots}
    known.update((n.index, n) for n in proof.nodes)
    return [_node(r, known) for r in flat_tree.full_roots(proof.new_length)]


def _check_proof_shape(proof: ConsistencyProof) -> None:
    m, n = proof.old_length, proof.new_length
    try:
        _check_lengths(m, n)
    except InvalidArgument as e:
        raise Corruption(str(e)) from None
    if len(proof) > MAX_PROOF_NODES:
        raise Corruption(f"a consistency proof of {len(proof)} nodes is longer than any tree needs")
    if [r.index for r in proof.old_roots] != flat_tree.full_roots(m):
        raise Corruption(f"the proof's roots do not fit a tree of length {m}")
    if [x.index for x in proof.nodes] != proof_indices(m, n):
        raise Corruption(f"the proof's nodes are not those that lead from length {m} to {n}")


def _node(i: int, known: dict[int, Node]) -> Node:
    # recursion depth is the tree's height (< 64); every call either finds a node or splits into two
    # whose subtrees hold known nodes, because the indices were checked against `proof_indices`
    got = known.get(i)
    if got is not None:
        return got
    kids = flat_tree.children(i)
    if kids is None:  # pragma: no cover - excluded by the shape check
        raise Corruption(f"the proof lacks leaf {i}")
    left, right = _node(kids[0], known), _node(kids[1], known)
    size = left.size + right.size
    return Node(i, parent_hash(left.hash, right.hash, size), size)


def check_signed(state: TreeState, verifier: Verifier, what: str) -> None:
    if not verifier.verify(state.signature, state.signable()):
        raise SignatureError(f"{what}: the signed state for length {state.length} does not verify with the feed key")


def verify(proof: ConsistencyProof, old: TreeState, new: TreeState, verifier: Verifier) -> None:
    """Raise unless the key signed `old` and `new` and the tree at `old` is a prefix of the tree at `new`.

    SignatureError: a state the key did not sign. Corruption: a proof that does
    not fit the states (their lengths, its shape, its roots against `new`'s hash).
    `Inconsistent` (a Corruption): a well-formed proof that derives `new`'s signed tree
    but whose roots at `old.length` are not `old`'s signed tree: the key signed two
    histories (`forks.ForkProof` keeps exactly that as evidence).
    """
    check_signed(old, verifier, "old state")
    check_signed(new, verifier, "new state")
    if (proof.old_length, proof.new_length) != (old.length, new.length):
        raise Corruption(
            f"the proof goes from {proof.old_length} to {proof.new_length}, "
            f"the states are at {old.length} and {new.length}"
        )
    if roots_hash(derive_roots(proof)) != new.tree_hash:
        raise Corruption(f"the proof's nodes do not hash to the signed tree at length {new.length}")
    if old.fork != new.fork:
        # a new fork number is hypercore's signed truncation, not an equivocation; feedlog never truncates
        # and refuses to continue across one (Core.append_signed), but it is no evidence of two histories
        raise Corruption(f"the states are of fork {old.fork} and fork {new.fork} (a truncation), not comparable")
    if roots_hash(proof.old_roots) != old.tree_hash:
        raise Inconsistent(
            f"the signed tree at length {new.length} ({new.tree_hash.hex()}) holds roots at length {old.length} "
            f"that hash to {roots_hash(proof.old_roots).hex()}, but the key signed {old.tree_hash.hex()} there"
        )


class Inconsistent(Corruption):
    """A proof, well formed and matching the longer signed tree, showing the shorter one is not its prefix."""


def roots_hash_at(length: int, node: Callable[[int], Node]) -> bytes:
    """The tree hash a tree (`node(index)`) had at `length`: what a copy compares a shorter signed state with."""
    return roots_hash([node(i) for i in flat_tree.full_roots(length)])


def nodes_needed(old_length: int, new_length: int) -> int:
    """How many nodes a proof between the lengths carries (what a reader budgets for)."""
    return len(flat_tree.full_roots(old_length)) + len(proof_indices(old_length, new_length))
