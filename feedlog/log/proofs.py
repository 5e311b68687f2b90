"""An entry's proof as a JSON document anyone can keep and check later with `feedlog check-proof`.

A `merkle.Proof` (the block, its sibling hashes up to a root, every root and the signed tree
state) plus the feed key it claims to be signed by, all binary as hex. Checking it needs
nothing but this document and the key the reader trusts: `verify_proof` re-hashes the block up
the path, the roots into the tree hash, and checks the signature (hypercore's "signed tree").
Pure: no I/O here; the commands and the console read and write the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Corruption, InvalidArgument
from .merkle import Node, Proof, TreeState

#: the document's `format`; a reader refuses any other (a later layout gets a new name)
FORMAT = "feedlog-proof/1"


def _node_json(n: Node) -> dict[str, Any]:
    return {"index": n.index, "hash": n.hash.hex(), "size": n.size}


def proof_json(proof: Proof, key: bytes) -> dict[str, Any]:
    """`proof` of a block of feed `key` as a JSON-ready document."""
    s = proof.state
    return {
        "format": FORMAT,
        "key": key.hex(),
        "seq": proof.seq,
        "block": proof.block.hex(),
        "path": [_node_json(n) for n in proof.path],
        "roots": [_node_json(n) for n in proof.roots],
        "signed": {"length": s.length, "fork": s.fork, "tree_hash": s.tree_hash.hex(), "signature": s.signature.hex()},
    }


def _hex(doc: Mapping[str, Any], name: str, size: int | None = None) -> bytes:
    value = doc.get(name)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or (size is not None and len(raw) != size):
        want = f"{size * 2} hex digits" if size else "hex"
        raise Corruption(f"proof: {name!r} is not {want}")
    return raw


def _int(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Corruption(f"proof: {name!r} is not a non-negative integer")
    return value


def _nodes(doc: Mapping[str, Any], name: str) -> tuple[Node, ...]:
    items = doc.get(name)
    if not isinstance(items, list) or len(items) > 128:  # a tree of 2^64 blocks has fewer than 128 levels
        raise Corruption(f"proof: {name!r} is not a list of nodes")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise Corruption(f"proof: {name!r} holds something other than a node")
        out.append(Node(_int(item, "index"), _hex(item, "hash", 32), _int(item, "size")))
    return tuple(out)


def proof_from_json(doc: object) -> tuple[Proof, bytes]:
    """(the proof, the key it names) from a document `proof_json` wrote; Corruption if it is not one.

    Only the shape is checked here; `merkle.verify_proof` decides whether it proves anything."""
    if not isinstance(doc, dict):
        raise InvalidArgument("not a feedlog proof: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise InvalidArgument(f"not a feedlog proof: format {str(doc.get('format'))[:40]!r}, expected {FORMAT!r}")
    signed = doc.get("signed")
    if not isinstance(signed, dict):
        raise Corruption("proof: 'signed' is not an object")
    state = TreeState(
        _int(signed, "length"), _int(signed, "fork"), _hex(signed, "tree_hash", 32), _hex(signed, "signature", 64)
    )
    proof = Proof(_int(doc, "seq"), _hex(doc, "block"), _nodes(doc, "path"), _nodes(doc, "roots"), state)
    return proof, _hex(doc, "key", 32)
