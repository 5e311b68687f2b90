"""A peer's scheduled compaction: every feed it hosts or follows forgets expired payloads on its own.

One thread per server (issue 37, "Peers forget on their own"). Every
`every` seconds it walks each hosted feed in steps of `step` entries
(`Feed.compact_step`): expired payloads are cleared, Merkle nodes kept, as
`feedlog compact` does. A step holds the feed's lock only while it clears,
so puts and reads interleave with a compaction of any size, and the thread
yields between steps. Serving never waits for it: a peer sends an expired
block as cleared from the moment it expires (service.withheld), so the
schedule only bounds how long its bytes stay on this disk: at most `every`
(plus one pass) past its `expires_at`.

A pass reads only what may have expired since the last one: for each whole
step it remembers when the earliest entry it kept expires (`Feed.compact_step`),
and skips the step until then; a feed without TTLs is read once, then only its
new entries. A rule that drops payloads for another reason than expiry must
make the plan look again (as filling holes does, `Feed.fills`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from feedlog.errors import FeedlogError

from .events import event
from .host import FeedHost

#: the default schedule (`serve --compact-every`): a minute is Kafka's log.retention.check.interval's
#: scale divided by five (5 min there) — an expired payload is on this disk at most a minute past its
#: expiry plus a pass, and a pass of an idle feed costs one read of its blocks per minute
DEFAULT_EVERY_S = 60.0
#: entries per step: read (unchecked, `Core.blocks`) and judged in a few ms of GIL. Measured with
#: tools/bench/bench_peer_compact.py (1M entries, 10% expired, 4 clients putting meanwhile): steps of
#: 4,096 put a put's p99 at 3-4x idle, steps of 1,024 at 1.8x, for ~100k entries/s
STEP = 1024
#: payloads found are cleared once this many are (or the feed's pass ends): a clear costs two fdatasyncs
#: and holds the feed's lock only to mark them in the index; clearing 4,096 at once made the fdatasync
#: that a put waits behind long enough to put its p99 at 3-4x idle
CLEAR_BATCH = 128
#: how long the thread gives way between steps, so a put waiting for the GIL or the lock gets it
PAUSE_S = 0.002


@dataclass(frozen=True, slots=True)
class PassReport:
    feeds: int
    entries: int  # entries read (steps taken, in entries)
    skipped: int  # entries not read: nothing in their step expires yet
    cleared: int
    bytes_cleared: int
    seconds: float


@dataclass(slots=True)
class Totals:
    """What every pass so far did, added up (the metrics read it: server/metrics.py)."""

    entries: int = 0
    skipped: int = 0
    cleared: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, r: PassReport) -> None:
        self.entries += r.entries
        self.skipped += r.skipped
        self.cleared += r.cleared
        self.bytes += r.bytes_cleared
        self.seconds += r.seconds


@dataclass(slots=True)
class _Plan:
    """One feed's schedule: for each whole step already compacted, when its earliest kept entry
    expires (None: never), so a pass reads only the steps with something due, and the feed's tail."""

    fills: int
    due: list[int | None] = field(default_factory=list)


class Compactor:
    def __init__(self, host: FeedHost, every_s: float, *, step: int = STEP, pause_s: float = PAUSE_S) -> None:
        self.host = host
        self.every_s = every_s
        self.step = step
        self.pause_s = pause_s
        self.passes = 0
        self.last: PassReport | None = None
        self.totals = Totals()
        self._plans: dict[bytes, _Plan] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compact", daemon=True)

    def start(self) -> Compactor:
        if self.every_s > 0:
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.run_once()
            except Exception as e:  # a bug or a disk error: logged, the next pass tries again
                event("compact_failed", logging.ERROR, error=f"{type(e).__name__}: {e}")

    def run_once(self) -> PassReport:
        """One pass over every hosted feed (what the thread runs each `every_s`)."""
        began = time.monotonic()
        feeds = read = skipped = cleared = size = 0
        for hf in self.host.feeds():
            feed = hf.feed
            plan = self._plans.get(hf.key)
            if plan is None or plan.fills != feed.fills:  # new, or holes were filled: look at everything again
                plan = self._plans[hf.key] = _Plan(feed.fills)
            i = 0
            victims: list[int] = []
            try:
                while i * self.step < feed.length and not self._stop.is_set():
                    pos = i * self.step
                    due = plan.due[i] if i < len(plan.due) else 0
                    if due is None or due >= feed.clock.now_ms():  # `keeps` refuses strictly after expires_at
                        skipped += min(self.step, feed.length - pos)
                        i += 1
                        continue
                    step = feed.compact_step(pos, self.step, clear=False)
                    read += step.end - pos
                    size += step.bytes_cleared
                    victims += step.victims
                    if len(victims) >= CLEAR_BATCH:
                        cleared += feed.core.clear(victims)
                        victims = []
                    if step.end == pos + self.step:  # a whole step: remembered (the tail is read every pass)
                        if i < len(plan.due):
                            plan.due[i] = step.next_expiry
                        else:
                            plan.due.append(step.next_expiry)
                    i += 1
                    if self.pause_s:
                        self._stop.wait(self.pause_s)
                if victims:
                    cleared += feed.core.clear(victims)
            except FeedlogError as e:  # e.g. a feed closed as the server stops, a corrupt block: the next pass
                self._plans.pop(hf.key, None)  # whatever this pass found and did not clear is looked at again
                event("compact_failed", logging.WARNING, feed=hf.key.hex(), at=i * self.step, error=str(e))
            feeds += 1
        self.last = PassReport(feeds, read, skipped, cleared, size, time.monotonic() - began)
        self.totals.add(self.last)
        self.passes += 1
        if cleared:
            event("compacted", feeds=feeds, entries=read, cleared=cleared, bytes=size, seconds=self.last.seconds)
        return self.last
