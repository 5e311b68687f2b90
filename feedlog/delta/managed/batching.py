"""Two ways the commit owner shares its fixed costs among concurrent callers.

`Group`: group ratification. Every ratification is one database transaction, and
on SQLite (synchronous=FULL) one fsync of the WAL, a few milliseconds that only
one writer at a time can hold. Callers queue their work; the first caller that
finds no transaction running becomes the leader and runs everything queued so far
in ONE transaction, then hands each caller its own result (or its own error).
While the leader's fsync runs the next group queues up, so groups grow with load
and a lone caller pays no wait at all (no timer).

`Backfiller`: backfill off the commit path. A ratified commit is acknowledged once
the database holds it; copying it to `_delta_log/<v>.json` (its own two fsyncs and
a database write) is done by one background thread per owner, which takes every
table queued meanwhile and backfills each with all its pending commits at once.
Readers that ask the owner see ratified-but-unbackfilled commits (the
managed-commits RFC allows backfill to lag); the owner bounds the lag (sqlite.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ... import failpoints
from ...errors import FeedlogError

T = TypeVar("T")
R = TypeVar("R")

#: at most this many ratifications in one transaction (the queue itself is bounded by the callers:
#: one entry per waiting caller thread)
MAX_GROUP = 256


@dataclass
class _Pending(Generic[T, R]):
    item: T
    done: bool = False
    result: R | None = None
    error: BaseException | None = field(default=None)


class Group(Generic[T, R]):
    """Runs `run(items)` (one transaction for all of them) for whoever is waiting; `run` returns, per
    item, its result or the exception that item alone gets. An exception out of `run` itself (the
    transaction failed) is every member's."""

    def __init__(self, run: Callable[[Sequence[T]], list[R | BaseException]]) -> None:
        self._run = run
        self._cond = threading.Condition()
        self._queue: list[_Pending[T, R]] = []
        self._leading = False
        self.groups = 0  # how many transactions ran (tests and benchmarks read it)

    def submit(self, item: T) -> R:
        me: _Pending[T, R] = _Pending(item)
        with self._cond:
            self._queue.append(me)
        while True:  # bounded: each turn either waits for a leader that settles us or leads one group
            with self._cond:
                while not me.done and self._leading:
                    self._cond.wait()
                if me.done:
                    break
                self._leading = True
                batch, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
            try:
                self._lead(batch)
            finally:
                with self._cond:
                    self._leading = False
                    self._cond.notify_all()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]

    def _lead(self, batch: list[_Pending[T, R]]) -> None:
        try:
            outcomes: list[R | BaseException] = self._run([p.item for p in batch])
            assert len(outcomes) == len(batch)
        except BaseException as e:  # the transaction failed: nobody in it is ratified
            outcomes = [e] * len(batch)
        with self._cond:
            self.groups += 1
            for p, o in zip(batch, outcomes, strict=True):
                if isinstance(o, BaseException):
                    p.error = o
                else:
                    p.result = o
                p.done = True


class Backfiller:
    """One daemon thread that runs `backfill([(table_id, upto), ...])` for the tables queued with `due`
    meanwhile, in the background (one call: the owner records them all in one transaction); a table
    queued again while it waits is backfilled once, up to the highest version it was queued with.
    Errors are left for the next backfill (the commits stay ratified and tracked); `close` stops the
    thread (it starts again on the next `due`)."""

    def __init__(self, backfill: Callable[[list[tuple[str, int]]], object], name: str = "owner-backfill") -> None:
        self._backfill = backfill
        self._name = name
        self._cond = threading.Condition()
        self._due: dict[str, int] = {}  # table id -> backfill up to this version (insertion-ordered)
        #: table id -> the furthest version queued or being backfilled (entries leave when done)
        self._requested: dict[str, int] = {}
        #: table id -> the version the last background backfill of it finished (`requested` counts it)
        self._done: dict[str, int] = {}
        self._running = 0  # tables being backfilled right now
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the last error a background backfill met (None after a clean pass)
        self.last_error: FeedlogError | None = None

    def due(self, table_id: str, upto: int) -> None:
        with self._cond:
            self._due[table_id] = max(upto, self._due.get(table_id, upto))
            self._requested[table_id] = max(upto, self._requested.get(table_id, upto))
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._closed:
                    self._cond.wait()
                if not self._due:
                    return
                tables = list(self._due.items())
                self._due.clear()
                self._running = len(tables)
            done = False
            try:
                failpoints.point("owner.backfill.background")
                self._backfill(tables)
                self.last_error = None
                done = True
            except FeedlogError as e:  # the next commit (or the owner's restart) tries again
                self.last_error = e
            except Exception as e:  # never let the thread die with tables still queued
                self.last_error = FeedlogError(f"background backfill failed: {e!r}")
            with self._cond:
                for table_id, upto in tables:
                    if done:
                        self._done[table_id] = upto  # one thread, in order: a table's newest life replaces the old
                    if self._requested.get(table_id) == upto:
                        del self._requested[table_id]
                self._running = 0
                self._cond.notify_all()

    def requested(self, table_id: str, below: int) -> int:
        """The furthest version a backfill of `table_id` is queued, running or finished for (-1:
        none), for the commit of version `below`: a batch counts from there, not from what the
        table's row said is backfilled. That row may have been read before a backfill finished;
        counting from it then started a second batch a commit later (a backfill to 5 where the batch
        size said 4). A finished version at or past `below` does not count: a later commit's
        backfill finished meanwhile, or the table was released and registered again, lower (its
        batches then count from its row, as they did before this record was kept)."""
        with self._cond:
            done = self._done.get(table_id, -1)
            return max(self._requested.get(table_id, -1), done if done < below else -1)

    def wait_idle(self, timeout: float) -> bool:
        """Whether every queued backfill finished within `timeout` seconds (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._due and not self._running, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
