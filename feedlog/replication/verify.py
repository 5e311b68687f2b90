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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import Corruption, SignatureError
from ..log import flat_tree, merkle
from ..log.core import BLOCK_COST, MAX_BLOCK_BYTES, Segment
from ..log.crypto import Verifier
from ..log.merkle import Node, TreeState, fold_roots, leaf_hashes
from ..pb import feeds_pb2 as pb
from . import wire

#: the message budget a reader asks of a peer unless told otherwise (the peer's default too)
DEFAULT_BUDGET = 1 << 20
#: protobuf framing, roots, cleared nodes and signed states on top of a message's block bytes
MESSAGE_OVERHEAD = 256 << 10
#: a signed batch may span several messages, but a reader holds at most this many messages'
#: worth of blocks whose signature has not arrived (issue 13 item 1: a peer that never signs)
UNSIGNED_MESSAGES = 4


def signed_state(key: bytes, m: pb.SignedState, source: str) -> TreeState:
    """A peer's signed state of feed `key`, once its signature verifies with the key (a length, tree
    hash or fork a peer merely claims is worth nothing): SignatureError naming `source` otherwise."""
    state = wire.state_of(m)
    if not Verifier(key).verify(state.signature, state.signable()):
        raise SignatureError(f"{source}: its signed state for length {state.length} does not verify with the feed key")
    return state


def max_message_bytes(budget: int) -> int:
    """The largest message a reader that asked for `budget` accepts.

    The budget plus one block: a block larger than the budget comes alone in
    its message, and blocks are at most `MAX_BLOCK_BYTES`.
    """
    return budget + MAX_BLOCK_BYTES + MESSAGE_OVERHEAD


def max_unsigned_bytes(budget: int) -> int:
    """How much a reader that asked for `budget` holds before a signature (bytes + `BLOCK_COST` per block)."""
    return UNSIGNED_MESSAGES * max_message_bytes(budget)


class Unsigned:
    """The blocks a reader holds whose signature has not arrived yet, bounded by `limit`.

    A peer that streams blocks and never a signed state is cut off with an
    error naming it, before the reader holds more than `limit`; blocks are
    counted before their bytes, so a flood of tiny blocks is refused before
    anything is built from them.
    """

    def __init__(self, limit: int, source: str) -> None:
        self.limit = limit
        self.source = source
        self.cost = 0
        self.blocks = 0
        self.last = 0  # the bytes `charge` last counted

    def charge(self, start: int, count: int, size: Callable[[], int]) -> None:
        """Account for `count` more blocks (or cleared leaves) from `start`; `size()` their bytes."""
        cost = self.cost + count * BLOCK_COST
        if cost <= self.limit:
            self.last = size()
            cost += self.last
        if cost > self.limit:
            raise Corruption(
                f"{self.source}: sent {self.blocks + count} blocks from {start - self.blocks} "
                f"(over {self.limit} bytes) without a signed state; a reader holds at most "
                f"{self.limit} bytes before a signature (ask for a larger message budget if "
                "the feed really has batches that large)"
            )
        self.cost = cost
        self.blocks += count

    def charge_pb(self, m: pb.Segment) -> None:
        """`charge` for a received segment: its count first, then its wire size (nothing materialised)."""
        self.charge(m.start, len(m.blocks) + len(m.cleared), m.ByteSize)

    def signed(self) -> None:
        self.cost = self.blocks = 0


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
    """Verifies a reader's segments as they arrive; `receive` (wire segments) holds at most `max_unsigned`."""

    def __init__(
        self,
        public_key: bytes,
        start: int,
        roots: Sequence[Node],
        *,
        source: str = "peer",
        max_unsigned: int = max_unsigned_bytes(DEFAULT_BUDGET),
    ) -> None:
        if [r.index for r in roots] != flat_tree.full_roots(start):
            raise Corruption(f"{source}: the roots sent for position {start} do not fit a tree of that length")
        self.verifier = Verifier(public_key)
        self.source = source
        self.length = start  # verified up to here
        self.roots = list(roots)
        self.state: TreeState | None = None
        self.unsigned = Unsigned(max_unsigned, source)
        self._blocks: list[bytes | None] = []
        self._cleared: list[Node] = []

    @property
    def pending(self) -> int:
        """Blocks received whose signature has not arrived yet."""
        return len(self._blocks)

    def receive(self, m: pb.Segment) -> Verified | None:
        """`add` for a segment off the wire, refused (before decoding) if it would hold too much unsigned."""
        if m.start != self.length + len(self._blocks):
            raise Corruption(f"{self.source}: sent blocks from {m.start}, expected {self.length + len(self._blocks)}")
        self.unsigned.charge_pb(m)
        try:
            seg = wire.segment_of(m)
        except Corruption as e:
            raise Corruption(f"{self.source}: {e}") from None
        return self.add(seg)

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
        self.unsigned.signed()
        # the whole batch at once: leaf hashes in one pass, the tree folded a level at a time (issue 17)
        present = [b for b in blocks if b is not None]
        if len(present) == len(blocks):
            sizes = [len(b) for b in present]
            hashes = leaf_hashes(present, sizes)
        else:
            hashes, sizes = [], []
            hashed = iter(leaf_hashes(present, [len(b) for b in present]))
            for k, b in enumerate(blocks):
                if b is not None:
                    hashes.append(next(hashed))
                    sizes.append(len(b))
                    continue
                node = cleared.get(2 * (start + k))
                if node is None:
                    raise Corruption(f"{self.source}: block {start + k} has neither bytes nor a leaf node")
                hashes.append(node.hash)
                sizes.append(node.size)
        end = start + len(blocks)
        state = seg.state
        if state.length != end:
            raise Corruption(f"{self.source}: blocks {start}..{end - 1} came with a state for length {state.length}")
        roots = fold_roots(self.roots, start, hashes, sizes)
        if merkle.roots_hash(roots) != state.tree_hash:
            raise Corruption(f"{self.source}: blocks {start}..{end - 1} do not hash to the signed tree")
        if not self.verifier.verify(state.signature, state.signable()):
            raise SignatureError(f"{self.source}: the signature for length {end} does not verify with the feed key")
        self.roots, self.length, self.state = roots, end, state
        return Verified(start, blocks, state, tuple(cleared.values()))
