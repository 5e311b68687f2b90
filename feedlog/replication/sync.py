"""Copying feeds between a local directory and a peer: clone, pull, push, and the store loop followers share.

Every batch received is stored only if it hashes to its signed tree and the
signature verifies with the feed key (`Feed.store_signed`); a bad one stops
the copy with an error naming the peer and the blocks, and everything
verified before it stays.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..clock import Clock
from ..errors import Conflict, Corruption, FeedlogError, Fork, InvalidArgument, NotFound, SignatureError, Unavailable
from ..log import forks, merkle
from ..log.feed import Feed
from ..log.merkle import Node, TreeState
from ..log.storage import atomic_write
from ..log.timestamps import format_duration
from ..pb import feeds_pb2 as pb
from ..rpc import Address, Tls
from . import wire
from .client import FeedClient
from .verify import DEFAULT_BUDGET, SegmentVerifier, Unsigned, max_unsigned_bytes
from .witness import check_witnesses, fork_found, judge, peer_fork

REMOTE_FILE = "remote.json"
PUSH_BATCH_BYTES = 1 << 20
#: messages a clone or pull receives while it verifies and stores the previous one (issue 17: the
#: peer was idle while we stored); memory: this many more messages of the read budget
READ_AHEAD = 2
#: a clone or pull fsyncs once per this many bytes received (and at the end), not per message
SYNC_BYTES = 16 << 20


#: holes a fill pass looks up at a time (`fill_holes`), and the widest run of blocks between two
#: holes it reads rather than asking for each apart
HOLE_LOOKUP = 4096
HOLE_GAP = 64


@dataclass(frozen=True, slots=True)
class Copied:
    blocks: int
    length: int
    #: holes (blocks that came cleared) filled from the peer, and how many the copy still has
    filled: int = 0
    holes: int = 0
    #: the witnesses (`--witness`) whose signed states agreed with the copy's source (issue 40)
    witnesses: tuple[str, ...] = ()


def store_responses(
    feed: Feed,
    responses: Iterable[pb.ReadResponse],
    source: str,
    on_stored: Callable[[int], None] | None = None,
    *,
    budget: int = DEFAULT_BUDGET,
) -> int:
    """Store the signed batches of a Read/Subscribe stream that continues this feed; return blocks stored.

    With `on_stored` (a follower: it wakes its tails), one fsync per received
    message that stored something, then `on_stored(length)`. Without (a clone or
    pull, whose caller waits for the end), one fsync per `SYNC_BYTES` received
    and one at the end: a crash loses at most that much, the copy stays a
    verified prefix either way (the log recovers to its last whole batch).
    At most `max_unsigned_bytes(budget)` is held before a signature arrives,
    and a stream that ends mid-batch is an error: a peer that streams blocks
    it never signs is refused, named, rather than buffered (issue 13 item 1).
    If the stream was asked `with_roots`, roots at our length that differ
    from our tree are checked for a fork (`_fork_at`).
    """
    stored = 0
    unsynced = 0  # bytes received since the last fsync
    pending: list[bytes | None] = []
    pending_leaves: list[Node] = []  # the leaf nodes of the cleared blocks in `pending`
    unsigned = Unsigned(max_unsigned_bytes(budget), source)
    it = iter(responses)
    try:
        for resp in it:
            if resp.roots and feed.length and not stored and not pending:
                roots = wire.nodes_of(resp.roots, source)
                if merkle.roots_hash(roots) != feed.core.state.tree_hash:
                    _fork_at(feed, roots, itertools.chain([resp], it), source, budget)
            # the message's signed batches, stored together (one timestamp scan: Feed.store_signed_many)
            batches: list[tuple[list[bytes | None], TreeState]] = []
            leaves: list[list[Node]] = []
            held = feed.length  # where `pending` starts
            for m in resp.segments:
                expected = held + len(pending)
                if m.start != expected:
                    raise Corruption(f"{source}: sent blocks from {m.start}, expected {expected}")
                unsigned.charge_pb(m)  # before touching the blocks: refuses a flood cheaply
                unsynced += unsigned.last
                if m.cleared:  # blocks the peer holds (or serves) as their leaf only: stored as holes (issue 37)
                    try:
                        seg = wire.segment_of(m)
                    except Corruption as e:
                        raise Corruption(f"{source}: {e}") from None
                    pending.extend(seg.blocks)
                    pending_leaves.extend(seg.cleared)
                else:
                    pending.extend(m.blocks)
                if m.HasField("state"):
                    batches.append((pending, wire.state_of(m.state)))
                    leaves.append(pending_leaves)
                    held += len(pending)
                    pending, pending_leaves = [], []
                    unsigned.signed()
            if batches:
                stored += _store(feed, batches, source, leaves)
            if batches and (on_stored is not None or unsynced >= SYNC_BYTES):
                feed.core.sync()
                unsynced = 0
                if on_stored is not None:
                    on_stored(feed.length)
            elif batches:  # the disk writes this message while the next one is verified
                feed.core.start_writeback()
    finally:
        if unsynced:  # what was stored is made durable, on an error too
            feed.core.sync()
    if pending:
        raise Corruption(
            f"{source}: the stream ended after {len(pending)} blocks from {feed.length} that were never signed"
        )
    return stored


def _store(
    feed: Feed, batches: list[tuple[list[bytes | None], TreeState]], source: str, leaves: list[list[Node]]
) -> int:
    """Verify and store a message's signed batches in order; the first one refused stops it, named."""
    length = feed.length
    try:
        return feed.store_signed_many(batches, sync=False, leaves=leaves if any(leaves) else None)
    except (Corruption, InvalidArgument) as e:  # e.g. a state whose length does not fit the blocks
        kind = Corruption if isinstance(e, InvalidArgument) else type(e)
        first, done = feed.length, length
        for blocks, state in batches:  # which batch: the one the feed stopped before
            if done == first:
                raise kind(f"{source}: rejected blocks {first}..{state.length - 1}: {e}") from None
            done += len(blocks)
        raise


