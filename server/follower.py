"""Following a feed on another peer: download, verify, store, keep tailing, resume, serve onwards.

One thread per followed feed. It subscribes from the local length (so a
reconnect resumes where it stopped), stores each signed batch only once it
verifies, and wakes local subscribers, which makes multi-hop replication
(A -> B -> C) work with no extra code. A bad batch is rejected with an event
naming the peer and the blocks; verified data stays, and the follower retries
with capped exponential backoff, waiting at least `REJECTED_BACKOFF` after a
peer sent what does not verify (each retry costs a stream of the peer's choosing).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from feedlog.errors import Corruption, FeedlogError, Fork, InvalidArgument, NotFound
from feedlog.pb import feeds_pb2 as pb
from feedlog.replication.client import FeedClient, Subscription
from feedlog.replication.sync import check_remote, fill_holes, store_responses
from feedlog.replication.witness import judge
from feedlog.rpc import Address, Tls

from .events import event
from .host import FeedHost, HostedFeed

#: the shortest wait, in seconds, before reconnecting to a peer that sent blocks that do not verify: a hostile
#: upstream re-floods on every reconnect, so it gets one attempt a second at most, not ten
REJECTED_BACKOFF = 1.0


class Follower:
    def __init__(self, host: FeedHost, address: Address, *, tls: Tls | None = None, max_backoff: float = 5.0) -> None:
        self.host = host
        self.address = address
        self.key = address.key
        self.tls = tls
        self.max_backoff = max_backoff
        self.last_error: str | None = None
        self.rejections = 0
        # what the metrics read (server/metrics.py): the replica, the upstream's longest signed length
        # this follower has heard of, when it last stored a verified batch (monotonic), whether it is
        # subscribed now
        self.hosted: HostedFeed | None = None
        self.upstream_length = 0
        self.last_verified = time.monotonic()
        self.connected = False
        self._stop = threading.Event()
        self._sub: Subscription | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"follow-{self.key.hex()[:8]}", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def behind(self) -> int:
        """Entries the upstream signed, as far as this follower has heard, that it has not stored."""
        have = self.hosted.feed.length if self.hosted is not None else 0
        return max(0, self.upstream_length - have)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._lock:
            if self._sub is not None:
                self._sub.cancel()
        self._thread.join(timeout)

    def _hosted(self, info: pb.FeedInfo) -> HostedFeed:
        """The replica, created (if new) once the upstream first answers, keeping the writer's
        timestamp policy and TTL as it reports them, as a clone does (only shown, never enforced)."""
        try:
            return self.host.replica(self.key, info.timestamps, info.ttl)
        except InvalidArgument:  # malformed settings are not worth refusing verified blocks for
            return self.host.replica(self.key)

    def _run(self) -> None:
        try:
            hf: HostedFeed | None = self.host.get(self.key)  # followed before: resume it
        except NotFound:
            hf = None  # created when the upstream first answers (`_hosted`)
        peer, feed = self.address.target, self.key.hex()
        backoff = 0.1

        def length() -> int:
            return 0 if hf is None else hf.feed.length

        while not self._stop.is_set():
            if hf is not None and hf.fork is not None:  # issue 40: a feed proven forked is followed no further
                self.last_error = f"forked: {hf.fork.describe()}"
                event("follow_stopped", logging.WARNING, peer=peer, feed=feed, length=length(), error=self.last_error)
                return
            progressed = rejected = False

            def stored(hosted: HostedFeed, length: int) -> None:
                nonlocal progressed
                progressed = True
                self.last_verified = time.monotonic()
                self.upstream_length = max(self.upstream_length, length)
                hosted.notify()

            try:
                with FeedClient(peer, tls=self.tls) as client:
                    info = client.info(self.key, consistency_from=0 if hf is None else hf.feed.length)
                    if hf is None:
                        hf = self._hosted(info)
                    self.hosted = hf
                    self.upstream_length = max(self.upstream_length, info.state.length)
                    # a peer whose signed tree differs at a length we hold is a fork, not "nothing new";
                    # the roots at our length let store_responses catch one further on (issue 13 item 10).
                    # Issue 40: its longer state must come with the consistency proof from ours, and a
                    # fork found (or one the upstream holds) is kept as a proof and stops the follow
                    if info.HasField("consistency") and info.consistency.old_length != hf.feed.length:
                        info = client.info(self.key, consistency_from=hf.feed.length)  # ours was new
                    state, found = judge(
                        self.key, hf.feed.core.state, info, peer, node=hf.feed.core.node, need_proof=False
                    )
                    if found is not None:
                        hf.mark_forked(found, peer)
                        raise Fork(f"{peer}: {found.describe()}")
                    check_remote(hf.feed, state, peer)
                    # holes another upstream left (blocks it sent cleared) that this one may still serve
                    filled = fill_holes(hf.feed, client, peer, state.length)
                    if filled:
                        event("follow_filled", peer=peer, feed=feed, holes=filled)
                    sub = client.subscribe(self.key, hf.feed.length, with_roots=True)
                    with self._lock:
                        self._sub = sub
                    if self._stop.is_set():
                        sub.cancel()
                    self.connected = True
                    event("follow_connected", peer=peer, feed=feed, length=length())
                    store_responses(hf.feed, sub, peer, functools.partial(stored, hf), budget=client.budget)
            except Corruption as e:
                self.rejections += 1
                self.last_error = str(e)
                rejected = True
                event("follow_rejected", logging.WARNING, peer=peer, feed=feed, kept_length=length(), error=str(e))
            except FeedlogError as e:
                self.last_error = str(e)
                event("follow_disconnected", logging.INFO, peer=peer, feed=feed, length=length(), error=str(e))
            except Exception as e:  # a bug of ours met by hostile input: log it, keep the thread, retry later
                self.last_error = f"{type(e).__name__}: {e}"
                event("follow_failed", logging.ERROR, peer=peer, feed=feed, length=length(), error=self.last_error)
            finally:
                self.connected = False
                with self._lock:
                    self._sub = None
            if progressed:
                backoff = 0.1
            if rejected:  # even after verified blocks: the next attempt may be the same flood
                backoff = max(backoff, REJECTED_BACKOFF)
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2, self.max_backoff)
