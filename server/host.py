"""The feeds one peer hosts: a directory of feed directories, opened once, shared by every RPC.

    DATA/<name>/      a feed (any directory holding a `key` file is served)
    DATA/<key hex>/   feeds created here, pushed here or followed from another peer

Feeds whose secret key is here are *owned*: the peer signs server-side puts
for them through a group committer. The others are replicas, extended only by
batches their author signed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from feedlog.clock import Clock
from feedlog.errors import Corruption, FeedlogError, Fork, InvalidArgument, NotFound, ReadOnly, ResourceExhausted
from feedlog.log import entries, forks, merkle
from feedlog.log.core import KEY_FILE, check_batch
from feedlog.log.crypto import KeyPair, Verifier
from feedlog.log.feed import DEFAULT_TIMESTAMPS, Feed
from feedlog.log.timestamps import TimestampPolicy, parse_duration

from .events import event
from .group_commit import GroupCommitter

#: feeds a peer hosts at most before unauthenticated pushes stop creating more (`serve --max-feeds`):
#: each open feed holds ~3 file descriptors and its maps
DEFAULT_MAX_FEEDS = 1000


class CommitObserver(Protocol):
    """What a peer's metrics learn of each feed's writes (server/metrics.py `PeerMetrics`)."""

    def committed(self, entries: int, seconds: float) -> None: ...

    def fsynced(self, seconds: float) -> None: ...


class HostedFeed:
    def __init__(
        self, feed: Feed, observer: CommitObserver | None = None, changed: threading.Event | None = None
    ) -> None:
        self.feed = feed
        self.key = feed.key
        self.discovery_key = feed.discovery_key
        self._changed = threading.Condition()
        self._any_changed = changed  # the host's: wakes its gossip (issue 40)
        observe = observer.committed if observer is not None else None
        self.committer = GroupCommitter(feed, self.notify, observe=observe) if feed.core.can_sign else None
        if observer is not None:
            feed.core.on_fsync = observer.fsynced
        #: proof that the key signed two histories (issue 40): kept beside the feed; set, the peer
        #: refuses appends, follows and reads past its fork point
        self.fork: forks.ForkProof | None = None
        try:
            self.fork = forks.load(feed.core.path)
        except FeedlogError as e:  # a damaged or hand-made file proves nothing: said, then ignored
            event("fork_proof_ignored", feed=self.key.hex(), reason=str(e))

    def notify(self) -> None:
        """Wake every subscriber: the feed grew."""
        with self._changed:
            self._changed.notify_all()
        if self._any_changed is not None:
            self._any_changed.set()

    def mark_forked(self, proof: forks.ForkProof, source: str) -> bool:
        """Keep `proof` (verified under this feed's key first) and stop the feed at its fork point;
        False if a proof is held already. Never called with a proof that did not verify."""
        forks.verify(proof, self.key)
        with self._changed:
            if self.fork is not None:
                return False
            forks.keep(self.feed.core.path, proof)
            self.fork = proof
        event("feed_forked", feed=self.key.hex(), source=source, fork_point=proof.fork_point, proof=proof.describe())
        self.notify()
        return True

    def refuse_forked(self, end: int | None = None) -> None:
        """Fork (FAILED_PRECONDITION) if the feed is forked and `end` (None: any append or follow) passes
        the fork point."""
        fp = self.fork
        if fp is not None and (end is None or end > fp.fork_point):
            raise Fork(
                f"{fp.describe()}; this peer holds the proof and serves nothing past length {fp.fork_point} "
                "(GetInfo carries the proof)"
            )

    def wait_beyond(self, length: int, timeout: float) -> bool:
        """Block until the feed is longer than `length` (True) or `timeout` passes (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.feed.length > length, timeout)

    def committer_or_raise(self) -> GroupCommitter:
        if self.committer is None:
            raise ReadOnly(
                f"this peer does not hold the secret key of feed {self.key.hex()}: "
                "sign the batch yourself and use Append"
            )
        return self.committer

    def close(self) -> None:
        if self.committer is not None:
            self.committer.close()
        self.notify()
        self.feed.close()


class FeedHost:
    def __init__(
        self,
        root: str | Path,
        *,
        accept_new: bool = False,
        fsync: bool = True,
        max_feeds: int = DEFAULT_MAX_FEEDS,
        clock: Clock | None = None,
        observer: CommitObserver | None = None,
    ) -> None:
        self.root = Path(root)
        #: told of every feed's group commits and fsyncs (a peer's metrics), None: nobody
        self.observer = observer
        #: every hosted feed's clock: its timestamps, and when its entries expire (retention, issue 37)
        self.clock = clock
        self.accept_new = accept_new
        self.max_feeds = max_feeds  # a stranger's push creates a feed only while fewer are hosted
        self.fsync = fsync
        self._lock = threading.Lock()
        self._feeds: dict[bytes, HostedFeed] = {}
        self._by_dkey: dict[bytes, HostedFeed] = {}
        self.on_new: list[Callable[[HostedFeed], None]] = []
        #: set whenever a hosted feed grows or is marked forked (gossip waits on it, issue 40)
        self.changed = threading.Event()
        self.root.mkdir(parents=True, exist_ok=True)
        for d in sorted(self.root.iterdir()):
            # a dot name is a feed being built (or a build a crash abandoned): not a feed yet
            if d.name.startswith(".") or not (d / KEY_FILE).is_file():
                continue
            try:
                feed = Feed.open(d, clock=clock)
            except NotFound as e:  # e.g. an older version's interrupted create: nothing to serve
                event("feed_skipped", path=str(d), reason=str(e))
                continue
            self._add(feed)

    def _add(self, feed: Feed) -> HostedFeed:
        hf = HostedFeed(feed, self.observer, self.changed)
        self._feeds[hf.key] = hf
        self._by_dkey[hf.discovery_key] = hf
        event("feed_opened", feed=hf.key.hex(), length=feed.length, owned=hf.committer is not None)
        return hf

    def __len__(self) -> int:
        return len(self._feeds)

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._feeds)

    def feeds(self) -> list[HostedFeed]:
        with self._lock:
            return list(self._feeds.values())

    def get(self, key: bytes) -> HostedFeed:
        hf = self._feeds.get(key)
        if hf is None:
            raise NotFound(f"this peer does not host feed {key.hex()}")
        return hf

    def by_discovery_key(self, dkey: bytes) -> HostedFeed:
        hf = self._by_dkey.get(dkey)
        if hf is None:
            raise NotFound(f"this peer hosts no feed with discovery key {dkey.hex()}")
        return hf

    def replica(self, key: bytes, timestamps: str = "", ttl: str = "", limit: int | None = None) -> HostedFeed:
        """The hosted feed `key`, created empty if new (a follower's first step).

        `timestamps`/`ttl`: the writer's settings, if it said them (a push does), kept to report them.
        `limit`: a new feed only while fewer are hosted (a stranger's push), else ResourceExhausted.
        """
        with self._lock:
            if key in self._feeds:
                return self._feeds[key]
            if limit is not None and len(self._feeds) >= limit:
                raise self._full()
            replica = Feed.create_replica(
                self.root / key.hex(),
                key,
                fsync=self.fsync,
                timestamps=timestamps or None,
                ttl=ttl or None,
                clock=self.clock,
            )
            hf = self._add(replica)
        event("feed_created", feed=key.hex(), owned=False)
        return hf

    def accept(
        self,
        key: bytes,
        blocks: list[bytes],
        signature: bytes,
        fork: int,
        *,
        authorized: bool = False,
        stranger: bool = True,
        timestamps: str = "",
        ttl: str = "",
    ) -> HostedFeed:
        """A signed append at length 0 to a feed not hosted yet: checked *before* anything is created.

        `authorized`: the caller already applied the peer's creation policy (server/auth.py);
        otherwise only a host made with accept_new takes new feeds. `stranger`: the caller has no
        credentials; its push creates a feed only while this peer hosts fewer than `max_feeds`
        (each hosted feed holds open files and disk for as long as the peer runs).
        """
        if not (self.accept_new or authorized):
            raise NotFound(f"this peer does not host feed {key.hex()} and does not accept new feeds")
        if stranger and len(self._feeds) >= self.max_feeds:
            raise self._full()  # before the work of checking the batch; checked again as it is created
        if not blocks:
            raise InvalidArgument("cannot append an empty batch")
        check_batch(0, blocks)
        merkle.signed_append([], 0, blocks, signature, fork, Verifier(key))
        try:
            content_type = entries.decode_header(blocks[0])
        except Corruption as e:
            raise InvalidArgument(f"a new feed must start with its header block: {e}") from None
        entries.scan_blocks(content_type, 0, blocks, strict=True)
        if timestamps:  # malformed settings are refused like any malformed field, before anything exists
            TimestampPolicy.parse(timestamps)
        if ttl:
            parse_duration(ttl)
        return self.replica(key, timestamps, ttl, self.max_feeds if stranger else None)

    def _full(self) -> ResourceExhausted:
        return ResourceExhausted(
            f"this peer hosts {len(self._feeds)} feeds, as many as it takes from unauthenticated pushes "
            f"(serve --max-feeds {self.max_feeds}); push with a write token, or to another peer",
            retry_after=60.0,
        )

    def create(self, content_type: str, timestamps: str, ttl: str | None) -> HostedFeed:
        """A new feed owned by this peer (it generates and keeps the key pair)."""
        kp = KeyPair.generate()
        feed = Feed.create(
            self.root / kp.public_key.hex(),
            content_type=content_type or entries.ENTRY,
            timestamps=timestamps or DEFAULT_TIMESTAMPS,
            ttl=ttl or None,
            fsync=self.fsync,
            key_pair=kp,
            clock=self.clock,
        )
        with self._lock:
            hf = self._add(feed)
        event("feed_created", feed=hf.key.hex(), owned=True, type=feed.content_type)
        return hf

    def close(self) -> None:
        with self._lock:
            feeds = list(self._feeds.values())
            self._feeds.clear()
            self._by_dkey.clear()
        for hf in feeds:
            hf.close()
