"""Writers racing for one table's next version take turns (feedlog/delta/managed/turns.py).

The line itself (`Turns`, with threads standing in for the owner's request threads), then the
owner's rules on every owner kind: a loser holds the next version, and a request behind it waits
and is answered with the winners once the holder has committed (concurrent writers needing at most
three attempts a commit: test_behaviour.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from feedlog import failpoints
from feedlog.delta import ConcurrentModification, DeltaTable
from feedlog.delta.committer import CommitConflict, Committed
from feedlog.delta.managed import COMMITS_DIR, Auth, Binding, TableRef, staged_name
from feedlog.delta.managed.client import GrpcOwner
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.managed.turns import MAX_TURN_BYTES, SWEEP_LINES, Pending, Turns
from feedlog.errors import FeedlogError, InvalidArgument, Unavailable
from feedlog_server.owner import OwnerServer
from tests.conftest import wait_until

from .conftest import SCHEMA, Owner, batch


class _Requests:
    """Requests calling `admit` in their own threads, as the owner's request threads do."""

    def __init__(self, turns: Turns) -> None:
        self.turns = turns
        self.admitted: list[tuple[bytes, bool]] = []
        #: what `admit` returned, in order
        self.answers: list[tuple[bytes, object]] = []
        self.threads: list[threading.Thread] = []

    def arrive(self, turn: bytes, table: str = "t", *, pending_ok: bool = False) -> None:
        """Start a request; return once it is waiting in line (or has been answered)."""
        before = self.turns.waits

        def run() -> None:
            answer = self.turns.admit(table, turn, pending_ok=pending_ok)
            self.answers.append((turn, answer))
            self.admitted.append((turn, answer == "waited"))

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.threads.append(th)
        wait_until(lambda: self.turns.waits > before or not th.is_alive(), what=f"{turn!r} waits")

    def join(self) -> None:
        for th in self.threads:
            th.join(10)
        assert not any(th.is_alive() for th in self.threads)


def test_without_a_lost_race_nobody_waits() -> None:
    turns = Turns()
    assert turns.admit("t", b"a") == "go"  # no line: go on, as before turns
    turns.done("t", b"a")  # committing without a turn changes nothing
    assert turns.waits == 0 and not turns._lines


def test_losers_take_turns_in_the_order_they_arrive() -> None:
    turns = Turns(grant_s=30, wait_s=30)
    assert turns.lost("t", b"a") is True  # nobody held or waited: a's next request may go
    assert turns.lost("t", b"x") is False  # a holds it: x lost too, but must wait in line
    assert turns.admit("t", b"a") == "go"  # the holder does not wait
    requests = _Requests(turns)
    for turn in (b"b", b"c", b"d"):
        requests.arrive(turn)
    assert requests.admitted == [] and turns.waits == 3
    turns.done("t", b"b")  # not the holder: nothing moves
    line = turns._lines["t"]
    assert line.holder == b"a" and [w.turn for w in line.waiting] == [b"b", b"c", b"d"]
    for holder, expected in ((b"a", [b"b"]), (b"b", [b"b", b"c"]), (b"c", [b"b", b"c", b"d"])):
        turns.done("t", holder)
        n = len(expected)
        wait_until(lambda: len(requests.admitted) == n, what=f"{expected[-1]!r} is admitted")  # noqa: B023
        assert [t for t, _ in requests.admitted] == expected and all(ok for _, ok in requests.admitted)
    turns.done("t", b"d")
    requests.join()
    assert not turns._lines  # an empty line is forgotten
    assert turns.lapsed == 0


def test_a_turn_not_taken_lapses_and_the_first_in_line_goes_on() -> None:
    turns = Turns(grant_s=0.05, wait_s=30)
    started = time.monotonic()
    turns.lost("t", b"crashed")  # it never comes back
    requests = _Requests(turns)
    requests.arrive(b"b")
    requests.join()
    assert requests.admitted == [(b"b", True)] and turns.lapsed == 1
    assert 0.04 <= time.monotonic() - started < 5


def test_waiting_is_bounded_in_requests() -> None:
    turns = Turns(max_waiters=1, grant_s=30, wait_s=30, per_table=1)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b")  # the one waiter allowed
    started = time.monotonic()
    assert turns.admit("t", b"c") == "over"  # the owner's threads are not all given to waiting
    assert time.monotonic() - started < 5 and turns.waits == 1  # c went on at once, unqueued
    turns.done("t", b"a")
    requests.join()
    assert requests.admitted == [(b"b", True)] and turns._lines["t"].holder == b"b"


def test_waiting_is_bounded_in_time() -> None:
    turns = Turns(grant_s=30, wait_s=0.05)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b")
    requests.join()
    # waited wait_s (True: the caller re-reads the table), then went on without the turn, out of line
    assert requests.admitted == [(b"b", True)]
    assert turns._lines["t"].holder == b"a" and not turns._lines["t"].waiting


