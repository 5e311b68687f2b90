"""One atomic change to a table, committed optimistically (PROTOCOL.md; delta-kernel-rs `transaction/`).

    tx = Transaction(snapshot, committer, clock, ids)
    tx.add_files(adds)
    result = tx.commit()

A transaction records *intents* (files to add or remove, `txn` markers,
property changes) against the snapshot it read. `plan` turns them into the
actions of the next version, `commitInfo` first with its in-commit timestamp;
it is pure: the time, the previous commit file's time and the commit's id are
its inputs. `commit` hands the encoded actions to the committer. On a lost race
it reads the winning commits (from the log, and from the committer for a
managed table), fails only on a real conflict (`check_winner`: protocol or
metadata changed, the same strict `txn` appId, files it removes removed again,
data appended under an overwrite) and otherwise rebases onto the winners,
recomputing the version and the ICT. That loop is the only retry loop on the
commit path.

Exactly-once writers (the Spark sink) claim a *range* of an application's
versions with `set_txn(app, version, since=...)`: a concurrent commit that
carries the app up to `since` is compatible, one that already carries it to
`version` makes this transaction a duplicate (skipped, nothing committed), and
one in between is a Conflict (`claims_landed`).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from typing import Protocol as TypingProtocol

import pyarrow as pa

from ..clock import Clock
from ..errors import Conflict, FeedlogError, InvalidArgument, NotFound
from ..version import __version__
from .actions import (
    APPEND_ONLY,
    APPEND_ONLY_PROP,
    CHECKPOINT_PROTECTION,
    ENABLE_ICT,
    ICT,
    ICT_ENABLEMENT_TIMESTAMP,
    ICT_ENABLEMENT_VERSION,
    MANAGED_COMMITS,
    OWNER_NAME,
    REQUIRE_CHECKPOINT_PROTECTION,
    Action,
    Add,
    CommitInfo,
    Metadata,
    Protocol,
    Remove,
    Txn,
    encode_commit,
)
from .committer import CommitConflict, Committer, commit_path
from .log import catch_up, list_table, read_commit
from .replay import TableState, check_writable, ict_enabled, next_ict
from .schema import to_schema_string
from .storage import FileInfo, Storage

ENGINE_INFO = f"feedlog/{__version__}"
#: lost races before a transaction gives up. Put-if-absent favours whoever just won (its next
#: transaction starts from the newest state while the losers read the winners): with 8 writer
#: processes on one filesystem table, one lost 100 races in a row within 3 s. delta-spark retries
#: up to 10,000,000 times, delta-rs 15; a commit owner lets losers take turns (managed/turns.py).
DEFAULT_MAX_ATTEMPTS = 1000


@dataclass(frozen=True)
class CommitResult:
    #: the committed version; None when the transaction was skipped (its txn was already committed)
    version: int | None
    in_commit_timestamp: int | None = None
    attempts: int = 0
    skipped: bool = False
    #: the table as of the committed version (delta-kernel's post-commit snapshot); None if skipped
    state: TableState | None = field(default=None, compare=False, repr=False)


class ConcurrentModification(Conflict):
    """A concurrent commit changed what this transaction depended on; re-read and redo the work."""


class Base(TypingProtocol):
    """What a transaction starts from: a `Snapshot`, or `NewTable` for a table's first commit."""

    @property
    def storage(self) -> Storage: ...

    @property
    def state(self) -> TableState: ...


@dataclass(frozen=True)
class NewTable:
    """The base of the commit that creates a table: nothing."""

    storage: Storage
    state: TableState = field(default_factory=TableState)


@dataclass(frozen=True)
class Claim:
    """A transaction stands for versions `since` (exclusive) to `version` of an application's txn."""

    since: int
    version: int


def _is_true(conf: Mapping[str, str], key: str) -> bool:
    return conf.get(key, "false").lower() == "true"


def claims_landed(held: Mapping[str, Txn], claims: Mapping[str, Claim]) -> bool:
    """Whether the table already holds everything `claims` stand for (the transaction is a duplicate).

    False if it holds none of it; Conflict if it holds part of a claimed range, or the whole of
    some claims and none of others (those must be written separately)."""
    landed = []
    for app, c in claims.items():
        done = held.get(app)
        if done is None or done.version <= c.since:
            continue
        if done.version >= c.version:
            landed.append(app)
            continue
        raise Conflict(
            f"the table holds {app} up to version {done.version}, inside this commit's range "
            f"{c.since}..{c.version}: another writer landed part of it; rerun to write the rest"
        )
    if landed and len(landed) < len(claims):
        raise Conflict(
            f"the table already holds {', '.join(_short(a) for a in landed)} up to this commit's end, "
            "but not the others in it; write those separately"
        )
    return bool(landed)


