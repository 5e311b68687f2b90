"""Turns: writers racing for one table's next version commit in the order they lost, not by luck.

Optimistic commits alone favour whoever just won: its next transaction starts from
the newest state while the losers are still reading the winners and staging
again. Measured with 8 writer processes on one managed table: 7 attempts per
commit, the owner answering ~1,000 requests/s to ratify ~110 commits/s, p99
330 ms, and a writer losing 33 races in a row (on a filesystem table, with no
owner to arbitrate, one gave up after 100).

So the owner keeps a line per contended table. A writer names its transaction
with a `turn` (the same opaque id on every attempt). When it loses a race, it
gets the table's turn if nobody holds it or waits for it; otherwise its next
request waits in the owner, in line, until the turn is its own, and is then
answered with the winners to rebase on. Only the holder's request for the next
version is ratified meanwhile: the others wait, and one that passed the line
before the turn was given is refused where the version is decided
(`held_for_another`, retryable). Writers thus take turns, and those in line use
no CPU and send no requests.

Turns overlap in pairs (`ahead`): once the holder's commit is admitted and its
staged file checked, the first in line (if its client can rebase on a commit not
yet ratified: `pending_ok`) is answered at once with that commit, marked
`Pending`, and its turn is next. Its writer rebases and stages while the
holder's commit is ratified, not after; its next request waits for the holder
alone and names the commit it rebased on (`base`), and the owner ratifies it only
if that commit is what the version before it became (else a retryable
conflict: the writer rebases on what was ratified, Transaction.commit). With 8
writers on one table: ~7% more commits/s and a lower p50 (paired runs).

A turn is a courtesy of one owner process, held in memory: the database still
decides every version, a restarted owner starts with no turns, and a request
without a `turn` races as before. Nor does it order everything: a writer whose
line emptied between two of its losses races again (8 writers on one table: 2
attempts a commit, at most 3 or 4; without turns 7, at most 33). Bounds, because waiting holds one of the
server's threads: a turn lapses `grant_s` after it was given if its holder has
not committed (a writer that crashed stalls the table that long; one that will not
commit after all, say its rebase found a real conflict, ends its turn: `done`), a
request waits at most `wait_s` (and leaves when its call ends: `admit`'s
`watch`), and at most `max_waiters` requests wait at once in the whole owner,
half of them for one table (the others race at once, as before turns, and may
take even a held version).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from ...errors import InvalidArgument, Unavailable

#: how a request learns that its call ended: `watch(fn)` has `fn` called then (a gRPC context's
#: `add_callback`); False if it has ended already
Watch = Callable[[Callable[[], None]], bool]
#: longest turn id accepted (clients send 16 random bytes)
MAX_TURN_BYTES = 64
#: with this many lines kept, a new one first sweeps out the lapsed ones (at most once a grant)
SWEEP_LINES = 64
#: on an object store a writer's rebase and staging take ~10x longer: so do its turns and waits
SLOW = 10


class Pending(NamedTuple):
    """What the first in line is told while the holder's commit is being ratified (`Turns.ahead`):
    that commit's version and staged file, to rebase on meanwhile."""

    version: int
    file: str


@dataclass(eq=False)
class _Waiter:
    turn: bytes
    woken: threading.Condition  # on the line's one lock: a hand-over wakes the first in line, not all
    gone: bool = False  # its call ended (the client cancelled, or its deadline passed): stop waiting
    #: its client rebases on a commit still being ratified (`admit`'s `pending_ok`)
    pending_ok: bool = False
    #: set by `ahead`: the holder's commit this request is answered with before it is ratified
    ahead: Pending | None = None


@dataclass
class _Line:
    holder: bytes | None = None
    lapses_at: float = 0.0
    waiting: deque[_Waiter] = field(default_factory=deque)
    #: the turn that goes next, after the holder's (`ahead`); it waits for no one else
    next: bytes | None = None
    next_slow: bool = False
    #: its request, if it is waiting for the holder to finish
    next_waiter: _Waiter | None = None


