"""`feedlog ingest --stream --engine local`: follow every source's live tail into the table, no JVM.

    stream_here(sources, ref, sink_options, StreamSettings(trigger_ms=100), starts=landed(ref, sources))

A follower thread per source reads its new signed batches as they appear: a peer's live tail
(the `Subscribe` call `feedlog tail` uses), a local feed directory's signed length polled every
`POLL_MS` through one open core. Every block is verified against the feed's signed tree on the way
in (`replication.verify`, as the batch path verifies), and only verified batches are handed on,
into one bounded inbox (a follower waits while it is full: memory is bounded whatever the rate).

The loop cuts a micro-batch at each processing-time trigger (`trigger_ms`; 0: as soon as anything
is held), or as soon as `max_entries_per_trigger` entries are held, and lands it through the
sink's own pieces: `SinkConfig.write` (Parquet files with stats) and `SinkConfig.commit` (one
commit through the table's owner, one txn claim per feed: appId `feedlog:<key>`, version the seq
after the last row). That claim is the whole of the stream's progress: a restart reads where each
feed stopped from the table (`ingest.landed`) and follows on from there, so a kill -9 at any point
loses nothing (the peer still holds every acknowledged entry) and duplicates nothing (a claim on
seqs the table holds is refused or skipped, never landed twice). No checkpoint directory.

A peer that goes away is reconnected to with a doubling delay up to `reconnect_max_s`, for as long
as the stream runs, while the other sources keep landing; what it lacks is read once it is back. A
block that does not verify (or any error that would recur) stops the stream with that error.

`StreamStats` is what the running stream has done (entries, bytes and commits landed, each
commit's freshness samples, how far behind each source is), for progress lines and for a metrics
endpoint to observe (`StreamStats.listen`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..clock import Clock, SystemClock
from ..errors import Conflict, FeedlogError, InvalidArgument
from ..log.core import Core
from ..log.entries import decode_header
from ..replication.client import FeedClient, Subscription
from ..replication.verify import Verified
from .feeds import FeedSource
from .rows import build_rows
from .sink import FilesWritten, SinkConfig, TableRef
from .source import FIRST_SEQ

Progress = Callable[[str], None]

#: the local engine's default processing-time trigger: a commit at most every 100 ms, so a row is
#: visible about 50 ms + a commit after its put on average (Spark's engine keeps its 1 s default)
DEFAULT_TRIGGER_MS = 100
#: how often a local feed directory's signed length is looked at (an fstat of its log)
POLL_MS = 10
#: entries the followers may hold before the loop takes them (each follower waits beyond it)
MAX_HELD_ENTRIES = 200_000
#: and bytes of blocks (a block may be 8 MiB: 200,000 of them would be a catch-up's tens of GB);
#: one signed batch more may arrive past it (a peer's message is bounded by the reader's budget)
MAX_HELD_BYTES = 256 << 20
#: the first and the longest wait before reconnecting to a peer that went away
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
#: a micro-batch whose write or commit fails with an error that may pass is written and committed
#: again this many times in all (new files each time: the failed attempt's are removed unless a
#: commit may hold them), with the reconnect delays between; then the stream stops with the error
LAND_ATTEMPTS = 5
#: seconds between the stream's progress lines (a stream runs for months: not a line per commit)
REPORT_EVERY_S = 10.0


@dataclass(frozen=True)
class StreamSettings:
    """How a local stream runs (plain values; the CLI's flags)."""

    #: processing-time trigger: a micro-batch at most every this many ms (0: as fast as possible)
    trigger_ms: int = DEFAULT_TRIGGER_MS
    #: cut a micro-batch as soon as this many entries are held (rounded up to a signed batch)
    max_entries_per_trigger: int | None = None
    #: land what the sources hold when the stream starts, then stop
    available_now: bool = False
    #: stop after this many seconds (None: until stopped)
    timeout_s: float | None = None
    reconnect_max_s: float = RECONNECT_MAX_S
    max_held_entries: int = MAX_HELD_ENTRIES
    max_held_bytes: int = MAX_HELD_BYTES
    poll_ms: int = POLL_MS

    def check(self) -> None:
        if self.trigger_ms < 0:
            raise InvalidArgument(f"the trigger must be >= 0 ms, got {self.trigger_ms}")
        if self.max_entries_per_trigger is not None and self.max_entries_per_trigger < 1:
            raise InvalidArgument(f"--max-entries-per-trigger must be >= 1, got {self.max_entries_per_trigger}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InvalidArgument("the timeout must be greater than zero")
        if self.max_held_entries < 1 or self.max_held_bytes < 1 or self.poll_ms < 1 or self.reconnect_max_s <= 0:
            raise InvalidArgument("max_held_entries, max_held_bytes, poll_ms and reconnect_max_s must be positive")


def next_tick(t0: float, every_s: float, now: float) -> float:
    """The first trigger time after `now` of a processing-time trigger started at `t0` (Spark's
    ProcessingTimeExecutor: ticks at t0 + k * interval; a batch that overran its tick is followed by
    the next tick, not by a burst of the ticks it missed). 0 s: `now` (no wait)."""
    if every_s <= 0:
        return now
    return t0 + every_s * (math.floor((now - t0) / every_s) + 1)


@dataclass(frozen=True)
class Landed:
    """One micro-batch landed (or found landed already: `version` None)."""

    batch: int
    version: int | None
    entries: int
    #: block bytes landed
    bytes: int
    #: write + commit, seconds
    seconds: float
    #: per feed (key hex): the seq after the last row landed
    ends: Mapping[str, int]
    #: the commit's time minus each landed entry's writer timestamp, ms (entries that carry one)
    freshness_ms: np.ndarray[Any, np.dtype[np.int64]] = field(repr=False, compare=False)
    #: bytes of the data files committed (what Delta's numOutputBytes counts)
    file_bytes: int = 0
    #: the commit's in-commit timestamp (ms), else when it was made by this process's clock
    committed_ms: int | None = None


class StreamStats:
    """What a running stream has done, read from any thread (a metrics endpoint, a progress line).

    Counters only grow; `behind` is per source spec: the newest signed length seen minus where the
    table's rows end (entries waiting to land). `listen(fn)` calls `fn(Landed)` after each commit,
    in the stream's thread (keep it quick)."""

    def __init__(self) -> None:
        self.entries = 0
        self.bytes = 0
        self.commits = 0
        self.version: int | None = None
        self.reconnects: dict[str, int] = {}
        self.last_error: dict[str, str] = {}
        self.maintenance_passes = 0
        self.seen: dict[str, int] = {}
        self.landed: dict[str, int] = {}
        self._specs: dict[str, str] = {}  # key hex -> spec
        self._listeners: list[Callable[[Landed], None]] = []
        self._lock = threading.Lock()

    def listen(self, fn: Callable[[Landed], None]) -> None:
        self._listeners.append(fn)

    @property
    def behind(self) -> dict[str, int]:
        with self._lock:
            return {
                spec: max(self.seen.get(k, 0) - self.landed.get(k, FIRST_SEQ), 0) for k, spec in self._specs.items()
            }

    def behind_by_key(self) -> dict[str, int]:
        """`behind` per feed key (hex) rather than per source spec."""
        with self._lock:
            return {k: max(self.seen.get(k, 0) - self.landed.get(k, FIRST_SEQ), 0) for k in self._specs}

    def _source(self, source: FeedSource, start: int) -> None:
        with self._lock:
            self._specs[source.key_hex] = source.spec
            self.landed[source.key_hex] = start
            self.seen.setdefault(source.key_hex, start)

    def _seen(self, key_hex: str, length: int) -> None:
        with self._lock:
            self.seen[key_hex] = max(self.seen.get(key_hex, 0), length)

    def _reconnect(self, spec: str, error: BaseException) -> None:
        with self._lock:
            self.reconnects[spec] = self.reconnects.get(spec, 0) + 1
            self.last_error[spec] = str(error)

    def _landed(self, landed: Landed) -> None:
        with self._lock:
            self.entries += landed.entries
            self.bytes += landed.bytes
            if landed.version is not None:
                self.commits += 1
                self.version = landed.version
            for k, end in landed.ends.items():
                self.landed[k] = max(self.landed.get(k, FIRST_SEQ), end)
        for fn in self._listeners:
            fn(landed)


@dataclass(frozen=True)
class _Feed:
    """What rows of a feed need besides its blocks: its header (block 0, verified) and content type."""

    key_hex: str
    content_type: str
    header: bytes


class _Inbox:
    """Verified batches from the followers, in arrival order (each feed's in seq order), bounded."""

    def __init__(self, max_entries: int, stop: threading.Event, max_bytes: int = MAX_HELD_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.stop = stop
        self.cond = threading.Condition()
        self.items: deque[tuple[_Feed, Verified]] = deque()
        self.held = 0
        self.held_bytes = 0
        self.error: BaseException | None = None

    def put(self, feed: _Feed, batch: Verified) -> bool:
        """Hold `batch` (waiting while full); False if the stream is stopping."""
        with self.cond:
            while (self.held >= self.max_entries or self.held_bytes >= self.max_bytes) and not self.stop.is_set():
                self.cond.wait(0.1)
            if self.stop.is_set():
                return False
            self.items.append((feed, batch))
            self.held += len(batch.blocks)
            self.held_bytes += _size(batch)
            self.cond.notify_all()
            return True

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()

    def poke(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait(self, timeout: float, min_held: float) -> None:
        """Until `min_held` entries are held, an error, a poke, or `timeout` s."""
        with self.cond:
            if self.held < min_held and self.error is None and timeout > 0:
                self.cond.wait(timeout)

    def take(self, limit: int | None) -> list[tuple[_Feed, Verified]]:
        """What is held, up to the batch that reaches `limit` entries (whole signed batches)."""
        out: list[tuple[_Feed, Verified]] = []
        with self.cond:
            n = size = 0
            while self.items and (limit is None or n < limit):
                feed, batch = self.items.popleft()
                out.append((feed, batch))
                n += len(batch.blocks)
                size += _size(batch)
            self.held -= n
            self.held_bytes -= size
            self.cond.notify_all()
        return out


def _size(batch: Verified) -> int:
    return sum(len(b) for b in batch.blocks if b is not None)


class _Follower:
    """One source's new signed batches into the inbox, from `start` (to `end`, or live), reconnecting."""

    def __init__(
        self,
        source: FeedSource,
        start: int,
        end: int | None,
        inbox: _Inbox,
        stats: StreamStats,
        settings: StreamSettings,
    ) -> None:
        self.source = source
        self.pos = start
        self.end = end
        self.inbox = inbox
        self.stats = stats
        self.settings = settings
        self.stop = inbox.stop
        self.feed: _Feed | None = None
        self.done = False
        self._sub: Subscription | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"feedlog-follow-{source.key_hex[:8]}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        """End a live tail under way (from the stream's thread, when it stops)."""
        with self._lock:
            if self._sub is not None:
                self._sub.cancel()

    def _run(self) -> None:
        delay = RECONNECT_FIRST_S
        try:
            while not self.stop.is_set() and (self.end is None or self.pos < self.end):
                try:
                    if self._follow():
                        delay = RECONNECT_FIRST_S  # it delivered: the next break starts the backoff anew
                except FeedlogError as e:
                    if not e.retryable:
                        raise
                    self.stats._reconnect(self.source.spec, e)
                if self.end is not None and self.pos >= self.end:
                    break
                self.stop.wait(delay)  # a peer that ended the tail or went away: back after a while
                delay = min(delay * 2, self.settings.reconnect_max_s)
        except BaseException as e:
            self.inbox.fail(e)
        finally:
            self.done = True
            self.inbox.poke()

    def _follow(self) -> bool:
        """Follow until the source ends the read or the stream stops; whether any batch came."""
        got = False
        for batch in self._batches():
            if self.feed is None:
                self.feed = self._describe()
            if not self.inbox.put(self.feed, batch):
                return got
            self.pos = batch.start + len(batch.blocks)
            self.stats._seen(self.source.key_hex, batch.state.length)
            got = True
        return got

    def _describe(self) -> _Feed:
        header = self.source.header()  # block 0, verified against the signed tree
        return _Feed(self.source.key_hex, decode_header(header), header)

    def _batches(self) -> Iterator[Verified]:
        if self.source.path is not None:
            yield from self._directory()
        elif self.end is not None:
            yield from self.source.read(self.pos, self.end)
        else:
            yield from self._tail()

    def _directory(self) -> Iterator[Verified]:
        """A local feed: its signed length looked at every `poll_ms` through one open core (an fstat
        of the log while nothing is new), new blocks read and verified through it."""
        assert self.source.path is not None
        core = Core.open(self.source.path, writable=False)
        try:
            while not self.stop.is_set():
                core.refresh()
                length = core.length if self.end is None else min(core.length, self.end)
                self.stats._seen(self.source.key_hex, core.length)
                if length > self.pos:
                    yield from self.source.read_core(core, self.pos, length)
                if self.end is not None and self.pos >= self.end:
                    return
                self.stop.wait(self.settings.poll_ms / 1000)
        finally:
            core.close()

    def _tail(self) -> Iterator[Verified]:
        """A peer's live tail from `pos`, every block verified (`Subscription.verified`)."""
        assert self.source.target is not None
        key = self.source.key
        with FeedClient(self.source.target) as client:
            if self.feed is None and client.info(key).state.length == 0:
                return  # an empty feed has no header to describe its rows yet: looked at again shortly
            sub = client.subscribe(key, self.pos, with_roots=True)
            with self._lock:
                self._sub = sub
            try:
                if self.stop.is_set():
                    return
                yield from sub.verified(key, self.pos)
            finally:
                with self._lock:
                    self._sub = None
                sub.cancel()


class LocalStream:
    """The stream: followers, the trigger loop, the commits. `run()` blocks until it ends."""

    def __init__(
        self,
        sources: Sequence[FeedSource],
        ref: TableRef,
        config: SinkConfig,
        starts: Mapping[str, int],
        settings: StreamSettings,
        *,
        stats: StreamStats | None = None,
        progress: Progress = print,
        clock: Clock | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        settings.check()
        self.sources = list(sources)
        self.ref = ref
        self.config = config
        self.settings = settings
        self.stats = stats or StreamStats()
        self.progress = progress
        self.clock = clock or SystemClock()
        self.stop = stop or threading.Event()
        self.inbox = _Inbox(settings.max_held_entries, self.stop, settings.max_held_bytes)
        self.batch = 0
        ends = _targets(self.sources) if settings.available_now else {}
        self.followers = []
        for s in self.sources:
            start = starts.get(s.key_hex, FIRST_SEQ)
            self.stats._source(s, start)
            self.followers.append(_Follower(s, start, ends.get(s.key_hex), self.inbox, self.stats, settings))

    def run(self, check: Callable[[], None] = lambda: None) -> None:
        """Land micro-batches until stopped, the timeout, or (available now) caught up; `check` is
        called every turn and may raise to end the stream (the maintenance thread's failure)."""
        s = self.settings
        every = s.trigger_ms / 1000
        limit = s.max_entries_per_trigger
        t0 = time.monotonic()
        deadline = None if s.timeout_s is None else t0 + s.timeout_s
        tick = next_tick(t0, every, t0)
        last_report = t0
        for f in self.followers:
            f.start()
        try:
            while not self.stop.is_set():
                check()
                if self.inbox.error is not None:
                    raise self.inbox.error
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return
                held = self.inbox.held
                finished = s.available_now and all(f.done for f in self.followers)
                if held and (every == 0 or now >= tick or (limit is not None and held >= limit) or finished):
                    self._land(self.inbox.take(limit))
                    tick = next_tick(t0, every, time.monotonic())
                    if time.monotonic() - last_report >= REPORT_EVERY_S:
                        last_report = time.monotonic()
                        self.progress(self.summary())
                    continue
                if finished:
                    return
                if now >= tick:
                    tick = next_tick(t0, every, now)
                # nothing held: wake on the first arrival; held: at the tick (or once `limit` are held)
                wake = (tick if held else now + 0.5) if every else now + 0.5
                if deadline is not None:
                    wake = min(wake, deadline)
                self.inbox.wait(wake - now, (limit or math.inf) if held else 1)
        finally:
            self.stop.set()
            for f in self.followers:
                f.cancel()
            self.inbox.poke()
            for f in self.followers:
                f.thread.join(timeout=10)

    def summary(self) -> str:
        st = self.stats
        behind = sum(st.behind.values())
        return (
            f"landed {st.entries:,} entries in {st.commits:,} commits (version {st.version}); "
            f"{behind:,} entries behind the sources"
        )

    def _land(self, items: list[tuple[_Feed, Verified]]) -> None:
        """One micro-batch: rows per feed, Parquet files, one commit claiming each feed's seqs."""
        by_feed: dict[str, tuple[_Feed, list[Verified]]] = {}
        for feed, batch in items:
            by_feed.setdefault(feed.key_hex, (feed, []))[1].append(batch)
        rows = [build_rows(f.key_hex, f.content_type, f.header, vs) for f, vs in by_feed.values()]
        entries = sum(len(r) for r in rows)
        size = sum(len(b) for _, v in items for b in v.blocks if b is not None)
        ends = {k: vs[-1].start + len(vs[-1].blocks) for k, (_, vs) in by_feed.items()}
        self.batch += 1
        t0 = time.monotonic()
        delay = RECONNECT_FIRST_S
        for attempt in range(LAND_ATTEMPTS):
            written: FilesWritten | None = None
            try:
                written = self.config.write(iter(rows))
                result = self.config.commit([written], batch_id=self.batch)
                break
            except FeedlogError as e:
                if written is not None and not isinstance(e, Conflict):
                    self._abort(written, e)  # (a Conflict's commit removed its files itself)
                if not e.retryable or isinstance(e, Conflict) or attempt + 1 == LAND_ATTEMPTS:
                    raise
                self.progress(f"landing failed ({e}); trying again in {delay:.1f}s")
                if self.stop.wait(delay):
                    raise
                delay = min(delay * 2, self.settings.reconnect_max_s)
        now_us = self.clock.now_ms() * 1000
        fresh = np.zeros(0, np.int64)
        for r in rows:
            ts = r.column("timestamp").cast(pa.int64())
            if ts.null_count:
                ts = ts.drop_null()
            fresh = np.concatenate([fresh, (now_us - ts.to_numpy(zero_copy_only=False)) // 1000])
        version = result.version if result is not None else None  # None: the table held these already
        files = sum(int(d.get("size", 0)) for d in written.adds) if written is not None else 0
        when = result.in_commit_timestamp if result is not None and result.in_commit_timestamp else now_us // 1000
        self.stats._landed(Landed(self.batch, version, entries, size, time.monotonic() - t0, ends, fresh, files, when))

    def _abort(self, written: FilesWritten, error: BaseException) -> None:
        try:
            self.config.abort([written])
        except Exception as e:
            error.add_note(f"(the micro-batch's files were not removed: {e}; vacuum removes them)")


def _targets(sources: Sequence[FeedSource]) -> dict[str, int]:
    """Each feed's signed length now: where an available-now stream stops."""
    return {s.key_hex: s.signed_length() for s in sources}


def stream_here(
    sources: Sequence[FeedSource],
    ref: TableRef,
    sink_options: Mapping[str, str],
    settings: StreamSettings,
    *,
    starts: Mapping[str, int],
    stats: StreamStats | None = None,
    progress: Progress = print,
    stop: threading.Event | None = None,
    check: Callable[[], None] = lambda: None,
) -> StreamStats:
    """Stream `sources` into the table `ref` in this process (see the module's text) from `starts`
    (`ingest.landed`: each feed's txn marker) until stopped (`stop`, Ctrl-C), the timeout, or caught
    up (available now). `sink_options` are the feedlog-delta sink's (owner, token, storage); the
    table is created if missing. Returns the stream's stats."""
    from pyspark.sql.pandas.types import from_arrow_schema  # types only: no JVM starts

    from .rows import SCHEMA

    config = SinkConfig.prepare(
        {**sink_options, "path": ref.path}, from_arrow_schema(SCHEMA), overwrite=False, streaming=False, ref=ref
    )
    stream = LocalStream(sources, ref, config, starts, settings, stats=stats, progress=progress, stop=stop)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            stream.run(check)
        except KeyboardInterrupt:
            progress("stopping the stream...")
            raise
    return stream.stats