def _short(app: str, limit: int = 40) -> str:
    return app if len(app) <= limit else app[:limit] + "..."


def check_winner(
    version: int,
    actions: Sequence[Action],
    *,
    removes: Collection[str] = (),
    txns: Collection[str] = (),
    reads_whole_table: bool = False,
) -> None:
    """Raise ConcurrentModification if commit `version`, committed concurrently, conflicts with a
    transaction that removes paths `removes`, sets (strict) txn appIds `txns` and, with
    `reads_whole_table` (an overwrite), depends on every row. Blind appends never conflict."""
    for a in actions:
        if isinstance(a, (Protocol, Metadata)):
            raise ConcurrentModification(
                f"version {version}, committed concurrently, changed the table's protocol or metadata"
            )
        if isinstance(a, Txn) and a.app_id in txns:
            raise ConcurrentModification(
                f"version {version}, committed concurrently, carries txn appId {a.app_id!r} "
                f"(its version {a.version}); this batch may be a duplicate: re-read the txn version"
            )
        if isinstance(a, Remove) and a.path in removes:
            raise ConcurrentModification(f"version {version} concurrently removed {a.path}, which this removes")
        if isinstance(a, Add) and a.data_change and reads_whole_table:
            raise ConcurrentModification(f"version {version} concurrently added data this overwrite did not see")