class Turns:
    def __init__(
        self,
        max_waiters: int = 16,
        grant_s: float = 0.2,
        wait_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_table: int | None = None,
    ) -> None:
        self.max_waiters = max_waiters
        #: at most this many wait for one table: one busy (or hostile) table cannot take every place
        self.per_table = max(1, max_waiters // 2) if per_table is None else per_table
        self.grant_s = grant_s
        self.wait_s = wait_s
        self._clock = clock
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self._waiters = 0
        self._swept_at = float("-inf")
        #: requests that waited in line, turns that lapsed, and waiting requests whose call ended
        #: (tests and benchmarks read them)
        self.waits = 0
        self.lapsed = 0
        self.gone = 0
        #: requests answered with the holder's commit before it was ratified (`ahead`)
        self.told = 0

    @staticmethod
    def check(turn: bytes) -> None:
        if len(turn) > MAX_TURN_BYTES:
            raise InvalidArgument(f"a turn id is at most {MAX_TURN_BYTES} bytes, not {len(turn)}")

    def _expire(self, line: _Line, now: float) -> None:
        if line.holder is not None and now >= line.lapses_at:
            line.holder = None
            self.lapsed += 1
            self._pass_on(line, now)

    def _pass_on(self, line: _Line, now: float | None = None) -> None:
        """The holder's turn ended: it goes to the turn told to go next (`ahead`), else the first in
        line is woken to take it."""
        if line.next is not None:
            self._give(line, line.next, self._clock() if now is None else now, line.next_slow)
            line.next = None
            if line.next_waiter is not None:
                line.next_waiter.woken.notify()
        else:
            self._wake_first(line)

    @staticmethod
    def _wake_first(line: _Line) -> None:
        if line.waiting:
            line.waiting[0].woken.notify()

    def _give(self, line: _Line, turn: bytes, now: float, slow: bool) -> None:
        line.holder, line.lapses_at = turn, now + self.grant_s * (SLOW if slow else 1)

    def admit(
        self,
        table_id: str,
        turn: bytes,
        *,
        slow: bool = False,
        watch: Watch | None = None,
        pending_ok: bool = False,
    ) -> Literal["go", "waited", "over"] | Pending:
        """Before a request of `turn` may try the table's next version. "go" at once when `turn`
        holds the table's turn or nobody holds or waits for it; "over" at once when too many
        requests wait already (the request races, and may take even a held version: refusing it
        would leave it nothing but to retry until the line drains); otherwise waits in line until
        the turn is `turn`'s or the wait is over, then "waited" (the caller re-reads the latest
        version, which may have moved meanwhile). With `pending_ok` (its client rebases on a commit
        still being ratified), the first in line may instead be answered `Pending` while the
        holder's commit is ratified (`ahead`); its turn is then next, and its next request waits
        for the holder alone. `slow`: the table is on an object store, where a
        writer's rebase and staging take longer. `watch(fn)` (a gRPC context's `add_callback`) has
        `fn` called when the request's call ends: a request whose client is gone leaves the line at
        once (`Unavailable`) rather than holding its thread until the wait is over; False from
        `watch` means the call has ended already."""
        with self._lock:
            now = self._clock()
            line = self._lines.get(table_id)
            if line is None:
                return "go"
            self._expire(line, now)
            if line.holder == turn or (line.holder is None and not line.waiting and line.next is None):
                return "go"
            if self._waiters >= self.max_waiters or (len(line.waiting) >= self.per_table and line.next != turn):
                return "over"
            me = _Waiter(turn, threading.Condition(self._lock), pending_ok=pending_ok)
            deadline = now + self.wait_s * (SLOW if slow else 1)
            self._waiters += 1
            self.waits += 1
            if line.next == turn:  # told to go next: it waits for the holder's commit alone
                line.next_waiter = me
                try:
                    return self._wait_as_next(line, me, now, deadline, watch)
                finally:
                    if line.next_waiter is me:
                        line.next_waiter = None
                    self._waiters -= 1
                    self._tidy(table_id, line)
            line.waiting.append(me)
            try:
                self._watch(me, watch)
                while True:
                    self._leave_if_gone(me)
                    if me.ahead is not None:
                        return me.ahead
                    self._expire(line, now)
                    if line.holder == turn:  # the same transaction's earlier request, ahead in line, got it
                        return "waited"
                    if line.waiting[0] is me and line.holder is None and line.next is None:
                        self._give(line, turn, now, slow)
                        return "waited"
                    if now >= deadline:
                        return "waited"
                    # the first in line also wakes when the holder's turn lapses
                    first = line.waiting[0] is me
                    until = min(deadline, line.lapses_at) if first and line.holder is not None else deadline
                    me.woken.wait(max(until - now, 0.0005))
                    now = self._clock()
            finally:  # on an error too: no one is left waiting behind a request that is gone
                first = line.waiting[0] is me
                line.waiting.remove(me)
                if first:
                    self._wake_first(line)  # the next in line waits for this turn, or takes a free one
                self._waiters -= 1
                self._tidy(table_id, line)

    def _wait_as_next(
        self, line: _Line, me: _Waiter, now: float, deadline: float, watch: Watch | None
    ) -> Literal["waited"]:
        """`admit` for the turn told to go next: wait until the holder's turn ends (committed, ended
        or lapsed: `_pass_on` gives it this turn) or the wait is over (the caller re-reads the table
        either way; its request then races like any other)."""
        self._watch(me, watch)
        while True:
            self._leave_if_gone(me)
            self._expire(line, now)
            if line.holder == me.turn or now >= deadline:
                return "waited"
            until = min(deadline, line.lapses_at) if line.holder is not None else deadline
            me.woken.wait(max(until - now, 0.0005))
            now = self._clock()

    def ahead(self, table_id: str, turn: bytes, pending: Pending, *, slow: bool = False) -> bool:
        """The holder `turn` is about to ratify `pending` (its staged file checked): the first in line,
        if its client rebases on commits still being ratified, is answered with it now, and its turn
        goes next. Its writer rebases and stages while the holder's commit is ratified rather than
        after (one table's commits overlap in pairs). Whether a waiting request was told."""
        with self._lock:
            line = self._lines.get(table_id)
            if line is None or line.holder != turn or line.next is not None or not line.waiting:
                return False
            first = line.waiting[0]
            if first.gone or not first.pending_ok or first.ahead is not None or first.turn == turn:
                return False
            first.ahead = pending
            self.told += 1
            line.next, line.next_slow = first.turn, slow
            first.woken.notify()
            return True

    def is_next(self, table_id: str, turn: bytes) -> bool:
        """Whether `turn` was told to go next (`ahead`): its request may name the version after the
        one being ratified."""
        with self._lock:
            line = self._lines.get(table_id)
            return line is not None and line.next == turn

    def _watch(self, me: _Waiter, watch: Watch | None) -> None:
        """Have `watch` mark the waiting request gone when its call ends (at once if it has)."""
        if watch is not None and not watch(lambda: self._gone(me)):
            me.gone = True

    def _leave_if_gone(self, me: _Waiter) -> None:
        if me.gone:
            self.gone += 1
            raise Unavailable("the call ended while it waited for the table's turn")

    def _gone(self, me: _Waiter) -> None:
        """A waiting request's call ended (called from gRPC's thread, after the request left the line too)."""
        with self._lock:
            me.gone = True
            me.woken.notify()

    def lost(self, table_id: str, turn: bytes, *, slow: bool = False) -> bool:
        """`turn` lost the race for a version: it gets the table's turn if nobody holds or waits for it.
        Whether it holds the turn now (its next request for the next version will not wait); a turn
        held is granted anew from here, the answer that tells its writer to rebase."""
        with self._lock:
            now = self._clock()
            if len(self._lines) >= SWEEP_LINES and table_id not in self._lines and now - self._swept_at >= self.grant_s:
                self._swept_at = now
                self._sweep(now)
            line = self._lines.setdefault(table_id, _Line())
            self._expire(line, now)
            if line.next == turn:  # told to go next (`ahead`): its turn comes when the holder's ends
                return True
            if (line.holder is None and not line.waiting and line.next is None) or line.holder == turn:
                self._give(line, turn, now, slow)
            return line.holder == turn

    def held_for_another(self, table_id: str, turn: bytes) -> bool:
        """Whether the table's next version is held for a turn other than `turn` (checked where the
        version is decided, so a request that passed the line before the turn was given cannot
        take it)."""
        with self._lock:
            line = self._lines.get(table_id)
            if line is None:
                return False
            self._expire(line, self._clock())
            return line.holder is not None and line.holder != turn

    def done(self, table_id: str, turn: bytes) -> bool:
        """`turn` committed, failed for good or will not come back (`LocalOwner.end_turn`): if it held
        the table's turn, the first in line gets it. Whether it held the turn."""
        with self._lock:
            line = self._lines.get(table_id)
            if line is None:
                return False
            if line.next == turn and line.holder != turn:  # told to go next, and will not come
                line.next = None
                if line.holder is None:
                    self._wake_first(line)
                self._tidy(table_id, line)
                return True
            if line.holder != turn:
                return False
            line.holder = None
            self._pass_on(line)
            self._tidy(table_id, line)
            return True

    def _sweep(self, now: float) -> None:
        """Forget the lines whose holder's turn lapsed with nobody waiting (a line is otherwise
        forgotten when its last turn ends or its last waiter leaves)."""
        for table_id, line in list(self._lines.items()):
            self._expire(line, now)
            self._tidy(table_id, line)

    def _tidy(self, table_id: str, line: _Line) -> None:
        if line.holder is None and not line.waiting and line.next is None and self._lines.get(table_id) is line:
            del self._lines[table_id]
