"""Copying feeds between a local directory and a peer: clone, pull, push, and the store loop followers share.

Every batch received is stored only if it hashes to its signed tree and the
signature verifies with the feed key (`Feed.store_signed`); a bad one stops
the copy with an error naming the peer and the blocks, and everything
verified before it stays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import Conflict, Corruption, FeedlogError, InvalidArgument, NotFound, Unavailable
from ..log.feed import Feed
from ..log.merkle import TreeState
from ..log.storage import atomic_write
from ..pb import feeds_pb2 as pb
from . import wire
from .client import Address, FeedClient, Tls

REMOTE_FILE = "remote.json"
PUSH_BATCH_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Copied:
    blocks: int
    length: int


def store_responses(
    feed: Feed, responses: Iterable[pb.ReadResponse], source: str, on_stored: Callable[[int], None] | None = None
) -> int:
    """Store the signed batches of a Read/Subscribe stream that continues this feed; return blocks stored.

    One fsync per received message, not per batch. `on_stored(length)` runs
    after each message that stored something (a follower wakes its tails).
    """
    stored = 0
    pending: list[bytes] = []
    for resp in responses:
        grew = False
        for m in resp.segments:
            expected = feed.length + len(pending)
            if m.start != expected:
                raise Corruption(f"{source}: sent blocks from {m.start}, expected {expected}")
            if m.cleared:
                first = min(n.index // 2 for n in m.cleared)
                raise Unavailable(
                    f"{source}: block {first} was cleared by compaction there; "
                    "replicate from a peer that still holds it"
                )
            pending.extend(m.blocks)
            if m.HasField("state"):
                state = wire.state_of(m.state)
                try:
                    feed.store_signed(pending, state, sync=False)
                except Corruption as e:
                    raise type(e)(f"{source}: rejected blocks {feed.length}..{state.length - 1}: {e}") from None
                stored += len(pending)
                pending = []
                grew = True
        if grew:
            feed.core.sync()
            if on_stored is not None:
                on_stored(feed.length)
    return stored


def _remote(path: Path) -> Address:
    try:
        raw = json.loads((path / REMOTE_FILE).read_text())
        return Address.parse(str(raw["url"]), need_feed=True)
    except FileNotFoundError:
        raise NotFound(f"{path}: not a clone (no {REMOTE_FILE}); use `feedlog clone` first") from None
    except (ValueError, KeyError, TypeError) as e:
        raise Corruption(f"{path / REMOTE_FILE}: {e}") from None


def clone(address: Address, path: str | os.PathLike[str], *, tls: Tls | None = None) -> Copied:
    """A verified copy of the feed at `address` in a new directory, remembering where it came from."""
    key = address.key
    p = Path(path)
    with FeedClient(address.target, tls=tls) as client:
        client.info(key)  # fail before creating anything if the peer does not have it
        with Feed.create_replica(p, key) as feed:
            atomic_write(p / REMOTE_FILE, json.dumps({"url": str(address)}).encode())
            n = store_responses(feed, client.read(key, 0), address.target)
            return Copied(n, feed.length)


def pull(path: str | os.PathLike[str], *, tls: Tls | None = None) -> Copied:
    """Fetch, verify and store what the feed's origin has beyond our length."""
    p = Path(path)
    address = _remote(p)
    with Feed.open(p) as feed, FeedClient(address.target, tls=tls) as client:
        if feed.key != address.key:
            raise Corruption(f"{p / REMOTE_FILE} names feed {address.feed}, but this is {feed.key.hex()}")
        remote = client.info(feed.key).state.length
        if remote <= feed.length:
            return Copied(0, feed.length)
        n = store_responses(feed, client.read(feed.key, feed.length, remote), address.target)
        return Copied(n, feed.length)


def push(
    path: str | os.PathLike[str], address: Address, *, tls: Tls | None = None, token: str | None = None
) -> Copied:
    """Send the peer every signed batch it lacks (it checks each signature before storing).

    A peer takes a feed it does not host yet only from an authenticated client
    (`token`, or a client certificate in `tls`) unless it runs with --accept-new.
    """
    with Feed.open(path, writable=False) as feed, FeedClient(address.target, tls=tls, token=token) as client:
        try:
            remote = client.info(feed.key).state.length
        except NotFound:
            remote = 0
        if remote > feed.length:
            raise Conflict(f"{address.target} has {remote} blocks of this feed, more than the {feed.length} here")
        if remote == feed.length:
            return Copied(0, remote)
        failed: list[FeedlogError] = []

        def requests() -> Iterator[pb.AppendRequest]:
            try:
                yield from _append_requests(feed, remote)
            except FeedlogError as e:  # gRPC would turn it into a bare cancellation
                failed.append(e)

        states = list(client.append_stream(requests()))
        if failed:
            raise failed[0]
        end = states[-1].length if states else remote
        return Copied(end - remote, end)


def _append_requests(feed: Feed, start: int) -> Iterator[pb.AppendRequest]:
    pos = start
    pending: list[bytes] = []
    while pos < feed.length:
        for seg in feed.core.segments(pos, feed.length, PUSH_BATCH_BYTES):
            if any(b is None for b in seg.blocks):
                raise InvalidArgument(f"cannot push: blocks from {seg.start} were cleared by compaction here")
            pending.extend(b for b in seg.blocks if b is not None)
            pos = seg.end
            if seg.state is not None:
                yield _append_request(feed.key, pos - len(pending), pending, seg.state)
                pending = []


def _append_request(key: bytes, start: int, blocks: list[bytes], state: TreeState) -> pb.AppendRequest:
    return pb.AppendRequest(key=key, expected_length=start, blocks=blocks, signature=state.signature, fork=state.fork)