def test_a_request_that_fails_while_waiting_leaves_the_line() -> None:
    fail = threading.Event()

    def clock() -> float:
        if fail.is_set():
            raise KeyboardInterrupt  # e.g. an in-process owner's caller interrupted
        return time.monotonic()

    turns = Turns(grant_s=30, wait_s=30, clock=clock)
    turns.lost("t", b"a")
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            turns.admit("t", b"b")
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    wait_until(lambda: turns.waits == 1, what="b waits")
    fail.set()
    turns.done("t", b"a")  # wakes b, whose clock then fails
    th.join(10)
    assert [type(e) for e in errors] == [KeyboardInterrupt]
    assert turns._waiters == 0 and not turns._lines  # no ghost left first in line
    fail.clear()
    assert turns.lost("t", b"c") is True  # the next loser gets the turn as if b had never been


def test_a_request_whose_call_ends_leaves_the_line_at_once() -> None:
    """`watch` is how the served owner learns that a waiting request's call ended (the client
    cancelled, or its deadline passed): the request leaves the line then, not when its wait is over,
    and the next in line moves up; a call that ended before the request queued does not wait at all."""
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t", b"a")
    ended: list[Callable[[], None]] = []
    errors: list[BaseException] = []

    def watch(fn: Callable[[], None]) -> bool:  # as a gRPC context's add_callback: the call is still on
        ended.append(fn)
        return True

    def wait() -> None:
        try:
            turns.admit("t", b"b", watch=watch)
        except Unavailable as e:
            errors.append(e)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    wait_until(lambda: turns.waits == 1 and bool(ended), what="b waits, watched")
    requests = _Requests(turns)
    requests.arrive(b"c")  # behind b
    started = time.monotonic()
    ended[0]()  # b's call ends
    th.join(10)
    assert time.monotonic() - started < 5 and not th.is_alive()
    assert len(errors) == 1 and "ended while it waited" in str(errors[0]) and turns.gone == 1
    assert [w.turn for w in turns._lines["t"].waiting] == [b"c"]  # c is first in line now
    with pytest.raises(Unavailable):
        turns.admit("t", b"d", watch=lambda fn: False)  # its call had ended already
    assert turns.gone == 2 and [w.turn for w in turns._lines["t"].waiting] == [b"c"]
    ended[0]()  # called again once the call is over (gRPC calls it on every ending): harmless
    turns.done("t", b"a")
    requests.join()
    assert requests.admitted == [(b"c", True)] and turns._lines["t"].holder == b"c" and turns._waiters == 0


