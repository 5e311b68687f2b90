"""Hashes, signable bytes and keys, exactly as hypercore 11 builds them.

Every hash is BLAKE2b-256 over hand-built, fixed-width, domain-separated bytes
(hypercore-crypto's `data`/`parent`/`tree`, hypercore's `caps.js`); nothing here
hashes or signs serialized protobuf, whose encoding is not canonical. Golden
vectors from hypercore itself: tests/vectors/hypercore-11.37.1.json.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import InvalidArgument

HASH_SIZE = 32
SIGNATURE_SIZE = 64
KEY_SIZE = 32

# domain separation of the three hash kinds (hypercore-crypto: second-preimage protection)
LEAF_TYPE = 0
PARENT_TYPE = 1
ROOT_TYPE = 2

_ROOT = struct.Struct("<32sQQ")
_ROOT_PREFIX = bytes([ROOT_TYPE])


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=HASH_SIZE)
    for p in parts:
        h.update(p)
    return h.digest()


def _namespace(name: bytes, ident: int) -> bytes:
    # hypercore-crypto `namespace(name, count)[ident]`: H(H(name) || byte(ident))
    return _h(_h(name), bytes([ident]))


#: caps.js: `[TREE, ...] = crypto.namespace('hypercore', 6)`
TREE_NS = _namespace(b"hypercore", 0)


_LEAF_PREFIX = struct.Struct("<BQ")
_PARENT = struct.Struct("<BQ32s32s")
_blake2b = hashlib.blake2b


#: the leaf prefix of every small block size, prebuilt: a small block is hashed in one call
_SMALL = 1024
_HASHER = _blake2b(digest_size=HASH_SIZE)
_LEAF_PREFIXES = [_LEAF_PREFIX.pack(LEAF_TYPE, n) for n in range(_SMALL)]


def leaf_hash(block: bytes) -> bytes:
    """H(0x00 || u64le(len(block)) || block)."""
    n = len(block)
    if n < _SMALL:
        h = _HASHER.copy()  # cheaper than a constructor call with its keyword argument
        h.update(_LEAF_PREFIXES[n] + block)
        return h.digest()
    h = _blake2b(_LEAF_PREFIX.pack(LEAF_TYPE, n), digest_size=HASH_SIZE)
    h.update(block)
    return h.digest()


def parent_hash(left: bytes, right: bytes, size: int) -> bytes:
    """H(0x01 || u64le(size_left + size_right) || left || right); `size` is the byte total."""
    return _blake2b(_PARENT.pack(PARENT_TYPE, size, left, right), digest_size=HASH_SIZE).digest()


def tree_hash(roots: Iterable[tuple[int, bytes, int]]) -> bytes:
    """H(0x02 || for each root, left to right: hash || u64le(index) || u64le(size)).

    `roots` holds (flat-tree index, hash, byte size) triples.
    """
    pack = _ROOT.pack
    data = b"".join([pack(digest, index, size) for index, digest, size in roots])
    return _blake2b(_ROOT_PREFIX + data, digest_size=HASH_SIZE).digest()


_SIGNABLE = struct.Struct("<32s32sQQ")


def tree_signable(tree_hash_: bytes, length: int, fork: int = 0) -> bytes:
    """caps.treeSignableCompat: TREE || tree_hash || u64le(length) || u64le(fork), 80 bytes."""
    return _SIGNABLE.pack(TREE_NS, tree_hash_, length, fork)


def discovery_key(public_key: bytes) -> bytes:
    """Keyed BLAKE2b-256 of b"hypercore" with the feed key as the key."""
    return hashlib.blake2b(b"hypercore", digest_size=HASH_SIZE, key=public_key).digest()


@dataclass(frozen=True)
class KeyPair:
    public_key: bytes
    seed: bytes | None  # the 32-byte Ed25519 private seed; None for a read-only copy

    @classmethod
    def generate(cls) -> KeyPair:
        return cls.from_seed(Ed25519PrivateKey.generate().private_bytes_raw())

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        if len(seed) != 32:
            raise InvalidArgument(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        sk = Ed25519PrivateKey.from_private_bytes(seed)
        return cls(sk.public_key().public_bytes_raw(), seed)


class Signer:
    """Signs tree states with a feed's secret key (keeps the parsed key around)."""

    def __init__(self, seed: bytes) -> None:
        self._sk = Ed25519PrivateKey.from_private_bytes(seed)

    def sign(self, message: bytes) -> bytes:
        return self._sk.sign(message)


class Verifier:
    """Verifies signatures against one feed key."""

    def __init__(self, public_key: bytes) -> None:
        if len(public_key) != KEY_SIZE:
            raise InvalidArgument(f"a feed key is {KEY_SIZE} bytes, got {len(public_key)}")
        try:
            self._pk = Ed25519PublicKey.from_public_bytes(public_key)
        except ValueError as e:  # pragma: no cover - any 32 bytes parse today
            raise InvalidArgument(f"not an Ed25519 public key: {e}") from None

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self._pk.verify(signature, message)
        except InvalidSignature:
            return False
        return True
