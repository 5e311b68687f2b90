"""Injected time (SlateDB's `Clock`): nothing else in feedlog reads the system clock.

`MonotonicClock` wraps any clock so the readings feedlog uses never go
backwards, seeded on open from the largest timestamp already persisted. The
system clock may step back (NTP): readings are held at the last value. A
custom clock that goes backwards is a bug in the caller and raises instead of
silently writing out-of-order timestamps.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from .errors import InvalidArgument


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, UTC."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests set by hand."""

    def __init__(self, now_ms: int = 0) -> None:
        self._now = now_ms

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        self._now = now_ms

    def advance(self, ms: int) -> None:
        self._now += ms


class ClockWentBackwards(InvalidArgument):
    """A custom clock returned a reading below one already used."""


class MonotonicClock:
    def __init__(self, inner: Clock, seed_ms: int = 0) -> None:
        self.inner = inner
        self._last = seed_ms
        self._strict = not isinstance(inner, SystemClock)
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            tick = self.inner.now_ms()
            if tick < self._last:
                if self._strict:
                    raise ClockWentBackwards(
                        f"clock went backwards: {tick} ms after {self._last} ms (already used or persisted)"
                    )
                tick = self._last
            self._last = tick
            return tick