def test_a_served_owner_frees_the_thread_of_a_waiting_request_whose_deadline_passed(tmp_path: Path) -> None:
    """A client whose deadline passes while its request waits in line does not keep one of the
    owner's threads for the rest of the wait (here 30 s): the request leaves when the call ends."""
    root = tmp_path / "tables"
    root.mkdir()
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[root], workers=8) as server:
        turns = server.owner.turns
        turns.grant_s = turns.wait_s = 30
        t = DeltaTable.create(root / "a", SCHEMA, owner=Binding.feedlog(endpoint=server.endpoint))
        api = GrpcOwner(server.endpoint, timeout=60)
        ref, auth, ict, stage = _stager(t)
        assert api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"won") == Committed(1)
        assert isinstance(api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"holds"), CommitConflict)
        impatient = GrpcOwner(server.endpoint, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(FeedlogError):  # its deadline passed while it waited behind the holder
            impatient.commit(ref, 2, stage(2, ict + 3), ict + 3, auth, b"impatient")
        wait_until(lambda: turns.gone == 1 and turns._waiters == 0, timeout=10, what="the request leaves the line")
        assert time.monotonic() - started < 10 and turns.waits == 1
        assert api.commit(ref, 2, stage(2, ict + 4), ict + 4, auth, b"holds") == Committed(2)
        impatient.close()
        api.close()


def test_an_append_redone_on_the_latest_state_keeps_the_turn_its_lost_attempt_holds(owner: Owner) -> None:
    """A handle's append starts from the state it holds (DeltaTable.append). When a commit since
    changed the table's metadata, its lost attempt is given the table's turn and the append is redone
    on the latest state: under the same turn, so the redo does not wait for that turn to lapse."""
    t = owner.create()
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30  # a redo under a new turn would wait behind the old one this long
    other = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    t.append(batch([1]))
    other.set_properties({"delta.logRetentionDuration": "interval 2 days"})  # t's state is now stale
    started = time.monotonic()
    assert t.append(batch([2])).version == 3
    assert time.monotonic() - started < 10 and turns.waits == 0 and turns.lapsed == 0
    assert sorted(other.to_arrow().column("id").to_pylist()) == [1, 2]


def test_the_same_turn_twice_in_line_does_not_wait_for_itself() -> None:
    """A client that retries after a lost answer sends its turn again while the first request waits."""
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b")
    requests.arrive(b"b")
    started = time.monotonic()
    turns.done("t", b"a")
    requests.join()
    assert requests.admitted == [(b"b", True), (b"b", True)] and time.monotonic() - started < 5
    assert turns._lines["t"].holder == b"b" and not turns._lines["t"].waiting


def test_the_first_in_line_is_told_of_the_holders_commit_while_it_is_ratified_and_goes_next() -> None:
    """`ahead`: the first in line (a client that rebases on commits not yet ratified) is answered with
    the holder's commit while it is ratified; its turn is next, and its next request waits for the
    holder alone, not behind the line."""
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b", pending_ok=True)
    requests.arrive(b"c", pending_ok=True)
    assert turns.ahead("t", b"z", Pending(2, "f")) is False  # only the holder's commit
    assert turns.ahead("t", b"a", Pending(2, "f")) is True
    wait_until(lambda: requests.answers == [(b"b", Pending(2, "f"))], what="b is answered")
    assert turns.ahead("t", b"a", Pending(2, "f")) is False  # one at a time: c is not told
    assert turns.lost("t", b"b") is True and turns.is_next("t", b"b")  # the answer tells b it goes next
    requests.arrive(b"b")  # b's commit, rebased on a's: it waits for a alone
    assert len(requests.answers) == 1
    turns.done("t", b"a")
    wait_until(lambda: len(requests.answers) == 2, what="b goes on once a is done")
    assert requests.answers[1] == (b"b", "waited") and turns._lines["t"].holder == b"b"
    assert turns.admit("t", b"b") == "go"
    turns.done("t", b"b")
    requests.join()  # and c, first in line now, takes the turn b left
    assert requests.answers[2] == (b"c", "waited") and turns._lines["t"].holder == b"c"
    assert turns.lapsed == 0


def test_a_first_in_line_that_cannot_rebase_on_a_pending_commit_is_not_told_of_one() -> None:
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b")  # an older client: no pending_ok
    requests.arrive(b"c", pending_ok=True)
    assert turns.ahead("t", b"a", Pending(2, "f")) is False  # c is not first: the order stands
    turns.done("t", b"a")
    wait_until(lambda: len(requests.answers) == 1, what="b goes on")
    assert requests.answers == [(b"b", "waited")] and not turns.is_next("t", b"c")
    turns.done("t", b"b")
    requests.join()


def test_a_turn_told_to_go_next_that_never_comes_lapses_or_ends_and_the_line_goes_on() -> None:
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t", b"a")
    requests = _Requests(turns)
    requests.arrive(b"b", pending_ok=True)
    requests.arrive(b"c")
    assert turns.ahead("t", b"a", Pending(2, "f"))
    wait_until(lambda: len(requests.answers) == 1, what="b is answered")
    assert turns.done("t", b"b") is True  # b's rebase found a real conflict: it ends its turn, still next
    assert not turns.is_next("t", b"b") and turns._lines["t"].holder == b"a"
    turns.done("t", b"a")
    wait_until(lambda: len(requests.answers) == 2, what="c goes on")
    assert requests.answers[1] == (b"c", "waited") and turns._lines["t"].holder == b"c"
    turns.done("t", b"c")

    turns.grant_s = 0.05  # b' is told, a' finishes, b' never comes: its turn lapses like any other
    turns.lost("t", b"a2")
    requests.arrive(b"b2", pending_ok=True)
    requests.arrive(b"c2")
    assert turns.ahead("t", b"a2", Pending(5, "g"))
    wait_until(lambda: len(requests.answers) == 3, what="b2 is answered")
    turns.done("t", b"a2")
    assert turns._lines["t"].holder == b"b2"
    requests.join()
    assert requests.answers[3] == (b"c2", "waited") and turns.lapsed == 1


def test_lines_of_two_tables_do_not_mix() -> None:
    turns = Turns(grant_s=30, wait_s=30)
    turns.lost("t1", b"a")
    assert turns.admit("t2", b"b") == "go"  # t2 has no line
    assert turns.lost("t2", b"b") is True


# ---- the owner's rules, on every owner kind ------------------------------------------------------


def _stager(t: DeltaTable) -> tuple[TableRef, Auth, int, Callable[[int, int], str]]:
    s = t.snapshot()
    ict0 = s.in_commit_timestamp
    assert s.metadata is not None and ict0 is not None

    def stage(version: int, ict: int) -> str:
        name = staged_name(version)
        line = json.dumps({"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "WRITE"}})
        t.storage.put_if_absent(f"{COMMITS_DIR}/{name}", (line + "\n").encode())
        return name

    return TableRef(s.metadata.id, t.storage.location), Auth(t.owner_token), ict0, stage


def test_a_holder_that_will_not_commit_ends_its_turn_and_the_writer_behind_it_goes_on(owner: Owner) -> None:
    """A writer given the turn whose transaction ends without committing (a real conflict found in its
    rebase, say) ends the turn: the request waiting behind it is answered at once, not when the turn
    lapses. Ending it takes the table's token and the transaction's own turn id."""
    t = owner.create(batch_size=100)
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30  # without end_turn, the request behind B would wait this long
    ref, auth, ict, stage = _stager(t)
    assert owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"A") == Committed(1)
    lost = owner.api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"B")
    assert isinstance(lost, CommitConflict) and lost.turn  # B holds version 2

    answer: list[Any] = []
    waits = turns.waits
    th = threading.Thread(
        target=lambda: answer.append(owner.api.commit(ref, 2, stage(2, ict + 3), ict + 3, auth, b"C"))
    )
    th.start()
    wait_until(lambda: turns.waits > waits, what="C waits in line behind B")

    with pytest.raises(FeedlogError, match="token"):
        owner.api.end_turn(ref, b"B", Auth("not-the-token"))
    with pytest.raises(InvalidArgument):
        owner.api.end_turn(ref, b"x" * (MAX_TURN_BYTES + 1), auth)
    assert owner.api.end_turn(ref, b"someone else", auth) is False  # only the holder's id ends it
    assert answer == []

    started = time.monotonic()
    assert owner.api.end_turn(ref, b"B", auth) is True
    th.join(15)
    assert not th.is_alive() and time.monotonic() - started < 10
    assert answer == [Committed(2)]  # version 2 was B's to take, and B never took it
    assert owner.api.end_turn(ref, b"B", auth) is False  # once only
    assert turns.lapsed == 0 and not turns._lines
    owner.settle()


def test_a_transaction_that_finds_a_real_conflict_while_it_holds_the_turn_ends_it(owner: Owner) -> None:
    """Through the table API: the loser is given the turn, its rebase finds that the winner carries the
    same txn appId (a real conflict), and the commit raises; the turn is passed on, not left to lapse."""
    t = owner.create()
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30
    other = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    first, second = t.transaction("WRITE"), other.transaction("WRITE")
    first.set_txn("job", 1)
    second.set_txn("job", 1)
    assert t.commit(first).version == 1
    with pytest.raises(ConcurrentModification, match="txn appId 'job'"):
        other.commit(second)
    assert not turns._lines and turns.lapsed == 0  # its turn was given (it lost) and ended at once
    assert other.append(batch([7])).version == 2


def test_a_loser_holds_the_next_version_and_the_writer_behind_it_waits(owner: Owner) -> None:
    t = owner.create(batch_size=100)
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30  # a slow machine must not lapse the turn mid-test
    ref, auth, ict, stage = _stager(t)
    assert owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"A") == Committed(1)
    lost = owner.api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"B")
    assert isinstance(lost, CommitConflict) and lost.retryable and lost.turn  # B holds version 2

    # A's next transaction wants version 2 too: its request waits in the owner, behind B
    answer: list[Any] = []
    waits = turns.waits
    a2 = stage(2, ict + 3)
    th = threading.Thread(target=lambda: answer.append(owner.api.commit(ref, 2, a2, ict + 3, auth, b"A2")))
    th.start()
    wait_until(lambda: turns.waits > waits, what="A2 waits in line")
    assert answer == []

    b2 = stage(2, ict + 4)
    assert owner.api.commit(ref, 2, b2, ict + 4, auth, b"B") == Committed(2)  # the holder goes first
    th.join(15)
    assert not th.is_alive()
    [behind] = answer
    # answered once B committed, with B's commit to rebase on, and the next turn
    assert isinstance(behind, CommitConflict) and behind.retryable and behind.turn
    assert behind.version == 2 and (2, b2) in behind.winners
    assert owner.api.commit(ref, 3, stage(3, ict + 5), ict + 5, auth, b"A2") == Committed(3)
    assert turns.lapsed == 0
    assert not turns._lines
    owner.settle()
    assert t.version() == 3


