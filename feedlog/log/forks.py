"""Fork proofs: two states one key signed that cannot both be true, kept as self-contained evidence.

A key that signs two histories (a split view: one shown to some peers, the
other to the rest) is caught when anyone holds both signed states and one of:

- the same length and fork number, different tree hashes; or
- lengths m < n (same fork number) and the nodes of the signed tree at n that
  derive its roots (a `consistency.ConsistencyProof` from m to n, built from
  history n) whose roots at m are not the tree the key signed at m: the tree at
  n commits to another prefix (RFC 9162 section 2.1.4.2 run backwards: the
  proof that would show consistency shows the opposite).

`verify` needs nothing but the key inside the proof (or the one a caller
expects). A proof that merely shows a valid prefix, a forged or replayed state,
a proof for another key: refused with a clear error, nothing marked. Whoever
holds a valid proof keeps it beside the feed (`FORK_FILE`, written atomically)
and refuses to continue the feed past `fork_point` (the shorter length).
The JSON form is stable: `{"feedlog_fork_proof": 1, "key": HEX, "a": STATE,
"b": STATE, "consistency": null | {...}}`, a.length <= b.length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Corruption, Fork, InvalidArgument, NotFound
from . import consistency
from .consistency import ConsistencyProof, Inconsistent
from .crypto import HASH_SIZE, KEY_SIZE, SIGNATURE_SIZE, Verifier
from .merkle import Node, TreeState, roots_hash
from .storage import atomic_write

FORK_FILE = "fork-proof.json"
FORMAT_VERSION = 1
#: the most bytes of a fork proof read from a file or the wire: two states and at most 128 nodes, as hex
MAX_PROOF_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class ForkProof:
    key: bytes
    a: TreeState  # the shorter (or equal) of the two
    b: TreeState
    consistency: ConsistencyProof | None  # from a.length to b.length, from history b; None at one length

    @property
    def fork_point(self) -> int:
        """Past this length the key's two histories cannot both hold: a copy goes no further."""
        return self.a.length

    def describe(self) -> str:
        a, b = self.a, self.b
        return (
            f"feed {self.key.hex()} forked: its key signed tree {a.tree_hash.hex()} at length {a.length} and "
            f"tree {b.tree_hash.hex()} at length {b.length}, which cannot both hold"
        )


def of_states(key: bytes, x: TreeState, y: TreeState, proof: ConsistencyProof | None = None) -> ForkProof:
    """A fork proof from two states (either order) and, for different lengths, the consistency proof
    built from the longer one's history; `verify`d before it is returned (never an unchecked claim)."""
    a, b = (x, y) if x.length <= y.length else (y, x)
    fp = ForkProof(bytes(key), a, b, proof if a.length != b.length else None)
    verify(fp)
    return fp


def verify(proof: ForkProof, key: bytes | None = None) -> None:
    """Raise unless `proof` shows the key signed two histories: `key` (the feed a caller means; default
    the proof's own) must be the proof's. Fork is never raised: a valid proof returns."""
    if key is not None and bytes(key) != proof.key:
        raise InvalidArgument(f"the proof is for feed {proof.key.hex()}, not {bytes(key).hex()}")
    if len(proof.key) != KEY_SIZE:
        raise InvalidArgument(f"a feed key is {KEY_SIZE} bytes, got {len(proof.key)}")
    a, b = proof.a, proof.b
    if a.length > b.length:
        raise Corruption("a fork proof names its shorter state first")
    verifier = Verifier(proof.key)
    consistency.check_signed(a, verifier, "the proof's first state")
    consistency.check_signed(b, verifier, "the proof's second state")
    if a.fork != b.fork:
        raise Corruption(f"states of fork {a.fork} and {b.fork}: a truncation, not evidence of two histories")
    if a.length == b.length:
        if a.tree_hash == b.tree_hash:
            raise Corruption(f"both states are the same tree at length {a.length}: not a fork")
        if proof.consistency is not None:
            raise Corruption("a fork proof at one length carries no consistency proof")
        return
    if proof.consistency is None:
        raise Corruption(f"states at lengths {a.length} and {b.length} need the nodes of the longer tree")
    try:
        consistency.verify(proof.consistency, a, b, verifier)
    except Inconsistent:
        return  # the evidence: the tree at b holds another prefix than the one signed at a
    raise Corruption(f"the tree at length {a.length} is a prefix of the one at {b.length}: consistent, not a fork")


def check(key: bytes, ours: TreeState, node: Callable[[int], Node], theirs: TreeState) -> ForkProof | None:
    """A fork proof if `theirs` (already signature-checked or not: `verify` checks) cannot hold beside our
    history (`ours`, its nodes `node(index)`), else None. Only a shorter or equal state can be judged
    from our own tree; a longer one needs the holder's nodes (`from_received`)."""
    if theirs.length > ours.length or theirs.fork != ours.fork:
        return None
    if theirs.length == ours.length:
        return None if theirs.tree_hash == ours.tree_hash else of_states(key, theirs, ours)
    proof = consistency.prove(theirs.length, ours.length, node)
    if roots_hash(proof.old_roots) == theirs.tree_hash:
        return None
    return of_states(key, theirs, ours, proof)


def from_received(key: bytes, ours: TreeState, theirs: TreeState, proof: ConsistencyProof) -> ForkProof | None:
    """Check a peer's longer state against ours with the consistency proof it sent: None when consistent,
    a fork proof when its tree holds another prefix. Corruption (a lie, nothing marked) when the proof does
    not even match its own signed tree, or a signature fails."""
    try:
        consistency.verify(proof, ours, theirs, Verifier(key))
    except Inconsistent:
        return of_states(key, ours, theirs, proof)
    return None


