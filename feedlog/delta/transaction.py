"""One atomic change to a table, committed optimistically (PROTOCOL.md; delta-kernel-rs `transaction/`).

A transaction records *intents* (files to add or remove, a `txn` marker,
property changes) against the snapshot it read. `commit` turns them into the
actions of the next version, with `commitInfo` first and its in-commit
timestamp, and hands them to the committer. On a lost race it reads the winning
commits, fails only on a real conflict (protocol or metadata changed, the same
`txn` appId, files it removes removed again, data appended under an overwrite)
and otherwise rebases onto the winners, recomputing the version and the ICT.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import Conflict, InvalidArgument
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
)
from .committer import CommitConflict, commit_path
from .log import read_commit
from .replay import TableState, check_writable, ict_enabled, next_ict

if TYPE_CHECKING:
    from .table import DeltaTable

ENGINE_INFO = f"feedlog/{__version__}"


@dataclass(frozen=True)
class CommitResult:
    #: the committed version; None when the transaction was skipped (its txn was already committed)
    version: int | None
    in_commit_timestamp: int | None = None
    attempts: int = 0
    skipped: bool = False


class ConcurrentModification(Conflict):
    """A concurrent commit changed what this transaction depended on; re-read and redo the work."""


def _is_true(conf: Mapping[str, str], key: str) -> bool:
    return conf.get(key, "false").lower() == "true"


class Transaction:
    def __init__(self, table: DeltaTable, base: TableState, operation: str) -> None:
        self.table = table
        self.base = base
        self.operation = operation
        self.operation_parameters: dict[str, Any] = {}
        self.adds: list[Add] = []
        self.removes: list[Remove] = []
        #: application transaction markers by appId (PROTOCOL.md "Transaction Identifiers")
        self.txns: dict[str, Txn] = {}
        #: extra top-level commitInfo fields (provenance)
        self.info_extra: dict[str, Any] = {}
        self.config_updates: dict[str, str | None] = {}
        self.protocol_features: list[str] = []
        self.removed_features: list[str] = []
        self.new_protocol: Protocol | None = None
        self.new_metadata: Metadata | None = None
        #: set when the outcome depends on the whole table (overwrite): any concurrent append conflicts
        self.reads_whole_table = False

    # intents

    def add_files(self, adds: Iterable[Add]) -> None:
        self.adds.extend(adds)

    def remove_files(self, adds: Iterable[Add], data_change: bool = True) -> None:
        now = self.table.clock.now_ms()
        self.removes.extend(a.remove(now, data_change) for a in adds)

    def set_txn(self, app_id: str, version: int) -> None:
        if not app_id:
            raise InvalidArgument("txn appId must not be empty")
        self.txns[app_id] = Txn(app_id, version, self.table.clock.now_ms())

    def set_properties(self, updates: Mapping[str, str | None]) -> None:
        self.config_updates.update(updates)

    # commit

    def _protocol(self, base: TableState) -> Protocol:
        p = self.new_protocol or base.protocol
        assert p is not None
        for feature in self.protocol_features:
            p = p.with_writer_feature(feature)
        for feature in self.removed_features:
            p = p.without_writer_feature(feature)
        return p

    def _metadata(self, base: TableState) -> Metadata:
        m = self.new_metadata or base.metadata
        assert m is not None
        return m.with_configuration(self.config_updates) if self.config_updates else m

    def plan(self, base: TableState, now_ms: int) -> tuple[list[Action], int | None]:
        """The actions of version base.version + 1 and their ICT. Pure given its inputs."""
        version = base.version + 1
        protocol, metadata = self._protocol(base), self._metadata(base)
        if _is_true(metadata.configuration, APPEND_ONLY_PROP) and any(r.data_change for r in self.removes):
            raise InvalidArgument("the table is append-only (delta.appendOnly=true): data cannot be removed")
        was_on = ict_enabled(base.protocol, base.metadata)
        ict = None
        if ict_enabled(protocol, metadata):
            ict = next_ict(now_ms, base.ict if was_on else None)
            if not was_on and version > 0:
                # ICT writer requirement 5: the enabling ICT exceeds the previous commit file's time;
                # requirement 4: record where ICTs start.
                prev_file_ms = self.table.storage.stat(commit_path(base.version)).modified_ms
                ict = max(ict, (prev_file_ms or 0) + 1)
                metadata = metadata.with_configuration(
                    {ICT_ENABLEMENT_VERSION: str(version), ICT_ENABLEMENT_TIMESTAMP: str(ict)}
                )
        extra: dict[str, Any] = {"readVersion": self.base.version} if self.base.version >= 0 else {}
        extra.update(
            isBlindAppend=not self.removes and not self.reads_whole_table,
            engineInfo=ENGINE_INFO,
            txnId=self.table.new_id(),
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

    def _check_winner(self, version: int, actions: Sequence[Action]) -> None:
        mine = {r.path for r in self.removes}
        for a in actions:
            if isinstance(a, (Protocol, Metadata)):
                raise ConcurrentModification(
                    f"version {version}, committed concurrently, changed the table's protocol or metadata"
                )
            if isinstance(a, Txn) and a.app_id in self.txns:
                raise ConcurrentModification(
                    f"version {version}, committed concurrently, carries txn appId {a.app_id!r} "
                    f"(its version {a.version}); this batch may be a duplicate: re-read the txn version"
                )
            if isinstance(a, Remove) and a.path in mine:
                raise ConcurrentModification(f"version {version} concurrently removed {a.path}, which this removes")
            if isinstance(a, Add) and a.data_change and self.reads_whole_table:
                raise ConcurrentModification(f"version {version} concurrently added data this overwrite did not see")

    def commit(self) -> CommitResult:
        table = self.table
        if self.base.protocol is not None:  # the table as it is: upgrading its protocol must not hide a feature
            check_writable(self.base.protocol)
        check_writable(self._protocol(self.base))
        base = self.base.copy()
        for attempt in range(1, table.max_commit_attempts + 1):
            actions, ict = self.plan(base, table.clock.now_ms())
            version = base.version + 1
            response = table._commit(base, version, actions)
            if not isinstance(response, CommitConflict):
                base.apply(version, actions)
                table._cache = base  # the next transaction starts from here without re-reading the log
                return CommitResult(response.version, ict, attempt)
            if not response.retryable:
                raise Conflict(f"commit of version {version} refused: {response.reason}")
            caught_up = table._catch_up(base, self._check_winner, write=True)  # reads only the winners
            if caught_up is not None:
                base = caught_up
            else:  # the log changed under us in a way only a full listing untangles
                listing = table._listing(write=True)
                for v in range(version, listing.latest + 1):
                    winner = read_commit(table.storage, listing, v)
                    self._check_winner(v, winner)
                    base.apply(v, winner)
            # Retry at once, with at most a millisecond of jitter: a loser that backs off longer comes
            # back staler and loses again, starving behind writers with fresher state.
            time.sleep(random.uniform(0, 0.001))
        raise Conflict(f"gave up after {table.max_commit_attempts} attempts: the table is too contended")


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