def test_a_request_past_the_line_before_the_turn_was_given_cannot_take_the_held_version(
    owner: Owner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C's request found no line and went on; B then lost and got the turn; when C's request reaches
    the decision, the version is B's: C is refused (retryable), B commits it."""
    t = owner.create(batch_size=100)
    owner.turns.grant_s = owner.turns.wait_s = 30
    ref, auth, ict, stage = _stager(t)
    gate = tmp_path / "gate"
    monkeypatch.setenv(failpoints.GATE_ENV, str(gate))
    failpoints.arm("owner.admitted=wait@2")  # A's request passes first; C's is held there
    try:
        assert owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"A") == Committed(1)
        answer: list[Any] = []
        c2 = stage(2, ict + 2)
        th = threading.Thread(target=lambda: answer.append(owner.api.commit(ref, 2, c2, ict + 2, auth, b"C")))
        th.start()
        wait_until(lambda: failpoints._hits.get("owner.admitted") == 2, what="C's request is past the line")
        lost = owner.api.commit(ref, 1, stage(1, ict + 3), ict + 3, auth, b"B")
        assert isinstance(lost, CommitConflict) and lost.turn  # B holds version 2
        gate.touch()
        th.join(15)
        [c] = answer
        assert isinstance(c, CommitConflict) and c.retryable and not c.turn and c.version == 2, c
        assert "held" in c.reason
        assert owner.api.commit(ref, 2, stage(2, ict + 4), ict + 4, auth, b"B") == Committed(2)
    finally:
        failpoints.arm("")
        gate.touch()