def _fork_at(feed: Feed, roots: list[Node], responses: Iterator[pb.ReadResponse], source: str, budget: int) -> None:
    """The peer's tree at our length differs from ours: a fork if its next signed batch proves it, else a lie."""
    length, ours = feed.length, feed.core.state.tree_hash.hex()
    theirs = merkle.roots_hash(roots).hex()
    try:
        v = SegmentVerifier(feed.key, length, roots, source=source, max_unsigned=max_unsigned_bytes(budget))
        for resp in responses:
            for m in resp.segments:
                batch = v.receive(m)
                if batch is not None:
                    raise Fork(
                        f"{source}: the feed forked at length {length}: our tree there is {ours}, the peer's is "
                        f"{theirs}, and the key holder signed its continuation to length {batch.state.length} "
                        f"(tree {batch.state.tree_hash.hex()}); keeping ours"
                    )
    except Fork:
        raise
    except Corruption as e:
        raise Corruption(
            f"{source}: sent roots at length {length} that are not our tree ({theirs}, ours {ours}): {e}"
        ) from None
    raise Corruption(
        f"{source}: sent roots at length {length} that are not our tree ({theirs}, ours {ours}) and no signed batch"
    )


def fill_holes(feed: Feed, client: FeedClient, source: str, length: int) -> int:
    """Fill this copy's holes below `length` with the payloads `source` still serves; return how many.

    A hole is a block a peer sent cleared (issue 37): a cleared block does not
    say why, so a hostile upstream can withhold a payload this way, never forge
    one. Any peer may fill it: each block must hash to the leaf our signed tree
    holds (`Feed.fill`, Corruption naming `source` otherwise), and one our own
    rule no longer keeps (expired here) stays cleared. Reads runs of holes, a
    run's blocks in order and no further than the batch holding its last hole.
    """
    filled = 0
    pos = 1
    while pos < min(length, feed.length):
        holes = feed.core.holes(pos, min(length, feed.length), HOLE_LOOKUP)
        if not holes:
            break
        for lo, hi in _runs(holes, HOLE_GAP):
            stop = feed.core.batch_end(hi - 1)  # the peer sends to the end of the batch holding hi - 1
            at = lo
            responses = client.read(feed.key, lo, hi)
            try:
                for resp in responses:
                    for m in resp.segments:
                        if m.start != at or at + len(m.blocks) > stop:
                            raise Corruption(f"{source}: sent blocks from {m.start}, expected {at} (to {stop})")
                        try:
                            seg = wire.segment_of(m)
                            filled += feed.fill(seg.start, seg.blocks)
                        except Corruption as e:
                            raise Corruption(f"{source}: {e}") from None
                        at = seg.end
                    if at >= stop:
                        break
            finally:
                close = getattr(responses, "close", None)
                if close is not None:
                    close()
        pos = holes[-1] + 1
    return filled


