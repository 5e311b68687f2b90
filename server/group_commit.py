"""Group commit for server-side appends (the durability trick of databases and Kafka's log).

Callers submit their (already validated) entries and wait; whoever commits
takes everything queued, appends it as one batch (one Merkle update, one
signature, one fsync) and only then acknowledges each caller with its seqs.
Under load, batches grow by themselves: while one fsync runs, the next group
queues up. One group is committed at a time (`_busy`).

A group never fails for one member's input: callers validate before they
submit, and should a member still be refused when the group is encoded (at the
real clock reading), the group is committed member by member so that only the
refused one fails (issue 13 item 4).

Who commits: a caller that blocks on its answer (a unary Put, `put`) leads
(leader/follower, as database group commit does). It commits the queue in its
own thread when no group is being committed; otherwise it sleeps until either
its entries are committed or the group before it finishes, at which point the
finisher hands it the lead. Every thread woken is one that must wake anyway to
answer its caller: on a busy machine, context switches and the GIL's hand-offs
cost a blocking put more than its append does (issue 17: the peer's CPU per
put was half kernel time). Pipelined callers (`submit`, PutStream) get a
`Future`; one committer thread per feed commits what they queue when no
blocking caller is there to lead.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from feedlog.errors import FeedlogError, InvalidArgument, Unavailable
from feedlog.log.core import MAX_BATCH_BYTES
from feedlog.log.feed import Appended, Feed, Write
from feedlog.log.merkle import TreeState

from .events import event

Result = tuple[list[Appended], TreeState]


class _Member:
    """One caller's writes in the queue and how it learns the outcome: a `Future` (`submit`), or, for
    a caller blocked in `put`, a lock it sleeps on that is released once, when its entries are
    committed (`done`) or when it is handed the lead (`lead`)."""

    __slots__ = ("done", "error", "fut", "lead", "result", "wake", "writes")

    def __init__(self, writes: Sequence[Write], fut: Future[Result] | None) -> None:
        self.writes = writes
        self.fut = fut
        self.wake: threading.Lock | None = None
        if fut is None:
            self.wake = threading.Lock()
            self.wake.acquire()
        self.done = False
        self.lead = False
        self.result: Result | None = None
        self.error: BaseException | None = None

    def settle(self, result: Result | None, error: BaseException | None = None) -> None:
        if self.fut is not None:
            if error is not None:
                self.fut.set_exception(error)
            else:
                self.fut.set_result(result)  # type: ignore[arg-type]
            return
        self.result, self.error, self.done = result, error, True
        assert self.wake is not None
        self.wake.release()


class GroupCommitter:
    def __init__(
        self,
        feed: Feed,
        on_commit: Callable[[], None],
        *,
        max_batch: int = 10_000,
        observe: Callable[[int, float], None] | None = None,
    ) -> None:
        self.feed = feed
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: deque[_Member] = deque()
        self._closed = False
        self._busy = False  # a group is being committed (by the thread or by a leading caller)
        self.batches = 0
        self.entries = 0  # entries committed (the metrics read these two)
        #: told (entries, seconds) of every group committed: server/metrics.py's histograms
        self._observe = observe
        self._thread = threading.Thread(target=self._run, name=f"group-commit-{feed.key.hex()[:8]}", daemon=True)
        self._thread.start()

    def submit(self, writes: Sequence[Write]) -> Future[Result]:
        """Queue `writes`; the future is settled once they are durable (or refused)."""
        fut: Future[Result] = Future()
        with self._cond:
            if self._closed:
                raise Unavailable("the peer is shutting down; retry on another peer or later")
            self._queue.append(_Member(writes, fut))
            self._cond.notify()
        return fut

    def put(self, writes: Sequence[Write], timeout: float | None = None) -> Result:
        """Commit `writes` and wait until they are durable, leading the group commit when it is this
        caller's turn (module doc). `Unavailable` if that takes longer than `timeout` seconds."""
        me = _Member(writes, None)
        assert me.wake is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closed:
                raise Unavailable("the peer is shutting down; retry on another peer or later")
            self._queue.append(me)
            lead = not self._busy
            if lead:
                self._busy = True
        while True:  # bounded: each turn commits a group or ends the wait
            if not lead:
                left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                if not me.wake.acquire(timeout=left):
                    self._timed_out(me)  # raises, or returns: answered or handed the lead meanwhile
                if not me.lead:
                    break  # answered
            with self._cond:
                me.lead = False
                group = self._group()
            self._process_and_release(group, me)
            if me.done:
                break
            # still queued (the group was full): the lead came straight back (no wake), or another
            # caller has it and this one sleeps until woken again
            lead = me.lead
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _timed_out(self, me: _Member) -> None:
        """`put`'s deadline passed: leave the queue, or raise unless the caller was just handed the lead
        or answered (its wake is then released: taken back so that it stays a one-shot)."""
        with self._cond:
            if me.lead or me.done:
                if me.lead:
                    assert me.wake is not None
                    me.wake.acquire()  # released with the lead, under this lock
                return
            if me in self._queue:
                self._queue.remove(me)
                raise Unavailable("not committed when the deadline passed; nothing was written")
        raise Unavailable("not yet durable when the deadline passed; the entries may still land")

    def _take(self) -> list[_Member] | None:
        with self._cond:
            while not self._queue or self._busy:
                if self._closed and not self._queue:
                    return None
                self._cond.wait()
            self._busy = True
            return self._group()

    def _group(self) -> list[_Member]:
        """The next group from the queue (the caller holds the lock)."""
        group: list[_Member] = []
        n = weight = 0
        while self._queue:
            ws = self._queue[0].writes
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

    def _process_and_release(self, group: list[_Member], leader: _Member | None = None) -> None:
        """Commit `group` (taken with `_busy` set), then pass the lead on: to a blocking caller still
        queued (`leader` itself first: it needs no wake), else to the committer thread."""
        try:
            self._process(group)
        finally:
            with self._cond:
                nxt = None
                if self._queue:
                    if leader is not None and not leader.done and leader in self._queue:
                        nxt = leader
                    else:
                        nxt = next((m for m in self._queue if m.fut is None), None)
                if nxt is None:
                    self._busy = False
                    self._cond.notify_all()
                else:  # stays busy: the lead passes straight to a caller that must wake anyway
                    nxt.lead = True
                    if nxt is not leader:
                        assert nxt.wake is not None
                        nxt.wake.release()

    def _process(self, group: list[_Member]) -> None:
        try:
            self._commit(group)
        except _Refused:  # some member's input: nothing was written, commit each on its own
            for member in group:
                try:
                    self._commit([member])
                except _Refused as r:
                    member.settle(None, r.err)
        self._on_commit()

    def _commit(self, group: list[_Member]) -> None:
        """Append `group` as one batch and settle its callers; raise _Refused if it was refused for its input."""
        writes = [w for m in group for w in m.writes]
        began = time.perf_counter()
        try:
            appended = self.feed.append(writes)
        except (InvalidArgument, ValueError) as e:  # refused while encoding, before anything was written
            event("group_commit_refused", feed=self.feed.key.hex(), entries=len(writes), error=str(e)[:200])
            raise _Refused(e if isinstance(e, InvalidArgument) else InvalidArgument(str(e))) from None
        except Exception as e:  # fail this group, keep serving the next (never leave a caller waiting)
            err = e if isinstance(e, FeedlogError) else Unavailable(f"append failed: {e}")
            event("group_commit_failed", feed=self.feed.key.hex(), entries=len(writes), error=str(e))
            for m in group:
                m.settle(None, err)
            return
        self.batches += 1
        self.entries += len(writes)
        if self._observe is not None:
            self._observe(len(writes), time.perf_counter() - began)
        state = self.feed.core.state
        k = 0
        for m in group:
            m.settle((appended[k : k + len(m.writes)], state))
            k += len(m.writes)

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