def test_a_request_without_a_turn_races_as_before(owner: Owner) -> None:
    t = owner.create(batch_size=100)
    turns = owner.turns
    turns.grant_s = 30
    ref, auth, ict, stage = _stager(t)
    assert owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"A") == Committed(1)
    assert isinstance(owner.api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"B"), CommitConflict)
    # B holds version 2, but an old client that sends no turn neither waits nor is held back
    assert owner.api.commit(ref, 2, stage(2, ict + 3), ict + 3, auth) == Committed(2)
    assert turns.waits == 0


def test_a_turn_id_over_the_limit_is_refused(owner: Owner) -> None:
    t = owner.create(batch_size=100)
    ref, auth, ict, stage = _stager(t)
    with pytest.raises(InvalidArgument, match="turn id"):
        owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"x" * (MAX_TURN_BYTES + 1))
    assert t.version() == 0


def test_requests_waiting_for_one_table_hold_at_most_a_quarter_of_the_servers_threads(tmp_path: Path) -> None:
    """A writer with a table's token sends many requests with turns while another holds the table's
    turn: a quarter of the server's threads wait, the rest are answered at once, and another
    table's commit goes through meanwhile."""
    root = tmp_path / "tables"
    root.mkdir()
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[root], workers=8) as server:
        turns = server.owner.turns
        turns.grant_s = turns.wait_s = 30
        bind = Binding.feedlog(endpoint=server.endpoint)
        a, b = DeltaTable.create(root / "a", SCHEMA, owner=bind), DeltaTable.create(root / "b", SCHEMA, owner=bind)
        api = GrpcOwner(server.endpoint, timeout=60)
        ref, auth, ict, stage = _stager(a)
        assert api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"won") == Committed(1)
        assert isinstance(api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"holds"), CommitConflict)
        answers: list[Any] = []

        def hostile(i: int) -> None:
            answers.append((i, api.commit(ref, 2, stage(2, ict + 3 + i), ict + 3 + i, auth, b"h%d" % i)))

        threads = [threading.Thread(target=hostile, args=(i,), daemon=True) for i in range(6)]
        for th in threads:
            th.start()
        wait_until(lambda: turns.waits == 2 and len(answers) == 4, what="2 requests wait and 4 are answered")
        # those beyond the waiting limit raced, held version or not, and one of them took version 2
        assert sorted(isinstance(x, Committed) for _, x in answers) == [False, False, False, True]
        started = time.monotonic()
        b.append(batch([1]))  # another table's commit is not held up
        assert time.monotonic() - started < 5
        assert turns.waits == 2
        # the holder commits (version 3: one beyond the limit took 2); the first in line is answered
        # with the turn, and once it commits, the second
        assert api.commit(ref, 3, stage(3, ict + 20), ict + 20, auth, b"holds") == Committed(3)
        wait_until(lambda: len(answers) == 5, what="the first in line is answered")
        i, first = answers[4]
        assert isinstance(first, CommitConflict) and first.turn and first.version == 2
        assert api.commit(ref, 4, stage(4, ict + 21), ict + 21, auth, b"h%d" % i) == Committed(4)
        for th in threads:
            th.join(10)
        assert len(answers) == 6 and turns.lapsed == 0
        last = answers[5][1]
        assert isinstance(last, CommitConflict) and last.turn and last.version == 2
        api.close()


def test_lines_whose_turn_lapsed_are_swept_out() -> None:
    now = [0.0]
    turns = Turns(grant_s=1, clock=lambda: now[0])
    for i in range(SWEEP_LINES):
        turns.lost(f"t{i}", b"gone")  # writers that never came back
    assert len(turns._lines) == SWEEP_LINES
    turns.lost("t0", b"x")  # a known table: no sweep
    now[0] = 2.0
    turns.lost("new", b"a")
    assert list(turns._lines) == ["new"] and turns.lapsed == SWEEP_LINES


