"""Checking blocks that arrive in segments, for readers that keep no copy (tail, Spark).

A reader starts from the roots of the tree at its start position (which the
peer sends and which need no trust: they are covered by the signed tree hash)
and, per signed batch, folds the new leaves into them, compares the result to
the batch's signed tree hash and checks the Ed25519 signature with the key the
reader already holds. Nothing is released before its batch verifies.

A follower that stores the feed does not need this: `Core.append_signed`
performs the same checks as it stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import Corruption, SignatureError
from ..log import flat_tree, merkle
from ..log.core import Segment
from ..log.crypto import Verifier, leaf_hash
from ..log.merkle import Node, TreeState


@dataclass(frozen=True, slots=True)
class Verified:
    """Blocks start.. of one signed batch, verified; None where the peer had cleared a block."""

    start: int
    blocks: list[bytes | None]
    state: TreeState
    #: the leaf nodes of the cleared blocks (their hash and size still count in the tree)
    cleared: tuple[Node, ...] = ()

    def trimmed(self, end: int) -> Verified:
        """The blocks before `end` (the state still the batch's: what they were verified against)."""
        if self.start + len(self.blocks) <= end:
            return self
        keep = max(end - self.start, 0)
        return Verified(self.start, self.blocks[:keep], self.state, tuple(n for n in self.cleared if n.index < 2 * end))


class SegmentVerifier:
    def __init__(self, public_key: bytes, start: int, roots: Sequence[Node], *, source: str = "peer") -> None:
        if [r.index for r in roots] != flat_tree.full_roots(start):
            raise Corruption(f"{source}: the roots sent for position {start} do not fit a tree of that length")
        self.verifier = Verifier(public_key)
        self.source = source
        self.length = start  # verified up to here
        self.roots = list(roots)
        self.state: TreeState | None = None
        self._blocks: list[bytes | None] = []
        self._cleared: list[Node] = []

    def add(self, seg: Segment) -> Verified | None:
        """Take the next segment; return its batch once the segment carrying the signature arrives."""
        expected = self.length + len(self._blocks)
        if seg.start != expected:
            raise Corruption(f"{self.source}: sent blocks from {seg.start}, expected {expected}")
        self._blocks.extend(seg.blocks)
        self._cleared.extend(seg.cleared)
        if seg.state is None:
            return None
        start, blocks, cleared = self.length, self._blocks, {n.index: n for n in self._cleared}
        self._blocks, self._cleared = [], []
        leaves: list[Node] = []
        for k, b in enumerate(blocks):
            i = 2 * (start + k)
            if b is None:
                if i not in cleared:
                    raise Corruption(f"{self.source}: block {start + k} has neither bytes nor a leaf node")
                leaves.append(cleared[i])
            else:
                leaves.append(Node(i, leaf_hash(b), len(b)))
        end = start + len(blocks)
        state = seg.state
        if state.length != end:
            raise Corruption(f"{self.source}: blocks {start}..{end - 1} came with a state for length {state.length}")
        _created, roots = merkle.append_nodes(self.roots, leaves)
        if merkle.roots_hash(roots) != state.tree_hash:
            raise Corruption(f"{self.source}: blocks {start}..{end - 1} do not hash to the signed tree")
        if not self.verifier.verify(state.signature, state.signable()):
            raise SignatureError(f"{self.source}: the signature for length {end} does not verify with the feed key")
        self.roots, self.length, self.state = roots, end, state
        return Verified(start, blocks, state, tuple(cleared.values()))
