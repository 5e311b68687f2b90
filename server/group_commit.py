"""Group commit for server-side appends (the durability trick of databases and Kafka's log).

Callers submit their (already validated) entries and wait; one committer
thread per feed takes everything queued, appends it as one batch (one Merkle
update, one signature, one fsync) and only then acknowledges each caller with
its seqs. Under load, batches grow by themselves: while one fsync runs, the
next group queues up.

A group never fails for one member's input: callers validate before they
submit, and should a member still be refused when the group is encoded (at the
real clock reading), the group is committed member by member so that only the
refused one fails (issue 13 item 4).

A caller that blocks on its answer (a unary Put) may `lead`: when no group is
being committed it commits the queued group in its own thread, sparing the two
thread hand-offs that, on a busy machine, cost a blocking put more than its
append does. One group is committed at a time either way (`_busy`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from feedlog.errors import FeedlogError, InvalidArgument, Unavailable
from feedlog.log.core import MAX_BATCH_BYTES
from feedlog.log.feed import Appended, Feed, Write
from feedlog.log.merkle import TreeState

from .events import event

Result = tuple[list[Appended], TreeState]


class GroupCommitter:
    def __init__(self, feed: Feed, on_commit: Callable[[], None], *, max_batch: int = 10_000) -> None:
        self.feed = feed
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: deque[tuple[Sequence[Write], Future[Result]]] = deque()
        self._closed = False
        self._busy = False  # a group is being committed (by the thread or by a caller leading one)
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name=f"group-commit-{feed.key.hex()[:8]}", daemon=True)
        self._thread.start()

    def submit(self, writes: Sequence[Write]) -> Future[Result]:
        fut: Future[Result] = Future()
        with self._cond:
            if self._closed:
                raise Unavailable("the peer is shutting down; retry on another peer or later")
            self._queue.append((writes, fut))
            self._cond.notify()
        return fut

    def lead(self, fut: Future[Result]) -> None:
        """A caller about to wait for `fut` commits the queued group itself when no group is being
        committed: a blocking put then skips two thread hand-offs (to the committer thread and back),
        which on a busy machine cost more than the append. Otherwise the committer thread has it."""
        with self._cond:
            if self._busy or fut.done() or not self._queue:
                return
            self._busy = True
            group = self._group()
        self._process_and_release(group)

    def _take(self) -> list[tuple[Sequence[Write], Future[Result]]] | None:
        with self._cond:
            while not self._queue or self._busy:
                if self._closed and not self._queue:
                    return None
                self._cond.wait()
            self._busy = True
            return self._group()

    def _group(self) -> list[tuple[Sequence[Write], Future[Result]]]:
        """The next group from the queue (the caller holds the lock)."""
        group: list[tuple[Sequence[Write], Future[Result]]] = []
        n = weight = 0
        while self._queue:
            ws = self._queue[0][0]
            w = sum(x.weight() for x in ws)
            # a group stays one batch a reader can take back (MAX_BATCH_BYTES); a member alone was checked
            if group and (n + len(ws) > self._max_batch or weight + w > MAX_BATCH_BYTES):
                break
            group.append(self._queue.popleft())
            n += len(ws)
            weight += w
        return group

    def _run(self) -> None:
        while (group := self._take()) is not None:
            self._process_and_release(group)

    def _process_and_release(self, group: list[tuple[Sequence[Write], Future[Result]]]) -> None:
        """Commit `group` (taken with `_busy` set), then let the next group go."""
        try:
            self._process(group)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _process(self, group: list[tuple[Sequence[Write], Future[Result]]]) -> None:
        try:
            self._commit(group)
        except _Refused:  # some member's input: nothing was written, commit each on its own
            for member in group:
                try:
                    self._commit([member])
                except _Refused as r:
                    member[1].set_exception(r.err)
        self._on_commit()

    def _commit(self, group: list[tuple[Sequence[Write], Future[Result]]]) -> None:
        """Append `group` as one batch and settle its callers; raise _Refused if it was refused for its input."""
        writes = [w for ws, _ in group for w in ws]
        try:
            appended = self.feed.append(writes)
        except (InvalidArgument, ValueError) as e:  # refused while encoding, before anything was written
            event("group_commit_refused", feed=self.feed.key.hex(), entries=len(writes), error=str(e)[:200])
            raise _Refused(e if isinstance(e, InvalidArgument) else InvalidArgument(str(e))) from None
        except Exception as e:  # fail this group, keep serving the next (never leave a caller waiting)
            err = e if isinstance(e, FeedlogError) else Unavailable(f"append failed: {e}")
            event("group_commit_failed", feed=self.feed.key.hex(), entries=len(writes), error=str(e))
            for _, fut in group:
                fut.set_exception(err)
            return
        self.batches += 1
        state = self.feed.core.state
        k = 0
        for ws, fut in group:
            fut.set_result((appended[k : k + len(ws)], state))
            k += len(ws)

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new entries, commit the queued ones, stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class _Refused(Exception):
    """A group's input was refused (nothing written); `err` is what its caller gets."""

    def __init__(self, err: InvalidArgument) -> None:
        self.err = err