def test_one_table_takes_at_most_its_share_of_the_places_in_line() -> None:
    turns = Turns(max_waiters=4, grant_s=30, wait_s=30)
    assert turns.per_table == 2
    turns.lost("busy", b"a")
    turns.lost("other", b"x")
    requests = _Requests(turns)
    requests.arrive(b"b", "busy")
    requests.arrive(b"c", "busy")
    assert turns.admit("busy", b"d") == "over"  # the busy table's share is taken: d races at once
    requests.arrive(b"y", "other")  # another table still finds a place
    assert turns.waits == 3 and requests.admitted == []
    turns.done("busy", b"a")
    turns.done("other", b"x")
    wait_until(lambda: len(requests.admitted) == 2, what="b and y are admitted")
    turns.done("busy", b"b")
    requests.join()
    assert sorted(requests.admitted) == [(b"b", True), (b"c", True), (b"y", True)]


# ---- pipelined turns: the next writer rebases on the holder's commit while it is ratified --------


class _Gate:
    """Holds the owner's ratification of one staged file until opened, then lets it go on or fail:
    the window in which the writer behind the holder is told of the holder's commit."""

    def __init__(self, owner: Owner, monkeypatch: pytest.MonkeyPatch) -> None:
        local = owner.server.owner if owner.server is not None else owner.api
        assert isinstance(local, LocalOwner)
        self.api = owner.api
        self.staged: str | None = None
        self.entered, self.opened = threading.Event(), threading.Event()
        self.fail = False
        real = local._group.submit

        def submit(item: Any) -> Any:
            if item.staged == self.staged:
                self.entered.set()
                assert self.opened.wait(30), "the gate was never opened"
                if self.fail:
                    raise Unavailable("injected: this ratification failed")
            return real(item)

        monkeypatch.setattr(local._group, "submit", submit)

    def commit(
        self, ref: TableRef, version: int, staged: str, ict: int, auth: Auth, turn: bytes, *, fail: bool = False
    ) -> tuple[threading.Thread, list[Any]]:
        """The holder's commit of `staged`, in a thread of its own, held at this gate (and failing
        there if `fail`): the thread, and the list its answer (or error) goes to."""
        self.staged, self.fail = staged, fail
        out: list[Any] = []
        return _thread(lambda: self.api.commit(ref, version, staged, ict, auth, turn), out), out


def _pipelined(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> tuple[DeltaTable, Turns, _Gate, TableRef, Auth, int, Callable[[int, int], str]]:
    """A table whose turns do not lapse in a test's time, its owner's ratifications behind a `_Gate`,
    and a stager for it (`_stager`); A has committed version 1, and B, which lost it, holds version 2."""
    t = owner.create(batch_size=100)
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30
    ref, auth, ict, stage = _stager(t)
    assert owner.api.commit(ref, 1, stage(1, ict + 1), ict + 1, auth, b"A") == Committed(1)
    assert isinstance(owner.api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"B"), CommitConflict)
    return t, turns, _Gate(owner, monkeypatch), ref, auth, ict, stage


