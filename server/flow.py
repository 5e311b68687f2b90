"""Flow control for response streams: what a peer holds for readers is bounded per stream and in total.

Per stream, grpc's sync server already waits: it pulls the next message from a
response generator only once the previous one was handed to the transport
(`_send_response` blocks on the send operation), so a stream whose reader stops
holds one built message, never the feed. What was sent sits in the socket and
the reader's receive window, not here.

In total, every message a stream builds first reserves its size from one
`InFlight` budget and gives it back when the generator is resumed (the message
was taken) or closed. When the budget is spent, streams wait for it, and a
holder that has not had its message taken for `stall` seconds while others wait
is cancelled: a reader that stops reading blocks only its own stream, and only
for so long.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from feedlog.errors import Unavailable

from .events import event

DEFAULT_IN_FLIGHT_BYTES = 48 << 20  # three 16 MiB messages, or 48 readers of 1 MiB
DEFAULT_STALL_SECONDS = 30.0
WAIT_SLICE = 0.5  # how often a waiting stream checks that its client and the server are still there


@dataclass(slots=True)
class Hold:
    """Bytes one stream reserved for the message it is building or sending."""

    n: int
    context: grpc.ServicerContext
    since: float = field(default_factory=time.monotonic)
    evicted: bool = False


class InFlight:
    def __init__(
        self,
        limit: int = DEFAULT_IN_FLIGHT_BYTES,
        *,
        stall: float = DEFAULT_STALL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.stall = stall
        self._clock = clock
        self._cond = threading.Condition()
        self._used = 0
        self._ids = itertools.count()
        self._holds: dict[int, Hold] = {}

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

    @contextmanager
    def hold(self, n: int, context: grpc.ServicerContext, stopping: threading.Event) -> Iterator[Hold]:
        """Reserve `n` bytes (all of the budget at most) for the body of the `with`; wait while they are not there.

        Raises Unavailable if the server stops while waiting; ends the caller's
        stream (GeneratorExit through the caller) if its client goes away.
        """
        n = min(n, self.limit)
        with self._cond:
            while self._used + n > self.limit:
                if stopping.is_set():
                    raise Unavailable("the peer is shutting down; reconnect to it or another peer")
                if not context.is_active():
                    raise Unavailable("the reader went away")
                self._evict_stalled(n)
                self._cond.wait(WAIT_SLICE)
            key = next(self._ids)
            h = Hold(n, context, self._clock())
            self._holds[key] = h
            self._used += n
        try:
            yield h
        finally:
            with self._cond:
                if self._holds.pop(key, None) is not None:
                    self._used -= h.n
                    self._cond.notify_all()

    def shrink(self, h: Hold, n: int) -> None:
        """The message came out at `n` bytes: give back the rest of what was reserved."""
        with self._cond:
            if n < h.n and not h.evicted:
                self._used -= h.n - n
                h.n = n
                self._cond.notify_all()

    def _evict_stalled(self, n: int) -> None:
        """Make room for `n` bytes by cancelling holders, oldest first, whose message was not taken for `stall` s.

        Called with the lock. Only as many as needed: a reader that stalls
        while nobody else needs the memory keeps its stream.
        """
        now = self._clock()
        # bytes held by messages younger than `stall` come back as their readers take them: count them
        # as free, so that a reader waiting for its own previous message to go out (or for any moving
        # reader's) does not cancel a stalled one it does not need to (seen under load: two cancelled)
        young = sum(h.n for h in self._holds.values() if now - h.since < self.stall)
        for key, h in sorted(self._holds.items(), key=lambda kv: kv[1].since):
            if self._used - young + n <= self.limit or now - h.since < self.stall:
                return
            del self._holds[key]
            self._used -= h.n
            h.evicted = True
            event("stalled_reader_cancelled", peer=h.context.peer(), held=h.n, seconds=round(now - h.since, 1))
            h.context.cancel()  # wakes grpc's blocked send; the stream's generator is then closed