# ---- JSON ------------------------------------------------------------------------------------------


def _state_json(s: TreeState) -> dict[str, Any]:
    return {"length": s.length, "fork": s.fork, "tree_hash": s.tree_hash.hex(), "signature": s.signature.hex()}


def _node_json(n: Node) -> list[Any]:
    return [n.index, n.hash.hex(), n.size]


def to_json(proof: ForkProof) -> dict[str, Any]:
    c = proof.consistency
    return {
        "feedlog_fork_proof": FORMAT_VERSION,
        "key": proof.key.hex(),
        "fork_point": proof.fork_point,
        "a": _state_json(proof.a),
        "b": _state_json(proof.b),
        "consistency": None
        if c is None
        else {
            "old_length": c.old_length,
            "new_length": c.new_length,
            "old_roots": [_node_json(n) for n in c.old_roots],
            "nodes": [_node_json(n) for n in c.nodes],
        },
    }


def dumps(proof: ForkProof) -> bytes:
    return (json.dumps(to_json(proof), indent=1) + "\n").encode()


def _hex(v: object, size: int, what: str) -> bytes:
    if not isinstance(v, str):
        raise InvalidArgument(f"{what}: expected hex text")
    try:
        raw = bytes.fromhex(v)
    except ValueError:
        raise InvalidArgument(f"{what}: not hex") from None
    if len(raw) != size:
        raise InvalidArgument(f"{what}: {len(raw)} bytes, expected {size}")
    return raw


def _uint(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 64:
        raise InvalidArgument(f"{what}: expected an unsigned 64-bit integer")
    return v


def _state_of(v: object, what: str) -> TreeState:
    if not isinstance(v, dict):
        raise InvalidArgument(f"{what}: expected an object")
    return TreeState(
        _uint(v.get("length"), f"{what}.length"),
        _uint(v.get("fork", 0), f"{what}.fork"),
        _hex(v.get("tree_hash"), HASH_SIZE, f"{what}.tree_hash"),
        _hex(v.get("signature"), SIGNATURE_SIZE, f"{what}.signature"),
    )


def _nodes_of(v: object, what: str) -> tuple[Node, ...]:
    if not isinstance(v, list) or len(v) > consistency.MAX_PROOF_NODES:
        raise InvalidArgument(f"{what}: expected a list of at most {consistency.MAX_PROOF_NODES} nodes")
    out = []
    for k, n in enumerate(v):
        if not isinstance(n, list) or len(n) != 3:
            raise InvalidArgument(f"{what}[{k}]: expected [index, hash, size]")
        out.append(
            Node(
                _uint(n[0], f"{what}[{k}].index"),
                _hex(n[1], HASH_SIZE, f"{what}[{k}].hash"),
                _uint(n[2], f"{what}[{k}].size"),
            )
        )
    return tuple(out)


def from_json(doc: object) -> ForkProof:
    """Parse (not verify) a fork proof; InvalidArgument naming the first malformed field."""
    if not isinstance(doc, dict) or doc.get("feedlog_fork_proof") != FORMAT_VERSION:
        raise InvalidArgument(f"not a feedlog fork proof (version {FORMAT_VERSION})")
    c = doc.get("consistency")
    proof: ConsistencyProof | None = None
    if c is not None:
        if not isinstance(c, dict):
            raise InvalidArgument("consistency: expected an object or null")
        proof = ConsistencyProof(
            _uint(c.get("old_length"), "consistency.old_length"),
            _uint(c.get("new_length"), "consistency.new_length"),
            _nodes_of(c.get("old_roots"), "consistency.old_roots"),
            _nodes_of(c.get("nodes"), "consistency.nodes"),
        )
    return ForkProof(
        _hex(doc.get("key"), KEY_SIZE, "key"), _state_of(doc.get("a"), "a"), _state_of(doc.get("b"), "b"), proof
    )


def loads(raw: bytes | str) -> ForkProof:
    if len(raw) > MAX_PROOF_BYTES:
        raise InvalidArgument(f"a fork proof is at most {MAX_PROOF_BYTES} bytes, got {len(raw)}")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"not JSON: {e}") from None
    return from_json(doc)


def read(path: str | Path) -> ForkProof:
    """A fork proof file, parsed (not verified)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_PROOF_BYTES + 1)
    except FileNotFoundError:
        raise NotFound(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{p}: a directory, not a fork proof file") from None
    try:
        return loads(raw)
    except InvalidArgument as e:
        raise InvalidArgument(f"{p}: {e}") from None


# ---- beside a feed ---------------------------------------------------------------------------------


def load(feed_dir: str | Path) -> ForkProof | None:
    """The fork proof kept beside a feed, re-verified (a file edited by hand proves nothing), or None."""
    p = Path(feed_dir) / FORK_FILE
    if not p.is_file():
        return None
    proof = read(p)
    verify(proof)
    return proof


def keep(feed_dir: str | Path, proof: ForkProof) -> bool:
    """Keep `proof` beside the feed (verified first); False if one is kept already (the first stays)."""
    verify(proof)
    p = Path(feed_dir) / FORK_FILE
    if p.exists():
        return False
    atomic_write(p, dumps(proof))
    return True


def fork_error(proof: ForkProof, source: str, where: str | None = None) -> Fork:
    """The error a reader raises for a proven fork (exit 5), saying where the proof was kept."""
    kept = f"; the proof is kept in {where} (check it: feedlog verify-fork {where})" if where else ""
    return Fork(f"{source}: {proof.describe()} (fork point {proof.fork_point}){kept}")