def _thread(fn: Callable[[], Any], out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_the_writer_behind_the_holder_rebases_on_its_commit_while_it_is_ratified(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, turns, gate, ref, auth, ict, stage = _pipelined(owner, monkeypatch)
    told: list[Any] = []
    waits = turns.waits
    c2 = stage(2, ict + 3)
    asked = _thread(lambda: owner.api.commit(ref, 2, c2, ict + 3, auth, b"C", pending_ok=True), told)
    wait_until(lambda: turns.waits > waits, what="C waits in line behind B")

    b2 = stage(2, ict + 4)
    b, holder = gate.commit(ref, 2, b2, ict + 4, auth, b"B")
    assert gate.entered.wait(30)
    asked.join(15)  # answered while B's commit is held before its ratification
    [answer] = told
    assert isinstance(answer, CommitConflict) and answer.retryable and answer.turn
    assert answer.pending == 2 and answer.winners == ((2, b2),) and holder == []

    c3 = stage(3, ict + 5)
    done: list[Any] = []
    c = _thread(lambda: owner.api.commit(ref, 3, c3, ict + 5, auth, b"C", pending_ok=True, base=b2), done)
    wait_until(lambda: turns.waits > waits + 1, what="C's commit waits for B's alone")
    assert done == []
    gate.opened.set()
    b.join(15)
    c.join(15)
    assert holder == [Committed(2)] and done == [Committed(3)]
    assert turns.lapsed == 0 and not turns._lines
    owner.settle()


def test_a_commit_rebased_on_a_commit_that_was_never_ratified_is_refused_as_retryable(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's ratification fails after the writer behind it was told of it: that writer's
    commit, rebased on it, is refused with a conflict it can retry (not a gap it cannot), and its
    rebase on what was ratified then commits."""
    t, turns, gate, ref, auth, ict, stage = _pipelined(owner, monkeypatch)
    told: list[Any] = []
    waits = turns.waits
    asked = _thread(lambda: owner.api.commit(ref, 2, stage(2, ict + 3), ict + 3, auth, b"C", pending_ok=True), told)
    wait_until(lambda: turns.waits > waits, what="C waits in line behind B")
    b2 = stage(2, ict + 4)
    b, holder = gate.commit(ref, 2, b2, ict + 4, auth, b"B", fail=True)
    asked.join(15)
    assert told and told[0].pending == 2
    gate.opened.set()
    b.join(15)
    assert [type(e) for e in holder] == [Unavailable]  # B's commit failed: version 2 is still free

    refused = owner.api.commit(ref, 3, stage(3, ict + 5), ict + 5, auth, b"C", pending_ok=True, base=b2)
    assert isinstance(refused, CommitConflict) and refused.retryable and "not ratified" in refused.reason
    assert owner.api.commit(ref, 2, stage(2, ict + 6), ict + 6, auth, b"C", pending_ok=True) == Committed(2)
    assert DeltaTable.open(t.storage.location, owner_token=t.owner_token).version() == 2


def test_a_commit_names_the_base_it_was_rebased_on_and_only_that_base_is_ratified(owner: Owner) -> None:
    """Checked against the owner's record of version-1, or, once backfill has forgotten it (batch
    size 1), against the latest commit the owner process ratified itself."""
    t = owner.create(batch_size=1)
    ref, auth, ict, stage = _stager(t)
    b1 = stage(1, ict + 1)
    assert owner.api.commit(ref, 1, b1, ict + 1, auth, b"B") == Committed(1)
    owner.settle()  # backfilled and forgotten: only the owner's memory knows what version 1 was
    with pytest.raises(InvalidArgument):
        owner.api.commit(ref, 2, stage(2, ict + 2), ict + 2, auth, b"C", pending_ok=True, base="../../x")
    other = staged_name(1)
    wrong = owner.api.commit(ref, 2, stage(2, ict + 3), ict + 3, auth, b"C", pending_ok=True, base=other)
    assert isinstance(wrong, CommitConflict) and wrong.retryable
    assert owner.api.commit(ref, 2, stage(2, ict + 4), ict + 4, auth, b"C", pending_ok=True, base=b1) == Committed(2)
    owner.settle()


@pytest.mark.parametrize("gone", [False, True], ids=["file-kept", "file-gone"])
def test_a_transaction_told_of_a_commit_that_then_fails_rebases_on_what_was_ratified(
    owner: Owner, monkeypatch: pytest.MonkeyPatch, gone: bool
) -> None:
    """Through the table API: an append waits behind a holder, is told of the holder's commit, rebases
    on it and stages the version after it; the holder's ratification fails; the append is refused,
    rebases on what was ratified and commits the version the holder never took, with its own rows
    and none of the holder's. `gone`: the holder's staged file is deleted before the append reads it
    (its writer was refused and cleaned up), and the append rebases on what was ratified at once."""
    t, turns, gate, ref, auth, ict, stage = _pipelined(owner, monkeypatch)
    if gone:
        real_ahead = turns.ahead

        def ahead(table_id: str, turn: bytes, pending: Pending, *, slow: bool = False) -> bool:
            if turn == b"B":  # B's commit: refused and cleaned up, as far as the writer told of it sees
                t.storage.delete(f"{COMMITS_DIR}/{pending.file}")
            return real_ahead(table_id, turn, pending, slow=slow)

        monkeypatch.setattr(turns, "ahead", ahead)
    writer = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    writer.version()
    waits = turns.waits
    appended: list[Any] = []
    w = _thread(lambda: writer.append(batch([42], "w")), appended)  # its version 1 is taken: it waits
    wait_until(lambda: turns.waits > waits, what="the append waits in line behind B")
    b2 = stage(2, ict + 4)
    b, holder = gate.commit(ref, 2, b2, ict + 4, auth, b"B", fail=True)
    wait_until(
        lambda: turns.waits > waits + 1 or bool(appended), what="the append, rebased on B's commit, waits for it"
    )
    assert not appended, appended
    gate.opened.set()
    b.join(15)
    w.join(30)
    assert [type(e) for e in holder] == [Unavailable]
    [result] = appended
    assert not isinstance(result, BaseException), result
    # file kept: told (1), refused at version 3 (2), committed (3); gone: told (1), committed (2)
    assert result.version == 2 and result.attempts == (2 if gone else 3)
    fresh = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    assert fresh.version() == 2 and fresh.to_arrow().column("id").to_pylist() == [42]
    owner.settle()


def _stage_with_txn(t: DeltaTable, version: int, ict: int, app_id: str, txn_version: int) -> str:
    """A staged commit carrying a txn action (what a job's idempotent append writes)."""
    name = staged_name(version)
    lines = [
        {"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "WRITE"}},
        {"txn": {"appId": app_id, "version": txn_version, "lastUpdated": ict}},
    ]
    t.storage.put_if_absent(f"{COMMITS_DIR}/{name}", "".join(json.dumps(x) + "\n" for x in lines).encode())
    return name


def test_claims_seen_only_in_a_commit_not_yet_ratified_do_not_skip_a_transaction(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's commit claims txn version 5 of `job` (after 4); the commit it is told of (still being
    ratified) carries it, then fails. Had the transaction trusted that commit it would have been
    skipped and its work lost: it decides on ratified commits alone and commits."""
    t, turns, gate, ref, auth, ict, _ = _pipelined(owner, monkeypatch)
    writer = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    writer.version()
    waits = turns.waits
    appended: list[Any] = []
    tx = writer.transaction("WRITE")
    tx.set_txn("job", 5, since=4)
    w = _thread(lambda: writer.commit(tx), appended)
    wait_until(lambda: turns.waits > waits, what="the append waits in line behind B")
    b2 = _stage_with_txn(t, 2, ict + 4, "job", 5)
    b, holder = gate.commit(ref, 2, b2, ict + 4, auth, b"B", fail=True)
    wait_until(lambda: turns.waits > waits + 1 or bool(appended), what="the append waits for B's commit")
    gate.opened.set()
    b.join(15)
    w.join(30)
    assert [type(e) for e in holder] == [Unavailable]  # B's commit, carrying the claim, never landed
    [result] = appended
    assert not isinstance(result, BaseException), result
    assert not result.skipped and result.version == 2
    fresh = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    assert fresh.version() == 2 and fresh.snapshot().txn_version("job") == 5


def test_what_a_failed_transaction_was_told_is_seen_by_no_later_read_or_transaction(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append told of B's commit (not yet ratified) finds a real conflict in a backfilled commit
    and raises; B's commit then fails. The handle's next read and next transaction see the table as
    ratified: no phantom version 2, and a claim B's commit carried is not taken as landed."""
    t = owner.create(batch_size=1)
    turns = owner.turns
    turns.grant_s = turns.wait_s = 30
    gate = _Gate(owner, monkeypatch)
    ref, auth, ict, stage = _stager(t)
    writer = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    other = DeltaTable.open(t.storage.location, owner_token=t.owner_token)
    writer.version()
    tx, ot = writer.transaction("WRITE"), other.transaction("WRITE")
    tx.set_txn("job", 1)
    ot.set_txn("job", 1)
    assert other.commit(ot).version == 1  # backfilled at once (batch size 1): the conflict is in the log
    owner.settle()
    assert isinstance(owner.api.commit(ref, 1, stage(1, ict + 2), ict + 2, auth, b"B"), CommitConflict)
    waits = turns.waits
    out: list[Any] = []
    w = _thread(lambda: writer.commit(tx), out)
    wait_until(lambda: turns.waits > waits, what="the transaction waits in line behind B")
    b2 = _stage_with_txn(t, 2, ict + 4, "job2", 5)
    b, holder = gate.commit(ref, 2, b2, ict + 4, auth, b"B", fail=True)
    w.join(30)
    assert [type(e) for e in out] == [ConcurrentModification]
    gate.opened.set()
    b.join(15)
    assert [type(e) for e in holder] == [Unavailable]
    assert writer.version() == 1
    again = writer.transaction("WRITE")
    again.set_txn("job2", 5, since=4)
    result = writer.commit(again)
    assert not result.skipped and result.version == 2
    owner.settle()


def test_a_repeat_of_a_ratified_commit_told_of_the_next_holders_commit_is_answered_committed(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's commit of version 2 is ratified but its answer lost; D lost version 2 meanwhile and holds
    the turn. B's client asks again with the same staged file; the repeat waits in line and is first
    when D's commit is admitted: it is answered committed, and B's file (a ratified commit) is kept."""
    t, turns, gate, ref, auth, ict, stage = _pipelined(owner, monkeypatch)
    b2 = stage(2, ict + 4)
    assert owner.api.commit(ref, 2, b2, ict + 4, auth, b"B") == Committed(2)  # its answer is lost
    assert isinstance(owner.api.commit(ref, 2, stage(2, ict + 5), ict + 5, auth, b"D"), CommitConflict)
    waits = turns.waits
    repeat: list[Any] = []
    r = _thread(lambda: owner.api.commit(ref, 2, b2, ict + 4, auth, b"B", pending_ok=True), repeat)
    wait_until(lambda: turns.waits > waits, what="B's repeat waits in line behind D")
    d3 = stage(3, ict + 6)
    d, holder = gate.commit(ref, 3, d3, ict + 6, auth, b"D")
    r.join(15)
    assert repeat == [Committed(2)]
    gate.opened.set()
    d.join(15)
    assert holder == [Committed(3)]
    assert (Path(t.storage.location) / COMMITS_DIR / b2).exists()
    assert DeltaTable.open(t.storage.location, owner_token=t.owner_token).version() == 3
    owner.settle()
