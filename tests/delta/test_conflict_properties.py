"""Properties of the rebase conflict rules (`transaction.check_winner`, `transaction.claims_landed`).

A transaction that lost a race reads each winning commit and either rebases onto it or fails with
`ConcurrentModification`. Hypothesis draws a transaction's intents (the paths it removes, the strict
txn appIds it sets, whether it read the whole table) and a winning commit (any mix of actions), and
the rules are checked against an oracle that states them in one line each, then one by one as the
properties the design relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.clock import ManualClock
from feedlog.delta.actions import (
    ICT,
    Action,
    Add,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Txn,
)
from feedlog.delta.committer import FilesystemCommitter
from feedlog.delta.storage import MemoryStorage
from feedlog.delta.transaction import (
    Claim,
    ConcurrentModification,
    NewTable,
    Transaction,
    check_winner,
    claims_landed,
)
from feedlog.errors import Conflict

T0 = 1_790_000_000_000
PATHS = ("a.parquet", "b.parquet", "c.parquet", "p=x/d.parquet")
APPS = ("ingest-1", "ingest-2", "spark-job")

infos = st.builds(lambda t: CommitInfo(t, t, "WRITE"), st.integers(T0, T0 + 10**6))
adds = st.builds(lambda p, dc: Add(p, {}, 10, T0, dc), st.sampled_from(PATHS), st.booleans())
removes = st.builds(lambda p, dc: Remove(p, T0, dc), st.sampled_from(PATHS), st.booleans())
txns = st.builds(Txn, st.sampled_from(APPS), st.integers(0, 20))
domains = st.builds(DomainMetadata, st.sampled_from(["d1", "d2"]), st.just("{}"), st.booleans())
protocols = st.sampled_from([Protocol(1, 2), Protocol(1, 7, None, (ICT,))])
metadatas = st.builds(lambda c: Metadata("id", "{}", (), c), st.dictionaries(st.sampled_from("xy"), st.just("1")))
#: actions of a winner that changes neither protocol nor metadata
data_actions = adds | removes | txns | domains


@st.composite
def winners(draw: st.DrawFn, actions: st.SearchStrategy[Action] = data_actions | protocols | metadatas) -> list[Action]:
    head: list[Action] = draw(st.lists(infos, max_size=1))
    return head + draw(st.lists(actions, max_size=6))


@dataclass(frozen=True)
class Intent:
    removes: frozenset[str]
    txns: frozenset[str]
    reads_whole_table: bool


intents = st.builds(
    Intent,
    st.frozensets(st.sampled_from(PATHS)),
    st.frozensets(st.sampled_from(APPS)),
    st.booleans(),
)
blind_appends = st.builds(Intent, st.just(frozenset()), st.frozensets(st.sampled_from(APPS)), st.just(False))


def conflicts(intent: Intent, version: int, winner: Sequence[Action]) -> bool:
    try:
        check_winner(
            version,
            winner,
            removes=intent.removes,
            txns=intent.txns,
            reads_whole_table=intent.reads_whole_table,
        )
    except ConcurrentModification as e:
        assert isinstance(e, Conflict)  # the CLI maps it to "conflict", and the message names the version
        assert f"version {version}" in str(e)
        return True
    return False


def oracle(intent: Intent, winner: Sequence[Action]) -> bool:
    return any(
        isinstance(a, (Protocol, Metadata))  # the table changed under the transaction
        or (isinstance(a, Txn) and a.app_id in intent.txns)  # the same application's batch: maybe a duplicate
        or (isinstance(a, Remove) and a.path in intent.removes)  # a file removed twice
        or (isinstance(a, Add) and a.data_change and intent.reads_whole_table)  # data an overwrite did not see
        for a in winner
    )


SETTINGS = settings(max_examples=300, deadline=None)


@SETTINGS
@given(intents, winners(), st.integers(1, 10**6))
def test_check_winner_agrees_with_the_oracle(intent: Intent, winner: list[Action], version: int) -> None:
    assert conflicts(intent, version, winner) == oracle(intent, winner)


@SETTINGS
@given(intents, winners(), st.data())
def test_the_verdict_does_not_depend_on_the_order_of_actions(intent: Intent, winner: list[Action], data: st.DataObject):
    shuffled = data.draw(st.permutations(winner))
    assert conflicts(intent, 7, shuffled) == conflicts(intent, 7, winner)


@SETTINGS
@given(intents, winners(), winners())
def test_a_conflict_is_never_hidden_by_more_actions(intent: Intent, one: list[Action], two: list[Action]) -> None:
    # two winners read one after the other conflict iff their union does (the rebase reads them in turn)
    assert conflicts(intent, 3, one + two) == (conflicts(intent, 3, one) or conflicts(intent, 3, two))


@SETTINGS
@given(intents, winners(), st.one_of(protocols, metadatas), st.data())
def test_a_winner_that_changes_protocol_or_metadata_always_conflicts(
    intent: Intent, winner: list[Action], change: Action, data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(winner)))
    assert conflicts(intent, 2, [*winner[:at], change, *winner[at:]])
    assert conflicts(Intent(frozenset(), frozenset(), False), 2, [change])  # even against an empty transaction


@SETTINGS
@given(intents, winners(), st.data())
def test_a_winner_that_removes_a_path_this_removes_conflicts(intent: Intent, winner: list[Action], data: st.DataObject):
    path = data.draw(st.sampled_from(PATHS))
    intent = Intent(intent.removes | {path}, intent.txns, intent.reads_whole_table)
    data_change = data.draw(st.booleans())  # a compaction's remove (dataChange=false) too
    assert conflicts(intent, 4, [*winner, Remove(path, T0, data_change)])


@SETTINGS
@given(blind_appends, blind_appends, st.lists(adds, max_size=5), st.integers(0, 20), st.lists(domains, max_size=2))
def test_blind_appends_never_conflict_with_blind_appends(
    mine: Intent, theirs: Intent, added: list[Add], version: int, domain_changes: list[DomainMetadata]
) -> None:
    # the winner is a blind append too: adds, its own applications' txn markers (not ours), and
    # domains feedlog does not interpret
    winner: list[Action] = [CommitInfo(T0, T0, "WRITE"), *[Txn(a, version) for a in theirs.txns - mine.txns]]
    assert not conflicts(mine, 5, [*winner, *added, *domain_changes])


@SETTINGS
@given(intents, winners(data_actions), st.data())
def test_an_overwrite_conflicts_with_any_data_changing_add(intent: Intent, winner: list[Action], data: st.DataObject):
    overwrite = Intent(intent.removes, intent.txns, True)
    path = data.draw(st.sampled_from(PATHS))
    assert conflicts(overwrite, 6, [*winner, Add(path, {}, 1, T0, True)])
    # an add that changes no data (a compaction's rewrite) is not new data: alone it does not conflict
    assert not conflicts(Intent(frozenset(), frozenset(), True), 6, [Add(path, {}, 1, T0, False)])


@SETTINGS
@given(intents, winners(), st.sampled_from(APPS), st.integers(0, 20))
def test_a_txn_app_id_this_sets_conflicts(intent: Intent, winner: list[Action], app: str, version: int) -> None:
    mine = Intent(intent.removes, intent.txns | {app}, intent.reads_whole_table)
    assert conflicts(mine, 8, [*winner, Txn(app, version)])
    # and another application's marker alone does not
    others = [Txn(a, version) for a in APPS if a not in mine.txns]
    assert not conflicts(Intent(frozenset(), mine.txns, False), 8, others)


@SETTINGS
@given(st.sets(st.sampled_from(APPS)), st.sets(st.sampled_from(APPS)), st.integers(0, 20))
def test_a_transaction_conflicts_on_its_strict_txns_only(strict: set[str], claimed: set[str], version: int) -> None:
    # a txn set with `since` claims a range, re-validated on each attempt by claims_landed instead
    clock = ManualClock(T0)
    tx = Transaction(NewTable(MemoryStorage(clock=clock)), FilesystemCommitter(), clock, lambda: "txn-id")
    for app in claimed:
        tx.set_txn(app, 10, since=5)
    for app in strict - claimed:
        tx.set_txn(app, 10)
    for app in APPS:
        winner: list[Action] = [CommitInfo(T0, T0, "WRITE"), Txn(app, version), Add("new.parquet", {}, 1, T0)]
        if app in strict - claimed:
            with pytest.raises(ConcurrentModification, match=app):
                tx.check_winner(9, winner)
        else:
            tx.check_winner(9, winner)


# ---- claimed txn ranges (exactly-once writers) -------------------------------------------------

claims = st.dictionaries(
    st.sampled_from(APPS),
    st.tuples(st.integers(-1, 10), st.integers(1, 10)).filter(lambda t: t[0] < t[1]).map(lambda t: Claim(*t)),
    max_size=3,
)
helds = st.dictionaries(st.sampled_from(APPS), st.integers(0, 12), max_size=3)


def landed_oracle(held: dict[str, int], claimed: dict[str, Claim]) -> bool | None:
    """True: every claim is already in the table (a duplicate); False: none is; None: Conflict."""
    status = []
    for app, c in claimed.items():
        done = held.get(app)
        if done is None or done <= c.since:
            status.append("none")
        elif done >= c.version:
            status.append("all")
        else:
            status.append("part")
    if "part" in status or ("all" in status and "none" in status):
        return None
    return bool(status) and all(s == "all" for s in status)


@SETTINGS
@given(helds, claims)
def test_claims_landed_agrees_with_the_oracle(held: dict[str, int], claimed: dict[str, Claim]) -> None:
    table = {app: Txn(app, v) for app, v in held.items()}
    expected = landed_oracle(held, claimed)
    if expected is None:
        with pytest.raises(Conflict):
            claims_landed(table, claimed)
    else:
        assert claims_landed(table, claimed) is expected


@SETTINGS
@given(claims.filter(bool))
def test_a_claim_is_a_duplicate_exactly_when_the_table_holds_its_end(claimed: dict[str, Claim]) -> None:
    assert claims_landed({}, claimed) is False
    at_start = {app: Txn(app, c.since) for app, c in claimed.items() if c.since >= 0}
    assert claims_landed(at_start, claimed) is False  # a concurrent commit of the previous batch is compatible
    at_end = {app: Txn(app, c.version) for app, c in claimed.items()}
    assert claims_landed(at_end, claimed) is True  # this batch is already in: skip it