def _runs(seqs: list[int], gap: int) -> list[tuple[int, int]]:
    """Sorted seqs as [lo, hi) ranges, joining two whose distance is at most `gap`."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and s - out[-1][1] < gap:
            out[-1] = (out[-1][0], s + 1)
        else:
            out.append((s, s + 1))
    return out


def check_remote(feed: Feed, state: TreeState, source: str) -> None:
    """Refuse a peer whose signed state disagrees with ours at a length we both hold (issue 13 item 10).

    Compares tree hashes, not lengths: a different signed tree at the same or
    a shorter length is a fork, reported with both hashes. A longer state is
    checked as its batches arrive (they must extend our tree).
    """
    if state.length == 0:
        return  # the peer holds nothing of the feed: nothing to compare
    if not feed.core.verifier.verify(state.signature, state.signable()):
        raise SignatureError(f"{source}: its signed state for length {state.length} does not verify with the feed key")
    if state.length > feed.length:
        return
    if state.length == feed.length:
        ours = feed.core.state
    else:
        ours = TreeState(
            state.length,
            feed.core.state.fork,
            merkle.roots_hash(merkle.nodes_for_roots(state.length, feed.core.node)),
            b"",
        )
    if ours.tree_hash != state.tree_hash or ours.fork != state.fork:
        raise Fork(
            f"{source}: the feed forked: at length {state.length} the peer's signed tree is {state.tree_hash.hex()} "
            f"(fork {state.fork}), ours is {ours.tree_hash.hex()} (fork {ours.fork})"
        )


def check_continuation(feed: Feed, client: FeedClient, source: str, keep: Path | None = None) -> TreeState:
    """The peer's signed state, once it is shown to continue ours (issue 40): asked with the consistency
    proof from our length, judged from our tree when the peer is behind. A fork raises `Fork` with its
    proof kept in `keep` (a feed directory) first; a peer that lies raises Corruption, nothing kept."""
    info = client.info(feed.key, consistency_from=feed.length)
    state, found = judge(feed.key, feed.core.state, info, source, node=feed.core.node, need_proof=False)
    if found is not None:
        raise fork_found(found, source, keep)
    check_remote(feed, state, source)  # the fork number, and what it says in its own words
    return state


def _witnessed(
    client: FeedClient,
    key: bytes,
    state: TreeState,
    witnesses: Sequence[Address],
    tls: Tls | None,
    keep: Path,
    source: str,
) -> tuple[str, ...]:
    """The witnesses that agree with the source's signed `state` (Fork for one that proves a fork)."""
    if not witnesses:
        return ()

    def longer(length: int) -> pb.FeedInfo:  # the source's proof from a witness's shorter length
        return client.info(key, consistency_from=length)

    agreed = check_witnesses(key, state, witnesses, tls=tls, longer=longer, keep=keep, source=source)
    return tuple(a.witness for a in agreed)


def _remote(path: Path) -> Address:
    try:
        raw = json.loads((path / REMOTE_FILE).read_text())
        return Address.parse(str(raw["url"]), need_feed=True)
    except FileNotFoundError:
        raise NotFound(f"{path}: not a clone (no {REMOTE_FILE}); use `feedlog clone` first") from None
    except (ValueError, KeyError, TypeError) as e:
        raise Corruption(f"{path / REMOTE_FILE}: {e}") from None


def _counted(responses: Iterable[pb.ReadResponse], on_progress: Callable[[int], None]) -> Iterator[pb.ReadResponse]:
    """The responses, reporting the blocks received so far before each is handed on."""
    blocks = 0
    for resp in responses:
        blocks += sum(len(m.blocks) for m in resp.segments)
        on_progress(blocks)
        yield resp


