"""Translation between the library's types and the `feedlog.feeds` protobuf messages.

(Status codes, shared with the commit owner's service, are `feedlog.rpc`'s.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .. import errors
from ..log.consistency import ConsistencyProof
from ..log.core import Segment
from ..log.crypto import HASH_SIZE, SIGNATURE_SIZE
from ..log.feed import Write
from ..log.forks import ForkProof
from ..log.merkle import Node, Proof, TreeState
from ..log.retention import forgetting
from ..pb import feeds_pb2 as pb


def check_key(raw: bytes, what: str = "feed key") -> bytes:
    if len(raw) != 32:
        raise errors.InvalidArgument(f"a {what} is 32 bytes, got {len(raw)}")
    return bytes(raw)


def node_pb(n: Node) -> pb.Node:
    return pb.Node(index=n.index, hash=n.hash, size=n.size)


#: bounds on a received tree node: a byte size up to 64 PiB (so the sum of a tree's roots, which
#: parent and tree hashes pack as u64, cannot overflow) and an index of a tree of such blocks
MAX_NODE_SIZE = 1 << 56
MAX_NODE_INDEX = 1 << 62


def node_of(m: pb.Node) -> Node:
    if len(m.hash) != HASH_SIZE:
        raise errors.Corruption(f"tree node {m.index} has a {len(m.hash)}-byte hash")
    if m.size > MAX_NODE_SIZE or m.index > MAX_NODE_INDEX:
        raise errors.Corruption(f"tree node {m.index} claims an impossible size ({m.size} bytes) or index")
    return Node(m.index, bytes(m.hash), m.size)


def nodes_of(ms: Iterable[pb.Node], source: str | None = None) -> list[Node]:
    """The nodes of a message; a malformed one is Corruption naming `source`, the peer that sent it."""
    try:
        return [node_of(m) for m in ms]
    except errors.Corruption as e:
        if source is None:
            raise
        raise errors.Corruption(f"{source}: {e}") from None


def state_pb(s: TreeState) -> pb.SignedState:
    return pb.SignedState(length=s.length, fork=s.fork, tree_hash=s.tree_hash, signature=s.signature)


def state_of(m: pb.SignedState) -> TreeState:
    if len(m.tree_hash) != HASH_SIZE or len(m.signature) != SIGNATURE_SIZE:
        raise errors.Corruption(f"malformed signed state for length {m.length}")
    return TreeState(m.length, m.fork, bytes(m.tree_hash), bytes(m.signature))


def consistency_pb(p: ConsistencyProof) -> pb.ConsistencyProof:
    return pb.ConsistencyProof(
        old_length=p.old_length,
        new_length=p.new_length,
        old_roots=[node_pb(n) for n in p.old_roots],
        nodes=[node_pb(n) for n in p.nodes],
    )


def consistency_of(m: pb.ConsistencyProof, source: str | None = None) -> ConsistencyProof:
    """A received consistency proof, its nodes checked for form (the proof itself: `consistency.verify`)."""
    return ConsistencyProof(
        m.old_length, m.new_length, tuple(nodes_of(m.old_roots, source)), tuple(nodes_of(m.nodes, source))
    )


def fork_proof_pb(p: ForkProof) -> pb.ForkProof:
    m = pb.ForkProof(key=p.key, a=state_pb(p.a), b=state_pb(p.b))
    if p.consistency is not None:
        m.consistency.CopyFrom(consistency_pb(p.consistency))
    return m


def fork_proof_of(m: pb.ForkProof, source: str | None = None) -> ForkProof:
    """A received fork proof, parsed (not verified: `forks.verify`)."""
    try:
        a, b = state_of(m.a), state_of(m.b)
    except errors.Corruption as e:
        raise errors.Corruption(f"{source}: {e}" if source else str(e)) from None
    proof = consistency_of(m.consistency, source) if m.HasField("consistency") else None
    return ForkProof(check_key(m.key), a, b, proof)


def segment_pb(s: Segment) -> pb.Segment:
    m = pb.Segment(start=s.start, blocks=[b if b is not None else b"" for b in s.blocks])
    m.cleared.extend(node_pb(n) for n in s.cleared)
    if s.state is not None:
        m.state.CopyFrom(state_pb(s.state))
    return m


def segment_of(m: pb.Segment) -> Segment:
    """A received segment; cleared blocks (those with a leaf in `cleared`) become None."""
    state = state_of(m.state) if m.HasField("state") else None
    if not len(m.cleared):  # the usual segment, every block present: no per-block pass (issue 17)
        return Segment(m.start, list(m.blocks), [], state)
    cleared = nodes_of(m.cleared)
    gone = {n.index // 2 for n in cleared if n.index % 2 == 0}
    if len(gone) != len(cleared):
        raise errors.Corruption(f"segment at {m.start}: cleared nodes must be distinct leaves")
    blocks: list[bytes | None] = [None if m.start + k in gone else bytes(b) for k, b in enumerate(m.blocks)]
    if any(not m.start <= s < m.start + len(blocks) for s in gone):
        raise errors.Corruption(f"segment at {m.start}: a cleared leaf lies outside it")
    return Segment(m.start, blocks, cleared, state)


def proof_pb(p: Proof) -> pb.ProofResponse:
    return pb.ProofResponse(
        seq=p.seq,
        block=p.block,
        path=[node_pb(n) for n in p.path],
        roots=[node_pb(n) for n in p.roots],
        state=state_pb(p.state),
    )


def proof_of(m: pb.ProofResponse) -> Proof:
    return Proof(m.seq, bytes(m.block), tuple(nodes_of(m.path)), tuple(nodes_of(m.roots)), state_of(m.state))


def info_json(m: pb.FeedInfo) -> dict[str, str | int | bool | None]:
    """GetInfo as the same JSON object `feedlog info --json` prints for a local feed."""
    return {
        "key": m.key.hex() if m.key else None,
        "discovery_key": m.discovery_key.hex(),
        "type": m.content_type,
        "length": m.state.length,
        "byte_length": m.byte_length,
        "tree_hash": m.state.tree_hash.hex(),
        "fork": m.state.fork,
        "signature": m.state.signature.hex(),
        "writable": m.writable,
        "timestamps": m.timestamps or None,  # None: the peer does not know the writer's policy
        "ttl": m.ttl or None,
        "min_timestamp": m.min_timestamp if m.HasField("min_timestamp") else None,
        "max_timestamp": m.max_timestamp if m.HasField("max_timestamp") else None,
        "forgetting": forgetting(m.compact_every_ms if m.HasField("compact_every_ms") else None, peer=True),
        # issue 40: shown only for a peer that holds a fork proof (what `feedlog info` of a feed says too)
        **({"fork_proof": _fork_text(m.fork_proof)} if m.HasField("fork_proof") else {}),
    }


def _fork_text(m: pb.ForkProof) -> str:
    """What a peer's fork proof says, once it verifies (a peer's claim alone is shown as such)."""
    from ..log import forks  # the proof's check, done where it is shown

    try:
        proof = fork_proof_of(m)
        forks.verify(proof, bytes(m.key))
    except errors.FeedlogError as e:
        return f"the peer claims a fork, with a proof that does not verify: {e}"
    return f"{proof.describe()} (fork point {proof.fork_point})"


def puts_pb(writes: Sequence[Write]) -> list[pb.Put]:
    """`Write`s as wire puts (the server re-validates everything)."""
    out = []
    for n, w in enumerate(writes):
        try:
            if w.ttl_ms is not None and w.ttl_ms <= 0:
                raise ValueError("a TTL must be greater than zero")
            m = pb.Put(key=w.key, deleted=w.deleted, ttl_ms=w.ttl_ms or 0, exact_expiry=w.exact_expiry, forget=w.forget)
            if isinstance(w.value, bytes | bytearray):
                m.value = bytes(w.value)
            elif w.value is not None:
                m.stat.update({k: int(v) for k, v in w.value.items()})
            if w.timestamps is not None:
                m.timestamps = str(w.timestamps)
        except (ValueError, TypeError, AttributeError) as e:
            raise errors.InvalidArgument(f"entry {n}: {e}") from None
        out.append(m)
    return out
