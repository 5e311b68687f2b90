"""A key holder's Append carries only what readers can use (issue 13 items 9 and 6), over real gRPC.

Each bad block kind is refused with INVALID_ARGUMENT, both on an existing feed
and on a brand-new one (nothing is created); no block over MAX_BLOCK_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from feedlog.errors import InvalidArgument
from feedlog.log import entries, merkle
from feedlog.log.core import MAX_BLOCK_BYTES
from feedlog.log.crypto import Signer
from feedlog.log.feed import Write
from feedlog.log.merkle import Node
from feedlog.pb import hyperdb_pb2
from feedlog.replication.client import FeedClient
from feedlog_server.app import PeerServer

from .conftest import KP, OTHER, local_feed

Peers = Callable[..., PeerServer]
Clients = Callable[..., FeedClient]

BAD_BLOCKS = {
    "empty block": b"",
    "second header": entries.encode_header(entries.ENTRY),
    "key not UTF-8": b"\x0a\x02\xff\xfe\x22\x00",
    "empty key": hyperdb_pb2.Entry(key="", trie=b"").SerializeToString(),
    "over the size limit": entries.encode_entry(
        entries.ENTRY, "big", bytes(MAX_BLOCK_BYTES), deleted=False, timestamp=None, expires_at=None
    ),
}


def signature(roots: list[Node], start: int, blocks: list[bytes], seed: bytes) -> bytes:
    _, new_roots = merkle.append_leaves(roots, start, blocks)
    state = merkle.TreeState(start + len(blocks), 0, merkle.roots_hash(new_roots), b"")
    return Signer(seed).sign(state.signable())


def entry(key: str) -> bytes:
    return entries.encode_entry(entries.ENTRY, key, b"v", deleted=False, timestamp=None, expires_at=None)


def test_append_refuses_each_bad_block_kind(peers: Peers, clients: Clients, tmp_path: Path) -> None:
    local_feed(tmp_path / "a" / "f", n=2).close()
    a = peers("a", accept_new=True, max_message_bytes=MAX_BLOCK_BYTES + (1 << 20))
    hf = a.host.get(KP.public_key)
    before = hf.feed.core.state
    c = clients(a)
    for kind, bad in BAD_BLOCKS.items():
        blocks = [entry("/ok"), bad]
        sig = signature(hf.feed.core.roots(), 3, blocks, KP.seed or b"")
        with pytest.raises(InvalidArgument, match="block 4") as e:
            c.append(KP.public_key, 3, blocks, sig)
        if kind == "over the size limit":
            assert f"limit is {MAX_BLOCK_BYTES}" in str(e.value)
        # a new feed's first batch is checked the same way, before anything is created
        first = [entries.encode_header(entries.ENTRY), bad]
        with pytest.raises(InvalidArgument, match="block 1"):
            c.append(OTHER.public_key, 0, first, signature([], 0, first, OTHER.seed or b""))
        assert len(a.host) == 1 and not (tmp_path / "a" / OTHER.public_key.hex()).exists(), kind
    assert hf.feed.core.state == before
    good = [entry("/ok")]
    assert c.append(KP.public_key, 3, good, signature(hf.feed.core.roots(), 3, good, KP.seed or b"")).length == 4


def test_a_put_over_the_block_limit_fails_alone(peers: Peers, clients: Clients) -> None:
    a = peers("a")
    c = clients(a)
    key = c.create().key
    with pytest.raises(InvalidArgument, match=f"limit is {MAX_BLOCK_BYTES}"):
        c.put(key, [Write("/big", bytes(MAX_BLOCK_BYTES))])
    assert [x.seq for x in c.put(key, [Write("/small", b"v")])] == [1]
    assert a.host.get(key).feed.verify().length == 2