def _fetch(
    feed: Feed,
    client: FeedClient,
    state: TreeState,
    source: str,
    on_progress: Callable[[int], None] | None = None,
    responses: Iterator[pb.ReadResponse] | None = None,
) -> int:
    """Fetch our length..state.length (`responses`: that read, asked for already) and make sure we end
    exactly at the peer's signed state."""
    if responses is None:
        responses = client.read(feed.key, feed.length, state.length, with_roots=True, ahead=READ_AHEAD)
    n = store_responses(
        feed,
        responses if on_progress is None else _counted(responses, on_progress),
        source,
        budget=client.budget,
    )
    if feed.length < state.length:
        raise Corruption(
            f"{source}: advertised length {state.length} but its stream ended at {feed.length} "
            f"({n} blocks fetched and kept)"
        )
    check_remote(feed, state, source)
    return n


def clone(
    address: Address,
    path: str | os.PathLike[str],
    *,
    tls: Tls | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    clock: Clock | None = None,
    witnesses: Sequence[Address] = (),
) -> Copied:
    """A verified copy of the feed at `address` in a new directory, remembering where it came from.

    Fails (and leaves no directory behind if nothing verified) unless the copy
    reaches the length and tree the peer advertised. The copy keeps the writer's
    timestamp policy and TTL as the peer reports them (`info` shows them; none if
    the peer does not know them). `on_progress(received, total)`: blocks so far. Blocks
    the peer sends cleared are kept as holes (`pull --peer` fills them from another
    peer); `clock`: when entries expire here (an expired payload is not stored).

    Issue 40: a peer that holds proof the feed forked, or a `witnesses` peer whose signed state
    cannot hold beside the source's, fails the clone with `Fork` before anything is copied; the
    proof is kept beside the would-be copy, in `PATH.fork-proof.json`.
    """
    key = address.key
    p = Path(path)
    kept = p.with_name(p.name + ".fork-proof.json")
    with FeedClient(address.target, tls=tls) as client:
        # fail before creating anything if the peer does not have it, or holds none of it
        info = client.info(key)
        found = peer_fork(key, info, address.target)
        if found is not None:
            raise fork_found(found, address.target, kept)
        state = wire.state_of(info.state)
        if state.length == 0:
            raise NotFound(f"{address.target}: holds no blocks of feed {key.hex()}")
        agreed = _witnessed(client, key, state, witnesses, tls, kept, address.target)
        # asked for before the copy is created (fsyncs): the peer builds its first message meanwhile;
        # should the create fail, closing the client ends the call
        responses = client.read(key, 0, state.length, with_roots=True, ahead=READ_AHEAD)
        before = set(os.listdir(p)) if p.is_dir() else None  # a directory of the user's (empty, or create refuses)
        feed = _replica(p, key, info, clock)
        try:
            check_remote(feed, state, address.target)
            atomic_write(p / REMOTE_FILE, json.dumps({"url": str(address)}).encode())
            n = _fetch(feed, client, state, address.target, _of_total(on_progress, state.length), responses)
            return Copied(n, feed.length, witnesses=agreed)
        except BaseException:
            empty = feed.length == 0
            feed.close()
            if empty and before is None:
                shutil.rmtree(p, ignore_errors=True)
            elif empty and before is not None:  # the directory was there before: only what this clone made goes
                for name in set(os.listdir(p)) - before:
                    child = p / name
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
            raise
        finally:
            feed.close()


def _replica(path: Path, key: bytes, info: pb.FeedInfo, clock: Clock | None) -> Feed:
    """A new replica keeping the writer's settings the peer reported (unsigned, so only shown, never enforced)."""
    try:
        return Feed.create_replica(path, key, timestamps=info.timestamps or None, ttl=info.ttl or None, clock=clock)
    except InvalidArgument:  # a peer's malformed report is not worth refusing the (verified) copy for
        return Feed.create_replica(path, key, clock=clock)


def _of_total(
    on_progress: Callable[[int, int], None] | None, total: int, start: int = 0
) -> Callable[[int], None] | None:
    if on_progress is None:
        return None
    return lambda n: on_progress(n, total - start)