class Transaction:
    def __init__(
        self,
        snapshot: Base,
        committer: Committer,
        clock: Clock,
        ids: Callable[[], str],
        operation: str = "WRITE",
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.storage = snapshot.storage
        #: the state this transaction read; never modified
        self.base = snapshot.state
        self.committer = committer
        self.clock = clock
        self.ids = ids
        self.operation = operation
        self.max_attempts = max_attempts
        self.operation_parameters: dict[str, Any] = {}
        self.adds: list[Add] = []
        self.removes: list[Remove] = []
        #: application transaction markers by appId (PROTOCOL.md "Transaction Identifiers")
        self.txns: dict[str, Txn] = {}
        #: the txns set with `since`: ranges re-validated on every attempt instead of conflicting
        self.claims: dict[str, Claim] = {}
        #: extra top-level commitInfo fields (provenance)
        self.info_extra: dict[str, Any] = {}
        self.config_updates: dict[str, str | None] = {}
        self.protocol_features: list[str] = []
        self.removed_features: list[str] = []
        self.new_protocol: Protocol | None = None
        self.new_metadata: Metadata | None = None
        #: set when the outcome depends on the whole table (overwrite): any concurrent append conflicts
        self.reads_whole_table = False

    @classmethod
    def create_table(
        cls,
        storage: Storage,
        committer: Committer,
        clock: Clock,
        ids: Callable[[], str],
        schema: pa.Schema,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
        name: str | None = None,
        description: str | None = None,
    ) -> Transaction:
        """The transaction of a new table's version 0: its protocol (exactly the writer features the
        properties make active) and metadata. It is not retried: losing the race is a Conflict."""
        missing = [c for c in partition_by if c not in schema.names]
        if missing:
            raise InvalidArgument(f"partition columns not in the schema: {missing}")
        if len(partition_by) == len(schema.names):
            raise InvalidArgument("a table needs at least one column that is not a partition column")
        tx = cls(NewTable(storage), committer, clock, ids, "CREATE TABLE", max_attempts=1)
        props = dict(properties)
        tx.operation_parameters = {"partitionBy": list(partition_by), "properties": props}
        tx.new_protocol = protocol_for_new_table(props)
        tx.new_metadata = Metadata(
            id=ids(),
            schema_string=to_schema_string(schema),
            partition_columns=tuple(partition_by),
            configuration=props,
            created_time=clock.now_ms(),
            name=name,
            description=description,
        )
        return tx

    # intents

    def add_files(self, adds: Iterable[Add]) -> None:
        self.adds.extend(adds)

    def remove_files(self, adds: Iterable[Add], data_change: bool = True) -> None:
        now = self.clock.now_ms()
        self.removes.extend(a.remove(now, data_change) for a in adds)

    def set_txn(self, app_id: str, version: int, *, since: int | None = None) -> None:
        """Record `txn` (appId, version). With `since`, the commit stands for the app's versions after
        `since` up to `version` (see the module docstring): checked against the table on every attempt."""
        if not app_id:
            raise InvalidArgument("txn appId must not be empty")
        if since is not None:
            if since >= version:
                raise InvalidArgument(f"txn {app_id!r}: range {since}..{version} is empty")
            self.claims[app_id] = Claim(since, version)
        self.txns[app_id] = Txn(app_id, version, self.clock.now_ms())

    def set_properties(self, updates: Mapping[str, str | None]) -> None:
        self.config_updates.update(updates)

    # planning (pure)

    def protocol_after(self, base: TableState) -> Protocol:
        p = self.new_protocol or base.protocol
        assert p is not None
        for feature in self.protocol_features:
            p = p.with_writer_feature(feature)
        for feature in self.removed_features:
            p = p.without_writer_feature(feature)
        return p

    def metadata_after(self, base: TableState) -> Metadata:
        m = self.new_metadata or base.metadata
        assert m is not None
        return m.with_configuration(self.config_updates) if self.config_updates else m

    def enables_ict(self, base: TableState) -> bool:
        """Whether this commit turns in-commit timestamps on for an existing table."""
        on = ict_enabled(self.protocol_after(base), self.metadata_after(base))
        return on and base.version >= 0 and not ict_enabled(base.protocol, base.metadata)

    def plan(
        self, base: TableState, now_ms: int, txn_id: str, previous_commit_ms: int | None = None
    ) -> tuple[list[Action], int | None]:
        """The actions of version base.version + 1 and their ICT, from the time `now_ms`, the commit's
        id and, when this commit enables ICTs, the time of the previous commit's file. Pure."""
        version = base.version + 1
        protocol, metadata = self.protocol_after(base), self.metadata_after(base)
        if _is_true(metadata.configuration, APPEND_ONLY_PROP) and any(r.data_change for r in self.removes):
            raise InvalidArgument("the table is append-only (delta.appendOnly=true): data cannot be removed")
        was_on = ict_enabled(base.protocol, base.metadata)
        ict = None
        if ict_enabled(protocol, metadata):
            ict = next_ict(now_ms, base.ict if was_on else None)
            if not was_on and version > 0:
                # ICT writer requirement 5: the enabling ICT exceeds the previous commit file's time;
                # requirement 4: record where ICTs start.
                ict = max(ict, (previous_commit_ms or 0) + 1)
                metadata = metadata.with_configuration(
                    {ICT_ENABLEMENT_VERSION: str(version), ICT_ENABLEMENT_TIMESTAMP: str(ict)}
                )
        extra: dict[str, Any] = {"readVersion": self.base.version} if self.base.version >= 0 else {}
        extra.update(
            isBlindAppend=not self.removes and not self.reads_whole_table,
            engineInfo=ENGINE_INFO,
            txnId=txn_id,
        )
        extra.update(self.info_extra)
        info = CommitInfo(ict, now_ms, self.operation, self.operation_parameters, extra)
        actions: list[Action] = [info]
        if protocol != base.protocol:
            actions.append(protocol)
        if metadata != base.metadata:
            actions.append(metadata)
        actions.extend(self.txns.values())
        actions.extend(self.removes)
        actions.extend(self.adds)
        return actions, ict

    def check_winner(self, version: int, actions: Sequence[Action]) -> None:
        check_winner(
            version,
            actions,
            removes={r.path for r in self.removes},
            txns=self.txns.keys() - self.claims.keys(),
            reads_whole_table=self.reads_whole_table,
        )

    # committing

    def commit(self) -> CommitResult:
        """Commit, rebasing over concurrent commits that do not conflict (at most `max_attempts` tries).

        Unsupported before anything is written if feedlog may not write the table; ConcurrentModification
        (a Conflict) on a real conflict; Conflict if the committer refuses for good or the table stays
        too contended. A result with `skipped` means the claimed txn ranges were already committed."""
        if self.base.protocol is not None:  # the table as it is: upgrading its protocol must not hide a feature
            check_writable(self.base.protocol, metadata=self.base.metadata)
        check_writable(self.protocol_after(self.base), metadata=self.metadata_after(self.base))
        base = self.base
        # a commit owner's conflict answer gave this transaction the table's next turn: the other
        # writers in line wait for it, so a transaction that will not commit after all (a real
        # conflict, its claims landed, an error, giving up) ends the turn rather than let it lapse
        holds_turn = False
        # A commit owner may name a winner still being ratified (`CommitConflict.pending`), so that
        # this transaction rebases on it meanwhile: `base` is then provisional, and `settled` the
        # newest state built on ratified commits alone. Nothing is concluded from a provisional
        # base (claims landed, a conflict) and a refused commit rebases from `settled`.
        settled, provisional = base, False
        try:
            for attempt in range(1, self.max_attempts + 1):
                if self.claims and claims_landed(base.txns, self.claims):
                    if provisional:  # landed in a commit not yet ratified, perhaps never: ask what was
                        self._forget_answer()
                        base = settled = self._rebase(settled)
                        provisional = False
                    if claims_landed(base.txns, self.claims):
                        return CommitResult(None, attempts=attempt, skipped=True)
                previous_ms = None
                if self.enables_ict(base):
                    previous_ms = self.storage.stat(commit_path(base.version)).modified_ms
                actions, ict = self.plan(base, self.clock.now_ms(), self.ids(), previous_ms)
                version = base.version + 1
                response = self.committer.commit(self.storage, version, encode_commit(actions), actions)
                if not isinstance(response, CommitConflict):
                    holds_turn = False  # the owner passed it on with the commit
                    after = base.copy()
                    after.apply(response.version, actions)
                    return CommitResult(response.version, ict, attempt, state=after)
                holds_turn = response.turn
                if not response.retryable:
                    raise Conflict(f"commit of version {version} refused: {response.reason}")
                if version == 0:  # a table's first commit has nothing to rebase onto: someone else created it
                    raise Conflict(f"version 0 was taken: {response.reason}")
                start = settled if provisional else base
                try:
                    base = self._rebase(start)  # raises on a real conflict, even after the last attempt
                    provisional = response.pending is not None
                except (ConcurrentModification, NotFound):
                    if response.pending is None:
                        raise
                    # a conflict with the commit not yet ratified, or its file gone (it was refused,
                    # its writer gave up): decide on ratified commits alone
                    self._forget_answer()
                    base, provisional = self._rebase(start), False
                if not provisional:
                    settled = base
                # Retry at once, with at most a millisecond of jitter: a loser that backs off longer comes
                # back staler and loses again, starving behind writers with fresher state. A commit
                # owner that gave this transaction the next turn holds that version for it: no jitter.
                if not response.turn:
                    time.sleep(random.uniform(0, 0.001))
            raise Conflict(f"gave up after {self.max_attempts} attempts: the table is too contended")
        finally:
            if holds_turn:
                self._end_turn()

    def _forget_answer(self) -> None:
        """Have the next rebase ask what is ratified rather than use the last conflict answer's winners
        (`Router.forget_answer`; other committers keep no answer)."""
        forget = getattr(self.committer, "forget_answer", None)
        if forget is not None:
            forget()

    def _end_turn(self) -> None:
        """Pass the table's turn on (`Router.end_turn`); committers without turns have no `end_turn`.
        Never raises: the turn lapses anyway, and what the commit raised is what the caller must see."""
        end = getattr(self.committer, "end_turn", None)
        if end is not None:
            with contextlib.suppress(FeedlogError):
                end()

    def _rebase(self, base: TableState) -> TableState:
        """`base` plus the commits after it (those that won), each checked for a conflict with this
        transaction."""

        def ratified(_p: Protocol | None, _m: Metadata | None, start: int) -> list[tuple[int, FileInfo]]:
            return self.committer.ratified_commits(self.storage, start)

        caught_up = catch_up(self.storage, base, ratified, self.check_winner)  # reads only the winners
        if caught_up is not None:
            return caught_up
        # the log changed under us in a way only a full listing untangles
        listing = list_table(self.storage, ratified)
        rebased = base.copy()
        for v in range(base.version + 1, listing.latest + 1):
            winner = read_commit(self.storage, listing, v)
            self.check_winner(v, winner)
            rebased.apply(v, winner)
        return rebased


def protocol_for_new_table(properties: Mapping[str, str]) -> Protocol:
    """Reader 1 / writer 7 listing exactly the writer features the properties make active."""
    features = []
    if _is_true(properties, APPEND_ONLY_PROP):
        features.append(APPEND_ONLY)
    if _is_true(properties, ENABLE_ICT):
        features.append(ICT)
    if OWNER_NAME in properties:
        features.append(MANAGED_COMMITS)
    if REQUIRE_CHECKPOINT_PROTECTION in properties:
        features.append(CHECKPOINT_PROTECTION)
    if not features:
        return Protocol(1, 2)
    return Protocol(1, 7, None, tuple(features))