def pull(
    path: str | os.PathLike[str],
    *,
    tls: Tls | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    peer: Address | None = None,
    clock: Clock | None = None,
    witnesses: Sequence[Address] = (),
) -> Copied:
    """Fetch, verify and store what the feed's origin has beyond our length; a fork is an error, not a no-op.

    Then fill the copy's holes (blocks that came cleared) with what the peer
    still serves (`fill_holes`). `peer`: pull from this peer instead of the
    origin (the same feed, any peer that hosts it: the signature decides what
    is kept). `on_progress(received, total)`: blocks received so far, of those to fetch. `clock`:
    when entries expire here (an expired payload is neither stored nor filled, issue 37).

    Issue 40: the peer's longer state must come with the consistency proof from ours (a continuation
    is checked, not trusted), and each of `witnesses` must agree with it; a fork is kept as a proof
    beside the copy (`forks.FORK_FILE`), and a copy holding one is never pulled again.
    """
    p = Path(path)
    held = forks.load(p)
    if held is not None:
        raise forks.fork_error(held, str(p), str(p / forks.FORK_FILE))
    origin = _remote(p)
    target = origin.target if peer is None else peer.target
    if peer is not None and peer.feed is not None and peer.key != origin.key:
        raise InvalidArgument(f"{peer} names another feed than this copy's ({origin.feed})")
    with Feed.open(p, clock=clock) as feed, FeedClient(target, tls=tls) as client:
        if feed.key != origin.key:
            raise Corruption(f"{p / REMOTE_FILE} names feed {origin.feed}, but this is {feed.key.hex()}")
        state = check_continuation(feed, client, target, keep=p)
        agreed = _witnessed(client, feed.key, state, witnesses, tls, p, target)
        n = 0
        if state.length > feed.length:
            n = _fetch(feed, client, state, target, _of_total(on_progress, state.length, feed.length))
        filled = fill_holes(feed, client, target, state.length)
        return Copied(n, feed.length, filled, feed.core.hole_count(1, feed.length), agreed)


def push(
    path: str | os.PathLike[str],
    address: Address,
    *,
    tls: Tls | None = None,
    token: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Copied:
    """Send the peer every signed batch it lacks (it checks each signature before storing).

    A peer takes a feed it does not host yet only from an authenticated client
    (`token`, or a client certificate in `tls`) unless it runs with --accept-new.
    A block the peer lacks that compaction cleared here cannot be sent (a peer
    stores whole blocks only): refused before anything is sent, so a failed push
    leaves nothing on the peer. `on_progress(sent, total)`: blocks the peer took.
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
        cleared = feed.core.first_cleared(remote, feed.length)
        if cleared is not None:
            raise InvalidArgument(
                f"cannot push to {address.target}: block {cleared} was cleared here (compacted, or it came "
                f"cleared) and the peer holds {remote} of the {feed.length} blocks (a peer stores whole blocks "
                f"only); nothing was sent. Push a feed before compacting it, or push from a copy that still "
                f"holds block {cleared}"
            )
        failed: list[FeedlogError] = []
        sent: collections.deque[tuple[int, bytes]] = collections.deque()  # each request's (end, signature)

        def requests() -> Iterator[pb.AppendRequest]:
            try:
                for request in _append_requests(feed, remote):
                    sent.append((request.expected_length + len(request.blocks), request.signature))
                    yield request
            except FeedlogError as e:  # gRPC would turn it into a bare cancellation
                failed.append(e)

        end = remote
        for st in client.append_stream(requests()):
            # an ack answers the oldest request not yet answered: its length and signature, or the peer lies
            want = sent.popleft() if sent else None
            if want is None or (st.length, st.signature) != want:
                said = f"length {st.length}" + ("" if want is None or st.length != want[0] else ", another signature")
                raise Corruption(
                    f"{address.target}: acknowledged {said} for "
                    + (f"the batch ending at {want[0]}" if want else "a batch it was never sent")
                )
            end = st.length
            if on_progress is not None:
                on_progress(end - remote, feed.length - remote)
        if failed:
            raise failed[0]
        if end < feed.length:  # the peer ended the stream without an error before taking everything
            raise Unavailable(
                f"{address.target}: stopped acknowledging at {end} of the {feed.length} blocks pushed; "
                "push again to send the rest"
            )
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
                request = _append_request(feed.key, pos - len(pending), pending, seg.state)
                if request.expected_length == 0 and feed.settings_known:
                    # the feed's first batch: the peer keeps the writer's settings to report them (info, clones)
                    request.timestamps = str(feed.settings.timestamps)
                    request.ttl = format_duration(feed.settings.ttl_ms) if feed.settings.ttl_ms else ""
                yield request
                pending = []


def _append_request(key: bytes, start: int, blocks: list[bytes], state: TreeState) -> pb.AppendRequest:
    return pb.AppendRequest(key=key, expected_length=start, blocks=blocks, signature=state.signature, fork=state.fork)
